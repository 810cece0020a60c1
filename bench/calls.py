"""AWS requests per message, by path, counted from the calls the services make.

A deterministic workload runs through the real services on the in-memory clients at realistic
batch sizes: ingest batches of 100 Kafka records, the scheduler over due-seconds that each hold
what 100 M messages a day put there (the workload's long messages per second, over 16 shards),
and the emitter behind a model of the Lambda SQS event source (``ReceiveMessage`` of up to 10,
the emitter, ``DeleteMessageBatch`` of the successful ones; counted on the same fake client).

Paths: ``short`` (due within the horizon: straight to SQS), ``long`` (stored in DynamoDB, then
scheduled), ``cancel`` (a cancel record: one marker), ``reschedule`` (a reschedule record moving
a stored message an hour later: what the reschedule itself costs at ingest), and ``mix`` (the
workload's mix in mixed ingest batches: the figure the SQS target is checked against).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bench.harness import InMemoryPipeline, bench_settings
from bench.reference_mix import (
    DELAY_TOPIC,
    REFERENCE_MIX,
    Workload,
    batched,
    kafka_record,
    mixed_delays_ms,
)
from delayq import buckets
from testkit import events
from testkit.aws import RequestCounter
from testkit.clock import NOW_MS

INGEST_BATCH: Final = 100
# Event source calls, made by Lambda on our behalf (billed to us like any other request).
EVENT_SOURCE_OPERATIONS: Final = frozenset({"sqs.ReceiveMessage", "sqs.DeleteMessageBatch"})
SQS_TARGET: Final = 0.35
DYNAMODB_WRITES_LONG_TARGET: Final = 1.0
DYNAMODB_READS_LONG_TARGET: Final = 0.1


@dataclass(frozen=True)
class CallSettings:
    """Messages per path run."""

    messages: int = 20_000
    cancels: int = 2_000
    seed: int = 11


QUICK_CALLS = CallSettings(messages=400, cancels=100)


@dataclass
class PathCounts:
    """What one path's run called, in total and per stage."""

    path: str
    messages: int
    long_messages: int
    calls: dict[str, int]
    units: dict[str, float]
    stages: dict[str, dict[str, int]]
    invocations: dict[str, int]
    due_seconds: int = 0
    queue_messages: int = 0  # SQS messages the emitter received (a bundle is one)
    notes: list[str] = field(default_factory=list)

    def per_message(self, key: str, *, long_only: bool = False) -> float:
        """Calls of ``service.Operation`` (or all of ``service`` when no dot) per message."""
        n = self.long_messages if long_only else self.messages
        if "." in key:
            total = self.calls.get(key, 0)
        else:
            total = sum(v for k, v in self.calls.items() if k.split(".")[0] == key)
        return total / n if n else 0.0

    def unit_per_message(self, unit: str, *, long_only: bool = False) -> float:
        """Billing units (``service.unit``) per message."""
        n = self.long_messages if long_only else self.messages
        return self.units.get(unit, 0.0) / n if n else 0.0

    def summary(self) -> dict[str, Any]:
        """Per-message figures for reports (long-path DynamoDB figures per long message)."""
        long_only = self.long_messages > 0 and self.path in ("long",)
        ddb_writes = sum(
            v
            for k, v in self.calls.items()
            if k.startswith("dynamodb.")
            and k.split(".")[1] in ("BatchWriteItem", "PutItem", "UpdateItem", "DeleteItem")
        )
        ddb_reads = sum(
            v
            for k, v in self.calls.items()
            if k.startswith("dynamodb.") and k.split(".")[1] in ("GetItem", "BatchGetItem", "Query")
        )
        n = self.long_messages if long_only else self.messages
        event_source = sum(v for k, v in self.calls.items() if k in EVENT_SOURCE_OPERATIONS)
        return {
            "messages": self.messages,
            "sqs_requests": self.per_message("sqs"),
            "sqs_requests_by_event_source": event_source / self.messages if self.messages else 0,
            "sqs_billed_requests": self.unit_per_message("sqs.standard")
            + self.unit_per_message("sqs.fifo"),
            "dynamodb_write_calls": ddb_writes / n if n else 0.0,
            "dynamodb_read_calls": ddb_reads / n if n else 0.0,
            "dynamodb_wru": self.unit_per_message("dynamodb.wru", long_only=long_only),
            "dynamodb_rru": self.unit_per_message("dynamodb.rru", long_only=long_only),
            "s3_requests": self.per_message("s3"),
            "per_long_message": long_only,
            "by_operation": {k: v / self.messages for k, v in sorted(self.calls.items())},
            "by_stage": {
                stage: {k: v / self.messages for k, v in sorted(calls.items())}
                for stage, calls in self.stages.items()
            },
            "invocations_per_message": {
                k: v / self.messages for k, v in self.invocations.items() if v
            },
            "due_seconds": self.due_seconds,
            "messages_per_queue_message": self.messages / self.queue_messages
            if self.queue_messages
            else 1.0,
            "notes": self.notes,
        }


