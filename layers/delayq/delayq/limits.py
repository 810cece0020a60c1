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

**Binding tenants to what Kafka authenticates.** ``delay-tenant`` and ``delay-priority`` are
headers the producer writes. A tenant given ``"topics": [...]`` (the delay topics its
producers may write: Kafka's topic ACLs authenticate who writes which topic) is only that
tenant on a record from one of them, and ``"priorities": [...]`` lists the classes it may use
(a record asking for another is rejected, ``bad-priority``). Once any tenant names its topics,
every ``delay-tenant`` that is not a named tenant of the record's topic (an unknown name, a
name from another topic) is counted as :data:`UNKNOWN_TENANT`, one shared bucket under the
``"*"`` limits: rotating names escapes no cap, and no producer spends another's quota.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from delayq.constants import PRIORITIES
from delayq.exceptions import ConfigurationError

__all__ = [
    "ANY_TENANT",
    "OVER_QUOTA_ACTIONS",
    "UNKNOWN_TENANT",
    "UNLIMITED",
    "Limits",
    "TenantLimits",
    "parse_limits",
]

ANY_TENANT: Final = "*"
# Every delay-tenant not bound to the record's topic (once topics are bound); no header can
# name it (``delay-tenant`` refuses ``*``, ``#`` and ``/``, the characters of internal keys).
UNKNOWN_TENANT: Final = "*unknown"
OVER_QUOTA_ACTIONS: Final = ("reject", "defer")
_FIELDS: Final = frozenset(
    {"release_per_second", "ingest_per_second", "over_quota", "topics", "priorities"}
)


@dataclass(frozen=True)
class Limits:
    """One tenant's limits (None: unlimited)."""

    release_per_second: int | None = None
    ingest_per_second: int | None = None
    over_quota: str = "reject"
    # The delay topics this tenant's records may come from (None: any, unbound) and the
    # priorities it may use (None: any).
    topics: frozenset[str] | None = None
    priorities: frozenset[str] | None = None

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

    @property
    def bound(self) -> bool:
        """Whether tenants are bound to delay topics (some tenant names its ``topics``)."""
        return any(limits.topics is not None for _, limits in self.named)

    def tenant_of(self, declared: str, topic: str) -> str:
        """The tenant a record of delay topic ``topic`` counts as, given its ``delay-tenant``
        (empty: none, its target topic is its tenant): itself when it is named for
        ``topic`` (or nothing is bound), else :data:`UNKNOWN_TENANT`."""
        if not declared or not self.bound:
            return declared
        for name, limits in self.named:
            if name == declared:
                return (
                    declared
                    if limits.topics is None or topic in limits.topics
                    else (UNKNOWN_TENANT)
                )
        return UNKNOWN_TENANT

    def allows_priority(self, tenant: str, priority: str) -> bool:
        """Whether ``tenant`` may use ``priority`` (unlisted: any)."""
        allowed = self.of(tenant).priorities
        return allowed is None or priority in allowed


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
        _names(where, spec, "topics", None),
        _names(where, spec, "priorities", PRIORITIES),
    )


def _names(
    where: str, spec: Mapping[str, Any], name: str, allowed: tuple[str, ...] | None
) -> frozenset[str] | None:
    value = spec.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(f"{where}: {name} must be a non-empty list of names")
    if allowed is not None and not set(value) <= set(allowed):
        raise ConfigurationError(f"{where}: {name} must be among {', '.join(allowed)}")
    return frozenset(value)


def _rate(where: str, spec: Mapping[str, Any], name: str) -> int | None:
    value = spec.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{where}: {name} must be a whole number >= 1")
    return value
