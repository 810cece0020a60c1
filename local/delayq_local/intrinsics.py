"""The intrinsic functions a CloudFormation template still holds after the SAM transform,
evaluated against parameter values, pseudo parameters, conditions and the resources the local
runner created (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If` and the condition functions, ...).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from delayq_local.exceptions import TemplateError
from delayq_local.template import Template


class ResourceLookup(Protocol):
    """What `Ref` and `Fn::GetAtt` of a resource evaluate to."""

    def ref(self, logical_id: str) -> Any:
        """`{"Ref": logical_id}` of a resource."""
        ...

    def get_att(self, logical_id: str, attribute: str) -> Any:
        """`{"Fn::GetAtt": [logical_id, attribute]}`."""
        ...


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE: Final = _NoValue()
_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


@dataclass
class Resolver:
    """Evaluates intrinsic functions. Conditions are evaluated on first use and cached."""

    template: Template
    parameters: Mapping[str, Any]
    pseudo: Mapping[str, Any]
    resources: ResourceLookup
    _conditions: dict[str, bool] = field(default_factory=dict, init=False)

    def resolve(self, value: Any) -> Any:
        """`value` with every intrinsic evaluated; `AWS::NoValue` entries removed."""
        if isinstance(value, dict):
            if len(value) == 1:
                ((key, arg),) = value.items()
                handler = _INTRINSICS.get(key)
                if handler is not None:
                    return handler(self, arg)
                if key.startswith("Fn::"):
                    raise TemplateError(f"{key} is not supported by the local runner")
            resolved = {k: self.resolve(v) for k, v in value.items()}
            return {k: v for k, v in resolved.items() if v is not NO_VALUE}
        if isinstance(value, list):
            items = [self.resolve(v) for v in value]
            return [v for v in items if v is not NO_VALUE]
        return value

    def condition(self, name: str) -> bool:
        """The value of a named entry of `Conditions`."""
        if name not in self._conditions:
            conditions = self.template.body.get("Conditions") or {}
            if name not in conditions:
                raise TemplateError(f"unknown condition {name}")
            self._conditions[name] = bool(self.resolve(conditions[name]))
        return self._conditions[name]

    def included(self, resource: Mapping[str, Any]) -> bool:
        """False when the resource's `Condition` is false (the resource does not exist)."""
        name = resource.get("Condition")
        return name is None or self.condition(str(name))

    def _ref(self, name: Any) -> Any:
        if not isinstance(name, str):
            raise TemplateError(f"Ref takes a name, not {name!r}")
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self.template.resources:
            return self.resources.ref(name)
        raise TemplateError(f"Ref to unknown name {name}")

    def _get_att(self, arg: Any) -> Any:
        if not (isinstance(arg, list) and len(arg) == 2):
            raise TemplateError(f"Fn::GetAtt takes [resource, attribute], not {arg!r}")
        logical_id, attribute = arg[0], self.resolve(arg[1])
        if logical_id not in self.template.resources:
            raise TemplateError(f"Fn::GetAtt of unknown resource {logical_id}")
        return self.resources.get_att(str(logical_id), str(attribute))

    def _sub(self, arg: Any) -> str:
        if isinstance(arg, str):
            text, variables = arg, {}
        elif isinstance(arg, list) and len(arg) == 2 and isinstance(arg[1], dict):
            text, variables = arg[0], arg[1]
        else:
            raise TemplateError(f"Fn::Sub takes a string or [string, variables], not {arg!r}")

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1).strip()
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                value = self.resolve(variables[name])
            elif "." in name and name.split(".", 1)[0] in self.template.resources:
                value = self._get_att(name.split(".", 1))
            else:
                value = self._ref(name)
            return ",".join(map(str, value)) if isinstance(value, list) else str(value)

        return _SUB_VARIABLE.sub(substitute, str(text))

    def _join(self, arg: Any) -> str:
        delimiter, items = _pair(arg, "Fn::Join")
        return str(delimiter).join(str(v) for v in self.resolve(items))

    def _select(self, arg: Any) -> Any:
        index, items = _pair(arg, "Fn::Select")
        return self.resolve(items)[int(self.resolve(index))]

    def _split(self, arg: Any) -> list[str]:
        delimiter, text = _pair(arg, "Fn::Split")
        return str(self.resolve(text)).split(str(delimiter))

    def _if(self, arg: Any) -> Any:
        if not (isinstance(arg, list) and len(arg) == 3):
            raise TemplateError(f"Fn::If takes [condition, then, else], not {arg!r}")
        return self.resolve(arg[1] if self.condition(str(arg[0])) else arg[2])

    def _equals(self, arg: Any) -> bool:
        left, right = _pair(arg, "Fn::Equals")
        return str(self.resolve(left)) == str(self.resolve(right))

    def _not(self, arg: Any) -> bool:
        return not self._truth(arg, "Fn::Not")[0]

    def _and(self, arg: Any) -> bool:
        return all(self._truth(arg, "Fn::And"))

    def _or(self, arg: Any) -> bool:
        return any(self._truth(arg, "Fn::Or"))

    def _truth(self, arg: Any, name: str) -> list[bool]:
        if not isinstance(arg, list) or not arg:
            raise TemplateError(f"{name} takes a list of conditions, not {arg!r}")
        return [bool(self.resolve(v)) for v in arg]

    def _condition_ref(self, arg: Any) -> bool:
        return self.condition(str(arg))

    def _find_in_map(self, arg: Any) -> Any:
        if not (isinstance(arg, list) and len(arg) == 3):
            raise TemplateError(f"Fn::FindInMap takes [map, key, key], not {arg!r}")
        name, top, second = (str(self.resolve(v)) for v in arg)
        try:
            return self.template.body["Mappings"][name][top][second]
        except (KeyError, TypeError) as e:
            raise TemplateError(f"Fn::FindInMap: no {name}/{top}/{second}") from e

    def _base64(self, arg: Any) -> str:
        return base64.b64encode(str(self.resolve(arg)).encode()).decode()

    def _to_json_string(self, arg: Any) -> str:
        return json.dumps(self.resolve(arg), separators=(",", ":"))

    def _get_azs(self, arg: Any) -> list[str]:
        region = str(self.resolve(arg) or self.pseudo["AWS::Region"])
        return [f"{region}{zone}" for zone in "abc"]


def _pair(arg: Any, name: str) -> tuple[Any, Any]:
    if not (isinstance(arg, list) and len(arg) == 2):
        raise TemplateError(f"{name} takes two arguments, not {arg!r}")
    return arg[0], arg[1]


_INTRINSICS: Final[Mapping[str, Callable[[Resolver, Any], Any]]] = {
    "Ref": Resolver._ref,
    "Condition": Resolver._condition_ref,
    "Fn::GetAtt": Resolver._get_att,
    "Fn::Sub": Resolver._sub,
    "Fn::Join": Resolver._join,
    "Fn::Select": Resolver._select,
    "Fn::Split": Resolver._split,
    "Fn::If": Resolver._if,
    "Fn::Equals": Resolver._equals,
    "Fn::Not": Resolver._not,
    "Fn::And": Resolver._and,
    "Fn::Or": Resolver._or,
    "Fn::FindInMap": Resolver._find_in_map,
    "Fn::Base64": Resolver._base64,
    "Fn::ToJsonString": Resolver._to_json_string,
    "Fn::GetAZs": Resolver._get_azs,
}
