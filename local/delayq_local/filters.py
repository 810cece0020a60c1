"""Lambda event filtering (`FilterCriteria`): the event-pattern subset Lambda documents.

A pattern is compiled once, at construction, into matcher closures. Supported: exact values
(strings, numbers, booleans, null), `prefix`, `suffix`, `equals-ignore-case`, `anything-but`,
`numeric`, `exists`, `wildcard`, nested objects, and array fields (a match on any element).
Several filters in one `FilterCriteria` are OR-ed, as Lambda does.
"""

from __future__ import annotations

import base64
import binascii
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from delayq_local.exceptions import TemplateError

ValueMatcher = Callable[[Any], bool]
ObjectMatcher = Callable[[Any], bool]

_NUMERIC_OPS: Final[Mapping[str, Callable[[float, float], bool]]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class EventFilter:
    """The compiled `FilterCriteria` of one event source."""

    patterns: tuple[Mapping[str, Any], ...]
    _matchers: tuple[ObjectMatcher, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_matchers", tuple(_compile_object(p) for p in self.patterns))

    @classmethod
    def from_criteria(cls, criteria: Mapping[str, Any] | None) -> EventFilter | None:
        """Parse `{"Filters": [{"Pattern": "<json>"}, ...]}`; None when there are no filters."""
        if not criteria:
            return None
        patterns = []
        for entry in criteria.get("Filters") or []:
            raw = entry.get("Pattern")
            try:
                pattern = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError as e:
                raise TemplateError(f"filter pattern is not JSON: {raw!r}") from e
            if not isinstance(pattern, dict):
                raise TemplateError(f"filter pattern must be a JSON object: {raw!r}")
            patterns.append(pattern)
        return cls(tuple(patterns)) if patterns else None

    def matches(self, data: Mapping[str, Any]) -> bool:
        """True when any pattern matches."""
        return any(m(data) for m in self._matchers)


def sqs_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """What Lambda matches for an SQS record: the body as JSON when it parses, else the text."""
    return {**record, "body": _json_or_text(str(record.get("body", "")))}


def kafka_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """What Lambda matches for a Kafka record: the decoded value as JSON when it parses."""
    value = record.get("value")
    if not isinstance(value, str):
        return dict(record)
    try:
        text = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return dict(record)
    return {**record, "value": _json_or_text(text)}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _compile_object(pattern: Mapping[str, Any]) -> ObjectMatcher:
    fields: list[tuple[str, Callable[[bool, Any], bool]]] = []
    for key, sub in pattern.items():
        if isinstance(sub, Mapping):
            fields.append((key, _nested(_compile_object(sub))))
        elif isinstance(sub, list):
            fields.append((key, _compile_leaf(sub)))
        else:
            raise TemplateError(f"filter pattern field {key!r} must be an object or an array")

    def match(data: Any) -> bool:
        if not isinstance(data, Mapping):
            return False
        return all(check(key in data, data.get(key)) for key, check in fields)

    return match


def _nested(match: ObjectMatcher) -> Callable[[bool, Any], bool]:
    return lambda present, value: present and match(value)


def _compile_leaf(matchers: Sequence[Any]) -> Callable[[bool, Any], bool]:
    exists: list[bool] = []
    values: list[ValueMatcher] = []
    for m in matchers:
        if isinstance(m, Mapping) and set(m) == {"exists"}:
            exists.append(bool(m["exists"]))
        else:
            values.append(_compile_value(m))

    def match(present: bool, value: Any) -> bool:
        if any(wanted == present for wanted in exists):
            return True
        if not present:
            return False
        candidates = value if isinstance(value, list) else [value]
        return any(v(c) for v in values for c in candidates)

    return match


def _compile_value(m: Any) -> ValueMatcher:
    if m is None:
        return lambda v: v is None
    if isinstance(m, bool):
        return lambda v: isinstance(v, bool) and v == m
    if isinstance(m, int | float):
        return lambda v: _number(v) == float(m)
    if isinstance(m, str):
        return lambda v: v == m
    if isinstance(m, Mapping) and len(m) == 1:
        ((op, arg),) = m.items()
        compiler = _OPERATORS.get(op)
        if compiler is not None:
            return compiler(arg)
    raise TemplateError(f"unsupported filter matcher {m!r}")


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _text_matcher(arg: Any, test: Callable[[str, str], bool]) -> ValueMatcher:
    if isinstance(arg, Mapping) and set(arg) == {"equals-ignore-case"}:
        wanted = str(arg["equals-ignore-case"]).casefold()
        return lambda v: isinstance(v, str) and test(v.casefold(), wanted)
    if not isinstance(arg, str):
        raise TemplateError(f"filter matcher needs a string, not {arg!r}")
    return lambda v: isinstance(v, str) and test(v, arg)


def _prefix(arg: Any) -> ValueMatcher:
    return _text_matcher(arg, str.startswith)


def _suffix(arg: Any) -> ValueMatcher:
    return _text_matcher(arg, str.endswith)


def _equals_ignore_case(arg: Any) -> ValueMatcher:
    return _text_matcher({"equals-ignore-case": arg}, str.__eq__)


def _anything_but(arg: Any) -> ValueMatcher:
    if isinstance(arg, Mapping):
        inner = _compile_value(arg)
    elif isinstance(arg, list):
        options = [_compile_value(a) for a in arg]

        def inner(v: Any) -> bool:
            return any(o(v) for o in options)
    else:
        inner = _compile_value(arg)
    return lambda v: not inner(v)


def _numeric(arg: Any) -> ValueMatcher:
    if not isinstance(arg, list) or not arg or len(arg) % 2:
        raise TemplateError(f"numeric matcher takes [op, number, ...], not {arg!r}")
    checks = []
    for op, bound in zip(arg[::2], arg[1::2], strict=True):
        if op not in _NUMERIC_OPS or _number(bound) is None:
            raise TemplateError(f"bad numeric comparison {op!r} {bound!r}")
        checks.append((_NUMERIC_OPS[op], float(bound)))

    def match(v: Any) -> bool:
        n = _number(v)
        return n is not None and all(cmp(n, bound) for cmp, bound in checks)

    return match


def _wildcard(arg: Any) -> ValueMatcher:
    if not isinstance(arg, str):
        raise TemplateError(f"wildcard matcher needs a string, not {arg!r}")
    regex = re.compile(".*".join(re.escape(part) for part in arg.split("*")), re.DOTALL)
    return lambda v: isinstance(v, str) and regex.fullmatch(v) is not None


_OPERATORS: Final[Mapping[str, Callable[[Any], ValueMatcher]]] = {
    "prefix": _prefix,
    "suffix": _suffix,
    "equals-ignore-case": _equals_ignore_case,
    "anything-but": _anything_but,
    "numeric": _numeric,
    "wildcard": _wildcard,
}
