"""Reading a CloudFormation/SAM template, and expanding SAM into plain CloudFormation, with AWS's
own code: the short tags (`!Ref X`, `!GetAtt A.B`, `!Sub ...`) are read by the SAM translator's
YAML constructor into their long forms, and the translator expands `AWS::Serverless::*`
resources, `Globals` and function `Events` into the resources CloudFormation would create
(`AWS::Lambda::Function`, `AWS::Lambda::EventSourceMapping`, `AWS::Events::Rule`, ...).

What is left for the local runner is ours: parameter values, the intrinsics that remain
(`delayq_local.intrinsics`), and creating the resources (`delayq_local.provision`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import boto3
import yaml
from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from samtranslator.yaml_helper import intrinsics_multi_constructor

from delayq_local.exceptions import TemplateError

SAM_TRANSFORM: Final = "AWS::Serverless-2016-10-31"
# The translator accepts only S3 locations for code: a function's local CodeUri (and a layer's
# ContentUri) is handed to it under this bucket, and comes back as `Code.S3Key`.
LOCAL_CODE_BUCKET: Final = "delayq-local-code"
SERVERLESS_FUNCTION: Final = "AWS::Serverless::Function"
_LOCAL_PATHS: Final = {
    SERVERLESS_FUNCTION: "CodeUri",
    "AWS::Serverless::LayerVersion": "ContentUri",
}


class _Loader(yaml.SafeLoader):  # type: ignore[misc] # PyYAML ships no type hints
    """A SafeLoader with the translator's constructor for the short tags, where dates stay
    strings (CloudFormation reads `AWSTemplateFormatVersion: 2010-09-09` as text)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_multi_constructor("!", intrinsics_multi_constructor)


@dataclass(frozen=True)
class Template:
    """A parsed template: the document as long-form dicts, and where it came from.

    `event_names`: after `expand()`, the SAM event name of each resource the translator made
    from a function's `Events` (it names them `<function><event>`).
    """

    body: Mapping[str, Any]
    path: Path | None = None
    event_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def resources(self) -> Mapping[str, Mapping[str, Any]]:
        """`Resources`, by logical id."""
        resources: Mapping[str, Mapping[str, Any]] = self.body.get("Resources") or {}
        return resources

    @property
    def parameters(self) -> Mapping[str, Mapping[str, Any]]:
        """`Parameters`, by name."""
        parameters: Mapping[str, Mapping[str, Any]] = self.body.get("Parameters") or {}
        return parameters

    @property
    def uses_sam(self) -> bool:
        """Whether the template declares the SAM transform."""
        transform = self.body.get("Transform") or []
        return SAM_TRANSFORM in ([transform] if isinstance(transform, str) else transform)

    def parameter_values(self, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Each parameter's value: the override, else its `Default`; lists split on commas."""
        return {
            name: _typed(spec, raw) for name, (spec, raw) in self._raw_values(overrides).items()
        }

    def _raw_values(self, overrides: Mapping[str, str] | None) -> dict[str, tuple[Any, str]]:
        """Each parameter's declaration and value as text, checked against `AllowedValues`."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.parameters))
        if unknown:
            raise TemplateError(f"unknown template parameters: {', '.join(unknown)}")
        values: dict[str, tuple[Any, str]] = {}
        for name, spec in self.parameters.items():
            if name in overrides:
                raw: Any = overrides[name]
            elif "Default" in spec:
                raw = spec["Default"]
            else:
                raise TemplateError(f"parameter {name} has no Default; pass a value")
            allowed = spec.get("AllowedValues")
            if allowed is not None and str(raw) not in {str(a) for a in allowed}:
                raise TemplateError(f"parameter {name}={raw!r} is not one of {allowed}")
            values[name] = (spec, str(raw))
        return values

    def expand(self, overrides: Mapping[str, str] | None = None, region: str = "") -> Template:
        """The template as plain CloudFormation: the SAM translator's output for these
        parameter values, in `region` (itself when it does not use SAM)."""
        if not self.uses_sam:
            return self
        sam = copy.deepcopy(dict(self.body))  # the translator changes its input
        event_names: dict[str, str] = {}
        for logical_id, resource in (sam.get("Resources") or {}).items():
            properties = resource.get("Properties") or {}
            _hand_over_local_path(str(resource.get("Type")), properties)
            if resource.get("Type") == SERVERLESS_FUNCTION:
                events = properties.get("Events") or {}
                event_names.update({f"{logical_id}{event}": event for event in events})
        _hand_over_local_path(SERVERLESS_FUNCTION, (sam.get("Globals") or {}).get("Function") or {})
        session = boto3.session.Session(region_name=region)
        translator = Translator(None, Parser(), boto_session=session)
        raw = {name: value for name, (_, value) in self._raw_values(overrides).items()}
        try:
            body = translator.translate(sam, raw, get_managed_policy_map=_no_managed_policies)
        except InvalidDocumentException as e:
            causes = "; ".join(cause.message for cause in e.causes)
            raise TemplateError(f"{self.path or 'template'}: {e.message} {causes}") from e
        return replace(self, body=body, event_names=event_names)


def _hand_over_local_path(resource_type: str, properties: dict[str, Any]) -> None:
    """Point a function's local CodeUri (a layer's ContentUri) at `LOCAL_CODE_BUCKET`."""
    key = _LOCAL_PATHS.get(resource_type)
    value = properties.get(key) if key else None
    if key and isinstance(value, str) and not value.startswith("s3://"):
        properties[key] = f"s3://{LOCAL_CODE_BUCKET}/{value}"


def _no_managed_policies() -> dict[str, str]:
    raise TemplateError("managed policy names need IAM to resolve: use policy ARNs")


def _typed(spec: Mapping[str, Any], raw: str) -> Any:
    kind = str(spec.get("Type", "String"))
    if kind == "CommaDelimitedList" or kind.startswith("List<"):
        return [part.strip() for part in raw.split(",")] if raw else []
    return raw


def load_template(path: Path) -> Template:
    """Read a YAML or JSON template file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TemplateError(f"cannot read {path}: {e}") from e
    return loads_template(text, path)


def loads_template(text: str, path: Path | None = None) -> Template:
    """Parse template text (YAML with CloudFormation short tags, or JSON)."""
    try:
        body = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise TemplateError(f"{path or 'template'}: {e}") from e
    if not isinstance(body, dict) or not isinstance(body.get("Resources"), dict):
        raise TemplateError(f"{path or 'template'}: no Resources mapping")
    return Template(body=body, path=path)