def _records(
    path: str, count: int, workload: Workload, first_second: int, rng: random.Random
) -> list[dict[str, Any]]:
    """Kafka records for one path. Long messages are packed ``long_per_second`` to a
    due-second from ``first_second``, as at steady state; short ones have delays uniform over
    the horizon."""
    per_second = max(1, round(workload.long_per_second))
    horizon_ms = workload.horizon_seconds * 1000
    if path == "cancel":
        return [kafka_record(i, cancel=f"order-{i}") for i in range(count)]
    if path == "short":
        kinds = ["short"] * count
    elif path == "long":
        kinds = ["long"] * count
    else:
        n_short = round(count * workload.short_share)
        kinds = ["short"] * n_short + ["long"] * (count - n_short)
        rng.shuffle(kinds)
    records = []
    long_index = 0
    for i, kind in enumerate(kinds):
        if kind == "short":
            records.append(kafka_record(i, delay_ms=rng.randrange(1000, horizon_ms)))
        else:
            second = first_second + long_index // per_second
            due = second * 1000 + rng.randrange(1000)
            records.append(kafka_record(i, deliver_at_ms=due))
            long_index += 1
    return records


def run_path(
    path: str, count: int, workload: Workload = REFERENCE_MIX, seed: int = 11
) -> PathCounts:
    """Run one path's workload through ingest, scheduler and the emitter; count every call."""
    rng = random.Random(seed)
    pipeline = InMemoryPipeline.create()
    try:
        s = pipeline.settings
        now_s = buckets.due_second(NOW_MS)
        first = now_s + s.horizon_seconds + 60
        records = _records(path, count, workload, first, rng)
        long_count = sum(1 for r in records if any("delay-deliver-at" in h for h in r["headers"]))
        due_seconds = math.ceil(long_count / max(1, round(workload.long_per_second)))
        deadline = pipeline.deadline()
        # Steady state: the watermark item exists, just behind the seconds we will schedule.
        pipeline.store.create_watermark(first - 1, NOW_MS, deadline)
        # ... and the control clocks, created a day ago (a new stack reads every marker for
        # its first hour, delayq.control_clock.FLOOR_MARGIN_SECONDS).
        pipeline.store.control_clocks(range(s.shards), NOW_MS - 86_400_000, deadline)
        pipeline.counter.reset()
        stages: dict[str, dict[str, int]] = {}
        queue_messages = 0

        def stage(name: str, before: RequestCounter) -> None:
            stages[name] = pipeline.counter.since(before).by_operation()

        before = pipeline.counter.snapshot()
        for chunk in batched(records, INGEST_BATCH):
            pipeline.ingest(events.kafka_event(*chunk))
        stage("ingest", before)

        if long_count:
            before = pipeline.counter.snapshot()
            last = first + due_seconds - 1
            pipeline.clock.now_ms = (last - s.lookahead_seconds) * 1000 + 500
            result = pipeline.schedule()
            assert result.sent == long_count, (result, long_count)
            stage("scheduler", before)

        if path != "cancel":
            # Everything is due by now: the emitter produces without holding (holding costs
            # time, not requests; see the cost model for the hold).
            pipeline.clock.now_ms = (first + due_seconds + s.horizon_seconds + 10) * 1000
            before = pipeline.counter.snapshot()
            # Bundles: one SQS message carries many delay messages.
            queue_messages = pipeline.poll_delay_queue()
            assert pipeline.producer.per_topic.total() == len(records)
            stage("emitter", before)
        notes = []
        if long_count:
            notes.append(
                f"scheduler: one run over {due_seconds} due-seconds of "
                f"{round(workload.long_per_second)} messages each (16 shards); at steady state "
                f"a tick (60 s) covers 60 such seconds: scheduler invocations are counted "
                f"per tick in the cost model"
            )
        return PathCounts(
            path=path,
            messages=len(records),
            long_messages=long_count,
            calls=pipeline.counter.by_operation(),
            units={f"{s_}.{u}": v for (s_, u), v in sorted(pipeline.counter.units.items())},
            stages=stages,
            invocations=pipeline.invocations.as_dict(),
            due_seconds=due_seconds,
            queue_messages=queue_messages,
            notes=notes,
        )
    finally:
        pipeline.close()


