"""Settings: parsed once, at cold start, into a frozen dataclass. Explicit arguments win."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any, Final

from delayq import constants as c
from delayq.exceptions import ConfigurationError
from delayq.limits import TenantLimits, parse_limits

__all__ = [
    "KAFKA_SECURITY_MODES",
    "LAMBDA_TASK_ROOT_ENV",
    "TRACE_DISABLED_ENV",
    "Settings",
    "topic_allowed",
    "tracing_enabled",
]

KAFKA_SECURITY_MODES = frozenset(
    {"PLAINTEXT", "SSL", "SASL_SCRAM_SHA_512", "SASL_SCRAM_SHA_256", "MSK_IAM"}
)


_NO_LIMITS: Final = TenantLimits()


@dataclass(frozen=True)
class Settings:
    """Everything a handler needs to know, validated as a whole."""

    table_name: str = ""
    delay_queue_url: str = ""
    tick_queue_url: str = ""
    reject_queue_url: str = ""
    payload_bucket: str = ""
    allowed_targets: tuple[str, ...] = ()
    horizon_seconds: int = c.DEFAULT_HORIZON_SECONDS
    lookahead_seconds: int = c.DEFAULT_LOOKAHEAD_SECONDS
    tick_seconds: int = c.DEFAULT_TICK_SECONDS
    shards: int = c.DEFAULT_SHARDS
    max_delay_seconds: int = c.DEFAULT_MAX_DELAY_SECONDS
    max_payload_bytes: int = c.DEFAULT_MAX_PAYLOAD_BYTES
    offload_threshold_bytes: int = c.DEFAULT_OFFLOAD_THRESHOLD_BYTES
    ttl_grace_seconds: int = c.DEFAULT_TTL_GRACE_SECONDS
    ttl_clock_margin_seconds: int = c.DEFAULT_TTL_CLOCK_MARGIN_SECONDS
    emit_lead_ms: int = c.DEFAULT_EMIT_LEAD_MS
    max_hold_ms: int = c.DEFAULT_MAX_HOLD_MS
    kafka_bootstrap: str = ""
    kafka_security: str = "PLAINTEXT"
    kafka_secret_arn: str = ""
    kafka_ca_location: str = ""
    kafka_timeout_seconds: float = c.DEFAULT_KAFKA_TIMEOUT_SECONDS
    aws_connect_timeout_seconds: float = c.DEFAULT_AWS_CONNECT_TIMEOUT_SECONDS
    aws_read_timeout_seconds: float = c.DEFAULT_AWS_READ_TIMEOUT_SECONDS
    ingest_timeout_seconds: int = c.DEFAULT_INGEST_TIMEOUT_SECONDS
    delay_dlq_url: str = ""
    delivery_max_attempts: int = c.DEFAULT_DELIVERY_MAX_ATTEMPTS
    target_outage_max_seconds: int = c.DEFAULT_TARGET_OUTAGE_MAX_SECONDS
    direct_window_ms: int = c.DEFAULT_DIRECT_WINDOW_MS
    delivery_log_rate: float = c.DEFAULT_DELIVERY_LOG_RATE
    # 1: ingest keeps the pending counts per release minute and target (delayq.pending); 0: not.
    pending_counts: int = 1
    # JSON, see delayq.limits (empty: no tenant has a limit).
    tenant_limits: str = ""
    # 1: a capped tenant's message that missed its release second (the pipeline catching up)
    # takes a new one from the same per-second counters, at the emitter (delayq.shaping); 0:
    # it goes out as soon as it can, so a catch-up may exceed the cap.
    strict_caps: int = 1
    # 1: ingest keeps a locator for every message it stores or queues (operators and
    # reschedules find them by id alone); 0: only for messages a release cap stores away from
    # their due second.
    id_index: int = 0
    # The delay queues of the other priorities (empty: those messages use the normal one).
    delay_queue_high_url: str = ""
    delay_queue_low_url: str = ""
    stats_flush_messages: int = c.DEFAULT_STATS_FLUSH_MESSAGES
    scheduler_page_items: int = c.DEFAULT_SCHEDULER_PAGE_ITEMS
    bundle_max_bytes: int = c.DEFAULT_BUNDLE_MAX_BYTES
    bundle_max_messages: int = c.DEFAULT_BUNDLE_MAX_MESSAGES
    region: str = "us-east-1"
    _patterns: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    _limits: TenantLimits = field(default=TenantLimits(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = [
            *self._timing_problems(),
            *self._batching_problems(),
            *self._limit_problems(),
            *_allow_list_problems(self.allowed_targets),
            *self._kafka_problems(),
        ]
        try:
            object.__setattr__(self, "_limits", parse_limits(self.tenant_limits))
        except ConfigurationError as e:
            problems.append(str(e))
        if problems:
            raise ConfigurationError("; ".join(problems))
        object.__setattr__(self, "_patterns", tuple(p for p in self.allowed_targets if p))

    @property
    def limits(self) -> TenantLimits:
        """Every tenant's limits, parsed from ``tenant_limits``."""
        return self._limits

    @property
    def held_caps(self) -> TenantLimits:
        """The limits whose release caps hold while the pipeline is late (``strict_caps``):
        a capped message whose release second has passed takes a new one. Without
        ``strict_caps``, none."""
        return self._limits if self.strict_caps else _NO_LIMITS

    def delay_queue_url_of(self, priority: str) -> str:
        """The delay queue of a priority (the normal one when it has none of its own)."""
        own = {
            c.PRIORITY_HIGH: self.delay_queue_high_url,
            c.PRIORITY_LOW: self.delay_queue_low_url,
        }.get(priority, "")
        return own or self.delay_queue_url

    def _timing_problems(self) -> list[str]:
        problems = []
        if not 1 <= self.horizon_seconds <= c.SQS_MAX_DELAY_SECONDS:
            problems.append(f"horizon_seconds must be 1..{c.SQS_MAX_DELAY_SECONDS}")
        if not 0 < self.lookahead_seconds < self.horizon_seconds:
            problems.append("lookahead_seconds must be > 0 and < horizon_seconds")
        elif self.lookahead_seconds + self.ingest_timeout_seconds > self.horizon_seconds:
            # An ingest that routed a message to the store has written it before the
            # scheduler's window can reach its due-second (docs/internals.md, "ingest guard").
            problems.append(
                "lookahead_seconds + ingest_timeout_seconds must be <= horizon_seconds "
                f"({self.lookahead_seconds} + {self.ingest_timeout_seconds} > "
                f"{self.horizon_seconds})"
            )
        if self.ingest_timeout_seconds < 1:
            problems.append("ingest_timeout_seconds must be >= 1")
        if not 0 <= self.ttl_clock_margin_seconds < self.ttl_grace_seconds:
            # Otherwise every second the scheduler passes counts as late, and the cleanup
            # function re-drives every TTL removal: a duplicate of every stored message.
            problems.append(
                "ttl_clock_margin_seconds must be >= 0 and < ttl_grace_seconds "
                f"({self.ttl_clock_margin_seconds} vs {self.ttl_grace_seconds})"
            )
        if self.tick_seconds <= 0:
            problems.append("tick_seconds must be > 0")
        if self.emit_lead_ms < 0 or self.max_hold_ms < self.emit_lead_ms:
            problems.append("emit_lead_ms must be >= 0 and <= max_hold_ms")
        if not 0 <= self.direct_window_ms <= c.MAX_DIRECT_WINDOW_MS:
            problems.append(f"direct_window_ms must be 0..{c.MAX_DIRECT_WINDOW_MS}")
        return problems

    def _batching_problems(self) -> list[str]:
        problems = []
        if self.stats_flush_messages < 1:
            problems.append("stats_flush_messages must be >= 1")
        if self.scheduler_page_items < 1:
            problems.append("scheduler_page_items must be >= 1")
        problems.extend(self._bundle_problems())
        if not 1 <= self.shards <= c.MAX_SHARDS:
            problems.append(f"shards must be 1..{c.MAX_SHARDS}")
        return problems

    def _limit_problems(self) -> list[str]:
        problems = []
        if self.max_delay_seconds < 1:
            problems.append("max_delay_seconds must be >= 1")
        if self.offload_threshold_bytes < 1 or self.max_payload_bytes < 1:
            problems.append("payload limits must be >= 1")
        if self.aws_connect_timeout_seconds <= 0 or self.aws_read_timeout_seconds <= 0:
            problems.append("AWS connect and read timeouts must be > 0")
        if self.delivery_max_attempts < 1:
            problems.append("delivery_max_attempts must be >= 1")
        if self.target_outage_max_seconds < 0:
            problems.append("target_outage_max_seconds must be >= 0")
        if not 0 <= self.delivery_log_rate <= 1:
            problems.append("delivery_log_rate must be 0..1")
        if self.pending_counts not in (0, 1):
            problems.append("pending_counts must be 0 or 1")
        if self.strict_caps not in (0, 1):
            problems.append("strict_caps must be 0 or 1")
        if self.id_index not in (0, 1):
            problems.append("id_index must be 0 or 1")
        return problems

    def _kafka_problems(self) -> list[str]:
        problems = []
        if self.kafka_security not in KAFKA_SECURITY_MODES:
            problems.append(f"kafka_security must be one of {sorted(KAFKA_SECURITY_MODES)}")
        if self.kafka_security.startswith("SASL_SCRAM") and not self.kafka_secret_arn:
            problems.append("SASL/SCRAM needs kafka_secret_arn (a Secrets Manager secret)")
        return problems

    def _bundle_problems(self) -> list[str]:
        problems = []
        if not 1024 <= self.bundle_max_bytes <= c.SQS_MAX_MESSAGE_BYTES:
            problems.append(f"bundle_max_bytes must be 1024..{c.SQS_MAX_MESSAGE_BYTES}")
        if not 1 <= self.bundle_max_messages <= c.MAX_BUNDLE_ENTRIES:
            problems.append(f"bundle_max_messages must be 1..{c.MAX_BUNDLE_ENTRIES}")
        return problems

    @property
    def kafka_max_message_bytes(self) -> int:
        """The producer's ``message.max.bytes``: every record ingest accepts fits it."""
        return max(
            c.KAFKA_DEFAULT_MESSAGE_MAX_BYTES,
            self.max_payload_bytes + c.KAFKA_RECORD_OVERHEAD_BYTES,
        )

    def target_allowed(self, topic: str) -> bool:
        """True when the topic matches the allow-list (see `topic_allowed`)."""
        return _topic_allowed_cached(topic, self._patterns)

    def require(self, *names: str) -> Settings:
        """Fail at cold start, not mid-batch, when a resource this handler uses is unset."""
        missing = [n for n in names if not getattr(self, n)]
        if missing:
            raise ConfigurationError(f"missing settings: {', '.join(missing)}")
        return self

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **overrides)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read the `DELAYQ_*` variables; keyword arguments win over the environment."""
        env = _environment(environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if not f.init:
                continue
            var = _ENV_OF.get(f.name)
            if var is None or var not in env or env[var] == "":
                continue
            values[f.name] = _parse(f.name, var, env[var], f.type)
        values.update(overrides)
        return cls(**values)


# Powertools Tracer's switch (the template sets it from its Tracing parameter) and the variable
# Lambda sets in every execution environment.
TRACE_DISABLED_ENV = "POWERTOOLS_TRACE_DISABLED"
LAMBDA_TASK_ROOT_ENV = "LAMBDA_TASK_ROOT"
_FALSE = frozenset({"false", "0", "no", "off"})


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether handlers are traced (``delayq.tracing``): in Lambda, with
    POWERTOOLS_TRACE_DISABLED set to false. Read at import time, before the settings are."""
    env = _environment(environ)
    disabled = env.get(TRACE_DISABLED_ENV, "true").strip().lower()
    return disabled in _FALSE and bool(env.get(LAMBDA_TASK_ROOT_ENV))


