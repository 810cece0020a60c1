"""Fault injection on the embedded stack: each scenario runs the demo workload (both
paths, a same-second burst, cancels, invalid records) on a fresh stack with a fault plan, and
checks that every accepted message arrives at least once and none early, and that the faults
really fired. Duplicates and lateness are printed and collected into `results/faults.json`."""

from __future__ import annotations

import fcntl
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from delayq_local.demo import DemoOptions, run_demo
from delayq_local.demo_plan import DEFAULT_TARGETS
from delayq_local.faults import (
    AwsFault,
    Calls,
    Crash,
    ExtraTicks,
    FaultPlan,
    KafkaRequestErrors,
    PartialBatch,
    PauseSource,
    RepeatedTicks,
    throttling_and_server_errors,
)
from delayq_local.kafka_mock import ApiKey
from delayq_local.stack import StackConfig, TimeCompression
from delayq_local.verdict import DemoReport
from tests.integration.support import PROJECT_ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

FAST = TimeCompression(
    horizon_seconds=15, lookahead_seconds=10, tick_seconds=2, ttl_grace_seconds=10
)
# A crashed or failed batch comes back within seconds, not after the template's 3 and 6 minutes.
SHORT_VISIBILITY = {
    "DelayQueue": {"VisibilityTimeout": 10},
    "TickQueue": {"VisibilityTimeout": 5},
}
RESULTS = PROJECT_ROOT / "results" / "faults.json"


@dataclass(frozen=True)
class Scenario:
    """A fault plan, what must show that it fired, and whether the emitter's clock is true."""

    name: str
    plan: FaultPlan
    # Counters of `DemoReport.extra["faults"]` (by name prefix) and of the sources
    # (`<function>:<event>/<counter>`, by prefix) that must end above zero.
    fired: tuple[str, ...] = ()
    source_counters: tuple[str, ...] = ()
    kafka_outage: tuple[float, float] | None = None
    # Whether some deliveries must be retries (`delay-attempt` above 1).
    retried: bool = False
    # Whether the producing functions' clocks are true: the emitter's, and ingest's, whose
    # direct path produces messages due within its window. A producer whose clock is ahead
    # delivers early in true time by its error (never on its own clock).
    emitter_clock_true: bool = True
    notes: Mapping[str, Any] = field(default_factory=dict)


SEND_BATCH = frozenset({"SendMessageBatch"})

