"""Fairness under a burst: one tenant writes N messages due in the same second while another
tenant's steady traffic is due during it. What the bystanders' lateness is, with and without
the tenant features, and what the burst itself gets.

* :func:`measure_local` runs both on the embedded local stack (``delayq_local``), one after
  the other: **before**, the burst's tenant has no limit and shares the normal delay queue;
  **after**, it has a release-rate cap and ``delay-priority: low`` (its own delay queue and
  event source), the configuration the README recommends for bulk senders.
* :func:`aws_scale_model` derives the same workload at AWS scale (10 M messages due in one
  second, bystanders at a steady rate) from documented limits and this run's measured
  per-message costs, and names the limit that binds each goal.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, TextIO

from bench.local_stack import ROOT, TARGET, VALUE, first_per_id, percentile, wait_for

BYSTANDER: Final = "steady-b"
BYSTANDER_RATE: Final = 20.0  # messages/s due during the burst
BYSTANDER_SECONDS: Final = 60
GOAL_BYSTANDER_P99_MS: Final = 500.0


@dataclass(frozen=True)
class FairnessOptions:
    """The local fairness run."""

    enabled: str = "auto"  # as LocalOptions.enabled
    burst_messages: int = 20_000
    # The burst tenant's release cap in the "after" phase (messages/s).
    release_per_second: int = 100
    emitter_concurrency: int = 4


@dataclass(frozen=True)
class _Phase:
    name: str
    tenant: str
    priority: str | None


PHASES: Final = (
    _Phase("before", "burst-a", None),
    _Phase("after", "burst-a-capped", "low"),
)


def _send_phase(
    producer: Any, phase: _Phase, n: int, due_second: int
) -> tuple[dict[str, int], dict[str, int]]:
    """The bystanders (20/s from ``due_second`` on), then the burst (every message due in
    ``due_second``); returns their ids with due times. The bystanders go first: steady
    traffic due during a burst was mostly written before it."""
    from delayq import constants as c  # noqa: PLC0415
    from delayq_local.producer import Due  # noqa: PLC0415

    bystanders: dict[str, int] = {}
    for i in range(int(BYSTANDER_RATE * BYSTANDER_SECONDS)):
        delay_id = f"{phase.name}-b-{i}"
        due = due_second * 1000 + int(i * 1000 / BYSTANDER_RATE)
        bystanders[delay_id] = due
        producer.send(
            TARGET,
            Due(at_ms=due),
            value=VALUE,
            key=delay_id.encode(),
            delay_id=delay_id,
            headers=[(c.HEADER_TENANT, BYSTANDER.encode())],
        )
    burst: dict[str, int] = {}
    extra = [(c.HEADER_TENANT, phase.tenant.encode())]
    if phase.priority:
        extra.append((c.HEADER_PRIORITY, phase.priority.encode()))
    for i in range(n):
        delay_id = f"{phase.name}-a-{i}"
        due = due_second * 1000 + (i * 7) % 1000
        burst[delay_id] = due
        producer.send(
            TARGET,
            Due(at_ms=due),
            value=VALUE,
            key=f"{delay_id}".encode(),
            delay_id=delay_id,
            headers=extra,
        )
    producer.flush(180)
    return burst, bystanders


def _lateness(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": float(max(values)) if values else None,
    }


def _phase_figures(
    phase: _Phase,
    seen: Sequence[Any],
    burst: dict[str, int],
    bystanders: dict[str, int],
    cap: int | None,
) -> dict[str, Any]:
    first = first_per_id(seen)
    a = [d for d in first if d.delay_id in burst]
    b = [d for d in first if d.delay_id in bystanders]
    per_second = Counter(d.emitted_ms // 1000 for d in a)
    per_slot = Counter(d.free_ms // 1000 for d in a)
    due_ms = min(burst.values())
    emitted = sorted(d.emitted_ms for d in a)
    return {
        "tenant": phase.tenant,
        "priority": phase.priority or "normal",
        "release_per_second": cap,
        "bystanders": {
            "messages": len(bystanders),
            "delivered": len(b),
            # End to end: the observer's receive time minus the due time.
            "lateness_ms": _lateness([d.received_ms - d.due_ms for d in b]),
            "early": sum(1 for d in b if d.emitted_ms < d.due_ms),
        },
        "burst": {
            "messages": len(burst),
            "delivered": len(a),
            # From when each was free to go (its due time, or the slot its cap gave it).
            "lateness_ms": _lateness([d.received_ms - d.free_ms for d in a]),
            "after_due_ms": _lateness([d.received_ms - d.due_ms for d in a]),
            "early": sum(1 for d in a if d.emitted_ms < d.due_ms),
            # Emitted in one wall-clock second; and released in one slot second (what the
            # cap bounds: a pipeline running late catches up faster than the cap).
            "max_per_second": max(per_second.values()) if per_second else None,
            "max_per_release_second": max(per_slot.values()) if per_slot else None,
            "cap_respected": None if cap is None else max(per_slot.values(), default=0) <= cap,
            "drain_seconds": round((emitted[-1] - due_ms) / 1000, 2) if emitted else None,
        },
    }


def measure_local(options: FairnessOptions, out: TextIO) -> dict[str, Any]:
    """Each phase on a fresh embedded stack (moto's Query time grows with the table, so a
    phase must not pay for the other's items); the figures of each and the comparison."""
    phases: dict[str, Any] = {}
    started = time.monotonic()
    # One log file for both: the handlers' loggers keep the stream of their first cold start.
    log_path = ROOT / "results" / "bench-fairness-handlers.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as handler_output, contextlib.redirect_stdout(handler_output):
        for phase in PHASES:
            phases[phase.name] = _measure_phase(options, phase, out)
            b = phases[phase.name]["bystanders"]["lateness_ms"]
            out.write(f"   fairness {phase.name}: bystander p99 {b['p99']} ms\n")
    before, after = phases["before"], phases["after"]
    return {
        "phases": phases,
        "bystander_p99_ms": {
            "before": before["bystanders"]["lateness_ms"]["p99"],
            "after": after["bystanders"]["lateness_ms"]["p99"],
        },
        "burst_p99_ms": {
            "before": before["burst"]["lateness_ms"]["p99"],
            "after": after["burst"]["lateness_ms"]["p99"],
        },
        "goal_bystander_p99_ms": GOAL_BYSTANDER_P99_MS,
        "met": (after["bystanders"]["lateness_ms"]["p99"] or math.inf) <= GOAL_BYSTANDER_P99_MS,
        "duration_seconds": round(time.monotonic() - started, 1),
        "source": "measured on the embedded local stack (moto server, mock Kafka, emulated "
        "event sources), time compressed, 2 shared cores",
        "method": f"{options.burst_messages} messages of one tenant due in one second plus "
        f"{BYSTANDER_RATE:g}/s of another tenant due over the following {BYSTANDER_SECONDS} s, "
        "each phase on a fresh stack; before: no limit, one delay queue; after: the burst's "
        f"tenant capped at {options.release_per_second}/s with delay-priority low. Lateness end "
        "to end (receive minus due); the burst's from its release slot",
    }


def _measure_phase(options: FairnessOptions, phase: _Phase, out: TextIO) -> dict[str, Any]:
    from delayq_local.kafka_mock import CONSUMER_TUNING  # noqa: PLC0415
    from delayq_local.observe import DeliveryObserver  # noqa: PLC0415
    from delayq_local.producer import DelayProducer  # noqa: PLC0415
    from delayq_local.stack import EmbeddedStack, StackConfig, TimeCompression  # noqa: PLC0415

    capped = PHASES[1].tenant
    limits = {capped: {"release_per_second": options.release_per_second}}
    config = StackConfig(
        project_root=ROOT,
        stack_name="delayq-fairness",
        topics=(TARGET,),
        parameters={"AllowedTargets": "bench.*", "TenantLimits": json.dumps(limits)},
        environment={"LOG_LEVEL": "WARNING"},
        concurrency={"EmitterFunction": options.emitter_concurrency},
        time=TimeCompression(
            horizon_seconds=60, lookahead_seconds=50, tick_seconds=5, ttl_grace_seconds=900
        ),
    )
    with warnings.catch_warnings(), EmbeddedStack(config) as stack:
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        horizon = stack.config.time.horizon_seconds if stack.config.time else 900
        tuning = CONSUMER_TUNING if stack.mock_kafka is not None else None
        observer = DeliveryObserver(stack.kafka_bootstrap, [TARGET], tuning).start()
        producer = DelayProducer(stack.kafka_bootstrap, topic=stack.delay_topic)
        try:
            n = options.burst_messages
            # Beyond the horizon (the DynamoDB path), far enough out for ingest to store them
            # all first (about 100 records/s on a busy 2-core machine): what is measured is
            # the release, not ingest's backlog.
            due_second = int(time.time()) + horizon + 60 + n // 100
            burst, bystanders = _send_phase(producer, phase, n, due_second)
            cap = options.release_per_second if phase.tenant == capped else None
            out.write(
                f"   fairness {phase.name}: {n} of {phase.tenant} due in second {due_second} "
                f"({phase.priority or 'normal'} priority, cap {cap or 'none'}), "
                f"{len(bystanders)} of {BYSTANDER} at {BYSTANDER_RATE:g}/s; waiting\n"
            )
            drain_s = n / cap if cap else n / 100
            until = due_second + BYSTANDER_SECONDS + drain_s + 300
            seen = wait_for(observer, {**burst, **bystanders}, until, out)
            return _phase_figures(phase, seen, burst, bystanders, cap)
        finally:
            observer.stop()


# --- at AWS scale -----------------------------------------------------------------------------

# Documented AWS limits (Lambda's SQS scaling and provisioned-mode pages, the Lambda quotas).
SQS_STANDARD_MAX_CONCURRENCY: Final = 1250
SQS_STANDARD_SCALE_PER_MINUTE: Final = 300
SQS_PROVISIONED_MAX_CONCURRENCY: Final = 20_000
SQS_PROVISIONED_SCALE_PER_MINUTE: Final = 1000  # concurrent invocations added per minute
SQS_PROVISIONED_MIN_POLLERS_MAX: Final = 200  # the most pollers kept ready (MinimumPollers)
SQS_POLLER_INVOCATIONS: Final = 10  # concurrent invocations one poller serves
SQS_POLLER_BYTES_PER_SECOND: Final = 1_000_000
LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY: Final = 1000
LAMBDA_FULL_VCPU_MB: Final = 1769
GOAL_AWS_BYSTANDER_P99_MS: Final = 1000.0
GOAL_AWS_BURST_P99_MS: Final = 2000.0


@dataclass
class ScaleGoal:
    """One goal of the AWS-scale workload: the figure, whether it is met, what binds it."""

    name: str
    goal_ms: float
    figure_ms: float | None
    met: bool | None
    bound_by: str
    lifts: str


def aws_scale_model(
    *,
    messages: int,
    value_bytes: int,
    emitter_cpu_ms_per_message: float,
    emitter_memory_mb: int,
    bundle_messages: int,
    bundle_bytes: int,
    emit_lead_ms: int,
    steady_p99_ms: float | None,
    standard_drain_seconds: float,
) -> dict[str, Any]:
    """The 10 M same-second burst with steady bystanders, before and after the tenant
    features, from documented limits and measured costs.

    Before: bystanders share the delay queue with the burst; one due during the drain waits
    behind it, so the bystanders' p99 is about the drain time (``standard_drain_seconds``,
    the scale-out model's figure). After: the burst waits in the low-priority queue, whose
    event source is bounded by its own concurrency, so the bystanders' queue and pollers are
    untouched: their lateness is the steady state's (``steady_p99_ms``, measured on the local
    stack when it ran; None otherwise).

    The burst itself becomes visible ``emit_lead_ms`` before due, all at once. Provisioned
    mode keeps at most 200 pollers ready per event source (each ~1 MB/s and 10 concurrent
    invocations) and adds 1,000 concurrent invocations a minute beyond them: the time to
    pull its bytes through the ready pollers, less the lead, plus the emitters' CPU at their
    vCPU share, is how late its last messages are. A release cap at the rate those pollers
    pull turns that lateness into cap delay (counted apart), with the burst released within
    the cap's spread and on time from its slots.
    """
    # An envelope carries the value in base64 plus ~150 B of fields; a bundle holds as many
    # as fit its byte cap, up to its message cap.
    body_bytes = math.ceil(value_bytes * 4 / 3) + 150
    per_bundle = max(1, min(bundle_messages, bundle_bytes // body_bytes))
    total_bytes = messages * body_bytes
    vcpu = min(1.0, emitter_memory_mb / LAMBDA_FULL_VCPU_MB)
    per_message_ms = emitter_cpu_ms_per_message / vcpu
    per_invocation = 100 * per_bundle  # 100 SQS messages a batch, bundles inside
    invocations = math.ceil(messages / per_invocation)
    pollers = SQS_PROVISIONED_MIN_POLLERS_MAX
    ready = pollers * SQS_POLLER_INVOCATIONS
    pull_rate = pollers * SQS_POLLER_BYTES_PER_SECOND
    pull_s = total_bytes / pull_rate
    produce_s = per_invocation * per_message_ms / 1000
    lead_s = emit_lead_ms / 1000
    after_due_s = max(0.0, pull_s - lead_s) + produce_s
    cap = int(pull_rate / body_bytes)
    # Capped, each second's share is pulled in about a second, within the lead.
    capped_s = max(0.0, cap * body_bytes / pull_rate - lead_s) + produce_s
    ms = 1000
    goals = [
        ScaleGoal(
            "bystander p99, before (one delay queue)",
            GOAL_AWS_BYSTANDER_P99_MS,
            standard_drain_seconds * ms,
            standard_drain_seconds * ms <= GOAL_AWS_BYSTANDER_P99_MS,
            "the burst ahead of them in the same queue (standard mode: "
            f"+{SQS_STANDARD_SCALE_PER_MINUTE}/min up to {SQS_STANDARD_MAX_CONCURRENCY})",
            "delay-priority low for the burst (its own queue and event source)",
        ),
        ScaleGoal(
            "bystander p99, after (burst in the low-priority queue)",
            GOAL_AWS_BYSTANDER_P99_MS,
            steady_p99_ms,
            None if steady_p99_ms is None else steady_p99_ms <= GOAL_AWS_BYSTANDER_P99_MS,
            "their own queue's steady-state lateness (the local stack's steady p99 stands in "
            "for it); the burst's event source is bounded by EmitterLowMaxConcurrency",
            "-",
        ),
        ScaleGoal(
            "burst p99 after due, uncapped, 200 ready pollers",
            GOAL_AWS_BURST_P99_MS,
            after_due_s * ms,
            after_due_s * ms <= GOAL_AWS_BURST_P99_MS,
            f"SQS provisioned mode: at most {pollers} pollers kept ready per event source, "
            f"~{SQS_POLLER_BYTES_PER_SECOND / 1e6:g} MB/s each: {total_bytes / 1e9:.1f} GB "
            f"take {pull_s:.0f} s against a {lead_s:g} s emit lead",
            "no setting lifts it for one event source; a release cap of "
            f"{cap:,}/s on the burst's tenant (what {pollers} pollers pull) releases it over "
            f"{messages / cap:.0f} s, each message on time from its slot",
        ),
        ScaleGoal(
            f"burst p99 from its release slot, capped at {cap:,}/s",
            GOAL_AWS_BURST_P99_MS,
            capped_s * ms,
            capped_s * ms <= GOAL_AWS_BURST_P99_MS,
            f"the emitters' CPU: {per_invocation:,} messages per invocation at "
            f"{per_message_ms:.3f} ms each ({vcpu:.2f} vCPU), {ready:,} invocations ready "
            f"(Lambda account concurrency >= {ready:,}; default "
            f"{LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY})",
            f"the emitter's MemorySize at {LAMBDA_FULL_VCPU_MB} MB (one vCPU): "
            f"{(capped_s - produce_s + produce_s * vcpu) * ms:,.0f} ms",
        ),
    ]
    return {
        "messages": messages,
        "value_bytes": value_bytes,
        "invocations": invocations,
        "ready_pollers": pollers,
        "pull_seconds": round(pull_s, 1),
        "produce_seconds": round(produce_s, 3),
        "cap_per_second": cap,
        "bystander_p99_ms": {
            "before": round(standard_drain_seconds * ms),
            "after": None if steady_p99_ms is None else round(steady_p99_ms),
        },
        "burst_p99_ms": {
            "uncapped_after_due": round(after_due_s * ms),
            "capped_from_release": round(capped_s * ms),
        },
        "goals": [asdict(g) for g in goals],
        "inputs": {
            "emitter_cpu_ms_per_message": emitter_cpu_ms_per_message,
            "emitter_memory_mb": emitter_memory_mb,
            "messages_per_bundle": per_bundle,
            "emit_lead_ms": emit_lead_ms,
            "limits": {
                "sqs_provisioned_max_concurrency": SQS_PROVISIONED_MAX_CONCURRENCY,
                "sqs_provisioned_scale_per_minute": SQS_PROVISIONED_SCALE_PER_MINUTE,
                "sqs_provisioned_min_pollers_max": SQS_PROVISIONED_MIN_POLLERS_MAX,
                "sqs_poller_invocations": SQS_POLLER_INVOCATIONS,
                "sqs_poller_bytes_per_second": SQS_POLLER_BYTES_PER_SECOND,
                "lambda_default_account_concurrency": LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY,
            },
        },
        "source": "model: documented AWS limits and this run's measured emitter CPU; "
        "not measured in AWS",
    }