def _environment(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """The variables given, else the process's: the one place the layer reads them."""
    return os.environ if environ is None else environ


def topic_allowed(topic: str, patterns: Iterable[str]) -> bool:
    """True when the topic matches an allow-list entry (exact names or fnmatch patterns) and is
    not internal (``__*``): no allow-list opens Kafka's own topics."""
    if topic.startswith(c.INTERNAL_TOPIC_PREFIX):
        return False
    return any(fnmatchcase(topic, pattern) for pattern in patterns)


# Ingest checks the target of every record, and a batch's records share a few targets.
# Bounded: a producer sending ever new targets cannot grow it.
_topic_allowed_cached = lru_cache(maxsize=1024)(topic_allowed)


def _allow_list_problems(patterns: tuple[str, ...]) -> list[str]:
    """Entries that would open more than the operator can have meant: a pattern starting with
    a wildcard matches (nearly) every topic, and internal topics are never targets."""
    problems = []
    for pattern in patterns:
        if not pattern:
            continue
        if pattern[0] in c.TOPIC_WILDCARDS:
            problems.append(
                f"allowed_targets entry {pattern!r} starts with a wildcard: it would allow "
                "(nearly) every topic; start each pattern with a literal (orders.*)"
            )
        elif pattern.startswith(c.INTERNAL_TOPIC_PREFIX):
            problems.append(f"allowed_targets entry {pattern!r} names internal topics (__*)")
    return problems


_ENV_OF = {
    "table_name": c.ENV_TABLE_NAME,
    "delay_queue_url": c.ENV_DELAY_QUEUE_URL,
    "tick_queue_url": c.ENV_TICK_QUEUE_URL,
    "reject_queue_url": c.ENV_REJECT_QUEUE_URL,
    "payload_bucket": c.ENV_PAYLOAD_BUCKET,
    "allowed_targets": c.ENV_ALLOWED_TARGETS,
    "horizon_seconds": c.ENV_HORIZON_SECONDS,
    "lookahead_seconds": c.ENV_LOOKAHEAD_SECONDS,
    "tick_seconds": c.ENV_TICK_SECONDS,
    "shards": c.ENV_SHARDS,
    "max_delay_seconds": c.ENV_MAX_DELAY_SECONDS,
    "max_payload_bytes": c.ENV_MAX_PAYLOAD_BYTES,
    "offload_threshold_bytes": c.ENV_OFFLOAD_THRESHOLD_BYTES,
    "ttl_grace_seconds": c.ENV_TTL_GRACE_SECONDS,
    "ttl_clock_margin_seconds": c.ENV_TTL_CLOCK_MARGIN_SECONDS,
    "emit_lead_ms": c.ENV_EMIT_LEAD_MS,
    "max_hold_ms": c.ENV_MAX_HOLD_MS,
    "kafka_bootstrap": c.ENV_KAFKA_BOOTSTRAP,
    "kafka_security": c.ENV_KAFKA_SECURITY,
    "kafka_secret_arn": c.ENV_KAFKA_SECRET_ARN,
    "kafka_ca_location": c.ENV_KAFKA_CA_LOCATION,
    "kafka_timeout_seconds": c.ENV_KAFKA_TIMEOUT_SECONDS,
    "aws_connect_timeout_seconds": c.ENV_AWS_CONNECT_TIMEOUT_SECONDS,
    "aws_read_timeout_seconds": c.ENV_AWS_READ_TIMEOUT_SECONDS,
    "ingest_timeout_seconds": c.ENV_INGEST_TIMEOUT_SECONDS,
    "delay_dlq_url": c.ENV_DELAY_DLQ_URL,
    "delivery_max_attempts": c.ENV_DELIVERY_MAX_ATTEMPTS,
    "target_outage_max_seconds": c.ENV_TARGET_OUTAGE_MAX_SECONDS,
    "direct_window_ms": c.ENV_DIRECT_WINDOW_MS,
    "delivery_log_rate": c.ENV_DELIVERY_LOG_RATE,
    "pending_counts": c.ENV_PENDING_COUNTS,
    "tenant_limits": c.ENV_TENANT_LIMITS,
    "strict_caps": c.ENV_STRICT_CAPS,
    "id_index": c.ENV_ID_INDEX,
    "delay_queue_high_url": c.ENV_DELAY_QUEUE_HIGH_URL,
    "delay_queue_low_url": c.ENV_DELAY_QUEUE_LOW_URL,
    "stats_flush_messages": c.ENV_STATS_FLUSH_MESSAGES,
    "scheduler_page_items": c.ENV_SCHEDULER_PAGE_ITEMS,
    "bundle_max_bytes": c.ENV_BUNDLE_MAX_BYTES,
    "bundle_max_messages": c.ENV_BUNDLE_MAX_MESSAGES,
    "region": c.ENV_AWS_REGION,
}


def _parse(name: str, var: str, raw: str, annotation: object) -> Any:
    text = raw.strip()
    try:
        if annotation == "int":
            return int(text)
        if annotation == "float":
            return float(text)
    except ValueError as e:
        raise ConfigurationError(f"{var}={raw!r} is not a number ({name})") from e
    if annotation == "tuple[str, ...]":
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return text