def run_reschedules(count: int, workload: Workload = REFERENCE_MIX, seed: int = 11) -> PathCounts:
    """Store ``count`` long messages, then count what ingest calls for one reschedule record
    each (an hour later: the copy is stored too). The messages' own requests are not counted:
    they are the ``long`` path's."""
    rng = random.Random(seed)
    pipeline = InMemoryPipeline.create()
    try:
        s = pipeline.settings
        first = buckets.due_second(NOW_MS) + s.horizon_seconds + 60
        messages = _records("long", count, workload, first, rng)
        deadline = pipeline.deadline()
        pipeline.store.create_watermark(first - 1, NOW_MS, deadline)
        for chunk in batched(messages, INGEST_BATCH):
            pipeline.ingest(events.kafka_event(*chunk))
        moves = [_reschedule_record(count + i, m) for i, m in enumerate(messages)]
        pipeline.counter.reset()
        moved = sum(
            pipeline.ingest(events.kafka_event(*chunk)).rescheduled
            for chunk in batched(moves, INGEST_BATCH)
        )
        assert moved == count, (moved, count)
        calls = pipeline.counter.by_operation()
        return PathCounts(
            path="reschedule",
            messages=count,
            long_messages=count,
            calls=calls,
            units={f"{s_}.{u}": v for (s_, u), v in sorted(pipeline.counter.units.items())},
            stages={"ingest": calls},
            invocations=pipeline.invocations.as_dict(),
            notes=["per reschedule record; the moved messages' own writes are the long path's"],
        )
    finally:
        pipeline.close()


def _reschedule_record(offset: int, message: dict[str, Any]) -> dict[str, Any]:
    """A record moving ``message`` (default id, ``delay-deliver-at``) an hour later."""
    (was_due,) = [
        bytes(h["delay-deliver-at"]) for h in message["headers"] if "delay-deliver-at" in h
    ]
    delay_id = f"{message['topic']}-{message['partition']}-{message['offset']}"
    return events.kafka_record(
        offset=offset,
        topic=DELAY_TOPIC,
        timestamp=NOW_MS + 1,
        key=None,
        value=None,
        reschedule=delay_id,
        was_due=was_due,
        deliver_at=str(int(was_due) + 3600_000),
    )


@dataclass
class CallFigures:
    """Every path's counts and the headline figures checked against the targets."""

    paths: dict[str, PathCounts]
    workload: Workload

    def headline(self) -> dict[str, float]:
        """``requests_per_message`` of bench.json."""
        mix = self.paths["mix"].summary()
        long_ = self.paths["long"].summary()
        return {
            "sqs": round(mix["sqs_requests"], 4),
            "dynamodb_writes_long": round(long_["dynamodb_wru"], 4),
            "dynamodb_reads_long": round(long_["dynamodb_rru"], 4),
            "dynamodb_write_calls_long": round(long_["dynamodb_write_calls"], 4),
            "dynamodb_read_calls_long": round(long_["dynamodb_read_calls"], 4),
        }

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        head = self.headline()
        return {
            **head,
            "targets": {
                "sqs": {"target": SQS_TARGET, "met": head["sqs"] <= SQS_TARGET},
                "dynamodb_writes_long": {
                    "target": DYNAMODB_WRITES_LONG_TARGET,
                    "met_in_request_units": head["dynamodb_writes_long"]
                    <= DYNAMODB_WRITES_LONG_TARGET,
                    "met_in_calls": head["dynamodb_write_calls_long"]
                    <= DYNAMODB_WRITES_LONG_TARGET,
                },
                "dynamodb_reads_long": {
                    "target": DYNAMODB_READS_LONG_TARGET,
                    "met_in_request_units": head["dynamodb_reads_long"]
                    <= DYNAMODB_READS_LONG_TARGET,
                    "met_in_calls": head["dynamodb_read_calls_long"] <= DYNAMODB_READS_LONG_TARGET,
                },
            },
            "units": "sqs: API calls per message (receives and deletes by the Lambda event "
            "source included); dynamodb_writes_long / dynamodb_reads_long: on-demand request "
            "units (WRU / RRU, what DynamoDB bills) per long-delay message; *_calls_long: API "
            "calls per long-delay message",
            "source": "in-memory clients (testkit.aws), real services",
            "by_path": {name: p.summary() for name, p in self.paths.items()},
        }