SCENARIOS = [
    Scenario(
        "aws-throttling-and-5xx",
        FaultPlan(aws=throttling_and_server_errors(rate=0.2, limit=40)),
        fired=("throttle sqs", "throttle dynamodb", "servererror sqs", "servererror dynamodb"),
    ),
    Scenario(
        "aws-partial-batches",
        FaultPlan(
            aws=(
                # A rate below 1 or a limit: a batch always partly failed never goes through.
                AwsFault(PartialBatch(0.5), Calls("sqs", SEND_BATCH, rate=0.4)),
                # Ingest writes a few large batches: fail part of each of its first four calls.
                AwsFault(
                    PartialBatch(0.5), Calls("dynamodb", frozenset({"BatchWriteItem"}), limit=4)
                ),
                AwsFault(
                    PartialBatch(0.5), Calls("dynamodb", frozenset({"BatchGetItem"}), rate=0.4)
                ),
            )
        ),
        fired=(
            "partialbatch sqs:SendMessageBatch",
            "partialbatch dynamodb:BatchWriteItem",
            "partialbatch dynamodb:BatchGetItem",
        ),
    ),
    Scenario(
        "crash-mid-batch",
        FaultPlan(
            aws=(
                # Ingest dies after its first send (the rest of its batch unsent).
                AwsFault(
                    Crash(),
                    Calls("sqs", SEND_BATCH, frozenset({"IngestFunction"}), limit=1),
                ),
                # The scheduler dies after queuing a second, before moving its watermark.
                AwsFault(
                    Crash(),
                    Calls("sqs", SEND_BATCH, frozenset({"SchedulerFunction"}), limit=2),
                ),
                # The emitter dies after producing to Kafka (its statistics write comes after
                # the flush), before its batch is deleted from the queue.
                AwsFault(
                    Crash(),
                    Calls(
                        "dynamodb", frozenset({"PutItem"}), frozenset({"EmitterFunction"}), limit=2
                    ),
                ),
            )
        ),
        fired=(
            "crash sqs:SendMessageBatch@Ingest",
            "crash sqs:SendMessageBatch@Scheduler",
            "crash dynamodb",
        ),
        source_counters=("IngestFunction", "SchedulerFunction", "EmitterFunction"),
    ),
    Scenario(
        "duplicate-and-missed-ticks",
        FaultPlan(
            timed=(
                # Duplicates before and after the pause (not during: a repeated tick message
                # would run the scheduler and hide the missed ticks).
                *(ExtraTicks(every=1.0, start=start, stop=start + 6) for start in (0.0, 27.0)),
                *(RepeatedTicks(every=2.0, start=start, stop=start + 6) for start in (0.0, 27.0)),
                # 10 tick periods without a timer (10 minutes at AWS's 60 s tick).
                PauseSource("TimerFunction", at=6.5, seconds=20.0),
            )
        ),
        fired=("extra timer firings", "repeated tick messages", "TimerFunction paused"),
    ),
    Scenario(
        "kafka-broker-down-and-request-errors",
        FaultPlan(
            timed=(
                KafkaRequestErrors(
                    ApiKey.FETCH,
                    (KafkaError.NOT_LEADER_FOR_PARTITION,) * 3
                    + (KafkaError.REQUEST_TIMED_OUT,) * 3,
                    at=2.0,
                ),
                # Dropped connections: the mock cannot model retriable Produce error codes for
                # an idempotent producer (see KafkaRequestErrors).
                KafkaRequestErrors(ApiKey.PRODUCE, (KafkaError._TRANSPORT,) * 6, at=16.0),
            )
        ),
        fired=("kafka fetch errors", "kafka produce errors", "kafka brokers down"),
        kafka_outage=(8.0, 6.0),
    ),
    Scenario(
        "kafka-delivery-failures",
        FaultPlan(
            timed=(
                # After the workload and its cancels are sent: only the emitter produces then.
                # The producer gives up on these (a permanent error): failed delivery reports.
                KafkaRequestErrors(
                    ApiKey.PRODUCE, (KafkaError.TOPIC_AUTHORIZATION_FAILED,) * 4, at=7.0
                ),
                KafkaRequestErrors(
                    ApiKey.PRODUCE, (KafkaError.TOPIC_AUTHORIZATION_FAILED,) * 4, at=14.0
                ),
            )
        ),
        fired=("kafka produce errors",),
        # Refused deliveries go back to the delay queue with their attempt counted (they are
        # not reported to SQS as failures): the retries show in `delay-attempt`.
        retried=True,
    ),
    Scenario(
        "clock-skew-ingest+2s-scheduler-2s-cleanup+2s",
        FaultPlan(
            clock_skew_ms={
                "IngestFunction": 2000,
                "SchedulerFunction": -2000,
                "CleanupFunction": 2000,
            }
        ),
        # Ingest's direct path produces on ingest's clock, 2 s ahead here.
        emitter_clock_true=False,
    ),
    Scenario(
        "clock-skew-ingest-2s-scheduler+2s-cleanup-2s",
        FaultPlan(
            clock_skew_ms={
                "IngestFunction": -2000,
                "SchedulerFunction": 2000,
                "CleanupFunction": -2000,
            }
        ),
    ),
    Scenario("clock-skew-emitter-2s", FaultPlan(clock_skew_ms={"EmitterFunction": -2000})),
    Scenario(
        "clock-skew-emitter+2s",
        FaultPlan(clock_skew_ms={"EmitterFunction": 2000}),
        emitter_clock_true=False,
    ),
]


