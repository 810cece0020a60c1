"""Typed job options: built from a dict (`from_options`) or from Glue-style argv (`from_argv`).

Glue passes job arguments as ``--name value`` pairs in ``sys.argv``; `getResolvedOptions` returns
the requested names and fails on a missing one, so optional names are only requested when present.
The entry points pass `awsglue.utils.getResolvedOptions`; everything else uses `resolve_options`,
which behaves the same way without awsglue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Final, Self

from delayq_reports.exceptions import OptionsError

Resolver = Callable[[list[str], list[str]], Mapping[str, str]]
# The template's LatenessP99AlarmMs default (a template test keeps the two equal).
DEFAULT_LATENESS_P99_ALARM_MS: Final = 1000
OptionValue = str | int | None


def resolve_options(argv: Sequence[str], names: Sequence[str]) -> dict[str, str]:
    """The values of ``--name value`` / ``--name=value`` arguments for `names` (argv[0] skipped).

    Other arguments are ignored, including Glue's own (``--JOB_NAME``, ``--enable-metrics``...);
    an argument directly followed by another ``--`` argument has no value.
    """
    wanted = set(names)
    found: dict[str, str] = {}
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            continue
        key, equals, value = arg[2:].partition("=")
        has_value = bool(equals)
        if not has_value and i < len(args) and not args[i].startswith("--"):
            value, has_value = args[i], True
            i += 1
        if key not in wanted:
            continue
        if not has_value:
            raise OptionsError(f"--{key} needs a value")
        found[key] = value
    missing = [name for name in names if name not in found]
    if missing:
        raise OptionsError(f"missing job arguments: {', '.join('--' + m for m in missing)}")
    return found


@dataclass(frozen=True)
class JobOptions:
    """Options every report job takes.

    `now_ms` is the reference time (epoch ms) of the report; unset, the jobs use the export's
    own time from its manifest, else the current time. `days` is how far back (delivery) or
    ahead (backlog) the report looks.
    """

    export_path: str
    output_path: str
    now_ms: int | None = None
    days: int = 7

    def __post_init__(self) -> None:
        problems = [
            f"{name} must not be empty"
            for name in ("export_path", "output_path")
            if not getattr(self, name)
        ]
        if self.now_ms is not None and self.now_ms < 0:
            problems.append("now_ms must be >= 0")
        if self.days < 1:
            problems.append("days must be >= 1")
        problems.extend(self._problems())
        if problems:
            raise OptionsError("; ".join(problems))

    def _problems(self) -> list[str]:
        """Checks of a subclass's own options."""
        return []

    @classmethod
    def from_options(cls, options: Mapping[str, OptionValue]) -> Self:
        """Build from a mapping of option names to values (strings are parsed); unknown keys,
        such as Glue's own arguments, are ignored; empty strings count as unset."""
        values: dict[str, OptionValue] = {}
        for f in fields(cls):
            raw = options.get(f.name)
            if raw is None or raw == "":
                if f.default is MISSING:
                    raise OptionsError(f"missing option: {f.name}")
                continue
            values[f.name] = _parse(f.name, raw, str(f.type))
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def from_argv(cls, argv: Sequence[str], resolve: Resolver | None = None) -> Self:
        """Build from ``sys.argv``; `resolve` is Glue's `getResolvedOptions` inside Glue."""
        names = [f.name for f in fields(cls) if f.default is MISSING or _present(argv, f.name)]
        resolved = (resolve or resolve_options)(list(argv), names)
        return cls.from_options(resolved)


@dataclass(frozen=True)
class DeliveryReportOptions(JobOptions):
    """The delivery report covers the delivery statistics of the `days` before now.

    `lateness_p99_alarm_ms` is the stack's p99 lateness alarm threshold (the template's
    ``LatenessP99AlarmMs``, passed by the Glue job's default arguments); the lateness histogram
    marks it.
    """

    lateness_p99_alarm_ms: int = DEFAULT_LATENESS_P99_ALARM_MS

    def _problems(self) -> list[str]:
        return [] if self.lateness_p99_alarm_ms >= 1 else ["lateness_p99_alarm_ms must be >= 1"]


@dataclass(frozen=True)
class BacklogForecastOptions(JobOptions):
    """The backlog forecast looks `days` ahead and lists the `top_cohorts` largest due-seconds."""

    top_cohorts: int = 20

    def _problems(self) -> list[str]:
        return [] if self.top_cohorts >= 1 else ["top_cohorts must be >= 1"]


def _present(argv: Sequence[str], name: str) -> bool:
    flag = f"--{name}"
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv[1:])


def _parse(name: str, raw: str | int, annotation: str) -> OptionValue:
    if annotation == "str":
        return str(raw)
    if isinstance(raw, int):
        return raw
    try:
        return int(raw.strip())
    except ValueError as e:
        raise OptionsError(f"{name}={raw!r} is not an integer") from e
