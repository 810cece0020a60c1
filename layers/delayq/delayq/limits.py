"""Per-tenant limits: a release-rate cap (messages produced per second at due time) and an
ingest quota (messages accepted per second), from one JSON setting.

``DELAYQ_TENANT_LIMITS`` maps a tenant (the ``delay-tenant`` header, else the target topic) to
its limits; ``"*"`` applies to every tenant not named::

    {"bulk-mailer": {"release_per_second": 500, "ingest_per_second": 2000, "over_quota": "defer"},
     "*": {"release_per_second": 20000}}

A limit left out is no limit. Over its ingest quota, a tenant's messages are rejected with
reason ``quota-exceeded`` (``"over_quota": "reject"``, the default) or accepted and released at
the quota's rate from their due time on (``"defer"``). Parsed once, at cold start; a setting
that does not parse stops the cold start with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from delayq.exceptions import ConfigurationError

__all__ = [
    "ANY_TENANT",
    "OVER_QUOTA_ACTIONS",
    "UNLIMITED",
    "Limits",
    "TenantLimits",
    "parse_limits",
]

ANY_TENANT: Final = "*"
OVER_QUOTA_ACTIONS: Final = ("reject", "defer")
_FIELDS: Final = frozenset({"release_per_second", "ingest_per_second", "over_quota"})


@dataclass(frozen=True)
class Limits:
    """One tenant's limits (None: unlimited)."""

    release_per_second: int | None = None
    ingest_per_second: int | None = None
    over_quota: str = "reject"

    @property
    def defers(self) -> bool:
        """Whether messages over the ingest quota are deferred rather than rejected."""
        return self.over_quota == "defer"


UNLIMITED: Final = Limits()


@dataclass(frozen=True)
class TenantLimits:
    """Every tenant's limits: the named ones, and the default for the others."""

    named: tuple[tuple[str, Limits], ...] = ()
    default: Limits = UNLIMITED

    def of(self, tenant: str) -> Limits:
        """The limits of ``tenant``."""
        for name, limits in self.named:
            if name == tenant:
                return limits
        return self.default

    @property
    def any(self) -> bool:
        """Whether any tenant has a limit (else nothing needs counting)."""
        return self.default != UNLIMITED or any(limits != UNLIMITED for _, limits in self.named)


def parse_limits(text: str) -> TenantLimits:
    """Parse ``DELAYQ_TENANT_LIMITS`` (empty: no limits); raises :class:`ConfigurationError`
    naming what is wrong."""
    if not text.strip():
        return TenantLimits()
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ConfigurationError(f"tenant limits are not JSON: {e}") from e
    if not isinstance(raw, Mapping):
        raise ConfigurationError("tenant limits must be a JSON object of tenant -> limits")
    named: list[tuple[str, Limits]] = []
    default = UNLIMITED
    for tenant, spec in raw.items():
        limits = _limits(tenant, spec)
        if tenant == ANY_TENANT:
            default = limits
        else:
            named.append((tenant, limits))
    return TenantLimits(tuple(sorted(named)), default)


def _limits(tenant: str, spec: Any) -> Limits:
    where = f"tenant limits of {tenant!r}"
    if not tenant or not isinstance(spec, Mapping):
        raise ConfigurationError(f"{where}: expected an object of limits")
    unknown = set(spec) - _FIELDS
    if unknown:
        raise ConfigurationError(f"{where}: unknown field(s) {sorted(unknown)}")
    over_quota = spec.get("over_quota", "reject")
    if over_quota not in OVER_QUOTA_ACTIONS:
        raise ConfigurationError(f"{where}: over_quota must be one of {OVER_QUOTA_ACTIONS}")
    return Limits(
        _rate(where, spec, "release_per_second"),
        _rate(where, spec, "ingest_per_second"),
        over_quota,
    )


def _rate(where: str, spec: Mapping[str, Any], name: str) -> int | None:
    value = spec.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{where}: {name} must be a whole number >= 1")
    return value