def config(stack_name: str, plan: FaultPlan) -> StackConfig:
    return StackConfig(
        project_root=PROJECT_ROOT,
        stack_name=stack_name,
        parameters={"AllowedTargets": "demo.*"},
        topics=DEFAULT_TARGETS,
        environment={"LOG_LEVEL": "ERROR"},
        time=FAST,
        concurrency={"EmitterFunction": 2},
        ttl_sweep_seconds=2.0,
        overrides=SHORT_VISIBILITY,
        faults=plan,
    )


@pytest.fixture(scope="module")
def measured() -> Iterator[dict[str, Any]]:
    """Each scenario's figures; merged into `results/faults.json` and printed at the end."""
    figures: dict[str, Any] = {}
    yield figures
    if not figures:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # Test workers (pytest-xdist) run scenarios in parallel: one merges its figures at a time.
    with RESULTS.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        RESULTS.write_text(json.dumps({**known, **figures}, indent=2, sort_keys=True) + "\n")
    print(f"\nfault scenarios ({RESULTS}):")
    for name, f in figures.items():
        late, seen = f["lateness_ms"], f["seen_by_consumer_ms"]
        print(
            f"  {name:46} lost {f['lost']}  early {f['early']}/{f['early_received']}"
            f"  duplicates {f['duplicates']}  lateness p50/p99/max"
            f" {late['p50']:.0f}/{late['p99']:.0f}/{late['max']:.0f} ms"
            f"  (consumer min/p50/max {seen['min']:.0f}/{seen['p50']:.0f}/{seen['max']:.0f} ms)"
            f"  faults {sum(f['faults'].values())}"
        )


def figures(report: DemoReport) -> dict[str, Any]:
    extra = report.extra
    return {
        "expected": report.expected,
        "delivered": report.delivered,
        "lost": report.lost,
        "early": report.early,
        "early_received": report.early_received,
        "duplicates": report.duplicates,
        "retried": report.retried,
        "rejected": report.rejected,
        "rejected_expected": report.rejected_expected,
        "lateness_ms": vars(report.lateness_ms),
        "steady_lateness_ms": vars(report.steady_lateness_ms),
        "seen_by_consumer_ms": vars(report.end_to_end_ms),
        "faults": dict(extra.get("faults") or {}),
        "duration_seconds": extra.get("duration_seconds"),
    }


def source_counter(report: DemoReport, function: str, counter: str) -> int:
    sources: Mapping[str, Mapping[str, int]] = report.extra["sources"]
    return sum(counts.get(counter, 0) for name, counts in sources.items() if function in name)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_no_loss_and_nothing_early_under_faults(
    scenario: Scenario, stack_name: str, tmp_path: Path, measured: dict[str, Any]
) -> None:
    options = DemoOptions(
        messages=90,
        max_delay_seconds=30,
        send_seconds=0,  # the faults' times count from a workload written at once
        results=tmp_path,
        settle_seconds=3,
        timeout_seconds=60,
        kafka_outage=scenario.kafka_outage,
    )

    report = run_demo(config(stack_name, scenario.plan), options, out=io.StringIO())

    measured[scenario.name] = figures(report)
    print(f"\n{scenario.name}: faults {report.extra['faults']}")
    print("\n".join(report.lines()))
    assert report.expected > 60
    assert (report.lost, report.lost_ids) == (0, ())
    # Never early on the producers' clocks (the reference); in true time as well unless a
    # producer's own clock is ahead.
    assert report.early == 0
    if scenario.emitter_clock_true:
        assert report.early_received == 0
    assert report.cancelled_honoured == report.cancelled > 0
    assert report.rejected >= report.rejected_expected
    assert report.rejected_wrong_reason == 0
    assert report.due_mismatches == 0
    injected = report.extra["faults"]
    for prefix in scenario.fired:
        assert sum(n for name, n in injected.items() if name.startswith(prefix)) > 0, prefix
    if scenario.retried:
        assert report.retried > 0
    counter = "crashes" if scenario.name.startswith("crash") else "item_failures"
    for function in scenario.source_counters:
        assert source_counter(report, function, counter) > 0, (function, counter)