# Delay mixes for the cost of the pending counts: the reference mix (delays spread uniformly
# over bands of hours and days: nearly every record of a batch is due in a minute of its own,
# the worst case) and a producer that uses a few fixed delays (retries, reminders, timeouts).
FIXED_DELAYS_MS: Final = (30_000, 3600_000, 86_400_000)
PENDING_BATCHES: Final = (100, 1000)
# The label of the workload's own delay mix in measure_pending_counts' rows.
WORKLOAD_MIX: Final = "reference mix"


def measure_pending_counts(
    messages: int,
    workload: Workload = REFERENCE_MIX,
    seed: int = 11,
    batches: Sequence[int] = PENDING_BATCHES,
) -> dict[str, Any]:
    """What the pending counts add per message: ingest batches of records sent together (at
    the same time, delays drawn from the mix), run with the counts on and off, the difference
    in DynamoDB write calls and write units per message."""
    rng = random.Random(seed)
    mixes = {
        WORKLOAD_MIX: mixed_delays_ms(messages, workload, rng),
        "three fixed delays (30 s, 1 h, 1 day)": [
            rng.choice(FIXED_DELAYS_MS) for _ in range(messages)
        ],
    }
    rows = []
    for mix, delays in mixes.items():
        records = [kafka_record(i, delay_ms=d) for i, d in enumerate(delays)]
        for batch in sorted(set(batches)):
            on, off = (_ingest_counter(records, batch, counts) for counts in (1, 0))
            rows.append(
                {
                    "mix": mix,
                    "batch": batch,
                    "write_calls_per_message": (on.calls - off.calls) / messages,
                    "wru_per_message": (on.wru - off.wru) / messages,
                }
            )
    return {
        "messages": messages,
        "rows": rows,
        "note": "one UpdateItem per pending-count item (the minutes of an hour, the hours of a "
        "day, the days of a week) and target a batch touches; `delayq pending` reads 7 days "
        "with one Query per day",
    }


def pending_wru(pending: Mapping[str, Any], batch: int, mix: str = WORKLOAD_MIX) -> float:
    """Pending-count write units per message for ``mix`` in ingest batches of ``batch``
    (a row of :func:`measure_pending_counts`)."""
    for row in pending["rows"]:
        if row["mix"] == mix and row["batch"] == batch:
            return float(row["wru_per_message"])
    raise KeyError(f"no pending-count measurement for {mix!r} in batches of {batch}")


@dataclass(frozen=True)
class _Writes:
    calls: int
    wru: float


def _ingest_counter(records: list[dict[str, Any]], batch: int, counts: int) -> _Writes:
    pipeline = InMemoryPipeline.create(bench_settings(pending_counts=counts))
    try:
        deadline = pipeline.deadline()
        pipeline.store.create_watermark(buckets.due_second(NOW_MS) - 1, NOW_MS, deadline)
        pipeline.counter.reset()
        for chunk in batched(records, batch):
            pipeline.ingest(events.kafka_event(*chunk))
        calls = pipeline.counter.by_operation()
        return _Writes(
            sum(
                v
                for k, v in calls.items()
                if k in ("dynamodb.UpdateItem", "dynamodb.BatchWriteItem", "dynamodb.PutItem")
            ),
            pipeline.counter.unit("dynamodb", "wru"),
        )
    finally:
        pipeline.close()


def measure_calls(cfg: CallSettings, workload: Workload = REFERENCE_MIX) -> CallFigures:
    """Run the five paths."""
    paths = {
        "short": run_path("short", cfg.messages, workload, cfg.seed),
        "long": run_path("long", cfg.messages, workload, cfg.seed),
        "cancel": run_path("cancel", cfg.cancels, workload, cfg.seed),
        "reschedule": run_reschedules(cfg.cancels, workload, cfg.seed),
        "mix": run_path("mix", cfg.messages, workload, cfg.seed),
    }
    return CallFigures(paths, workload)
