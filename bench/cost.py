"""Cost model: US dollars per million messages for a stated workload, this design side by side
with the alternatives, from the measured request counts and CPU figures and list prices.

Every price below is a us-east-1 list price with its date and source. Every figure that is
not measured here is an assumption written in :class:`Assumptions` and printed with the
result. Free tiers are ignored (they are negligible at 100 M messages a day).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from typing import Any, Final

from bench.reference_mix import DAY_SECONDS, REFERENCE_MIX, VALUE_BYTES, Workload, delay_request
from bench.template import FunctionConfig, deployed
from delayq import buckets, control_clock
from delayq import constants as c
from delayq.store import locator_item, message_item, placement_items
from sim import scale
from sim.scale import DDB_MISSING_KEY_RRU, vcpu_share
from testkit.aws import item_size, write_units
from testkit.clock import NOW_MS
from testkit.payload import random_bytes

# --- prices --------------------------------------------------------------------------------

PRICES_AS_OF: Final = "2026-11-21"


@dataclass(frozen=True)
class Price:
    """One list price (us-east-1, first tier)."""

    usd: float
    per: str
    source: str


PRICES: Final[Mapping[str, Price]] = {
    "sqs_standard_request": Price(
        0.40 / 1e6,
        "request (each 64 KB chunk of payload is one request)",
        "https://aws.amazon.com/sqs/pricing/ (first 100 B requests/month)",
    ),
    "sqs_fifo_request": Price(
        0.50 / 1e6, "request (64 KB chunks)", "https://aws.amazon.com/sqs/pricing/"
    ),
    "dynamodb_wru": Price(
        0.625 / 1e6,
        "write request unit (on-demand, 1 KB)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/ (after the Nov 2024 price cut)",
    ),
    "dynamodb_rru": Price(
        0.125 / 1e6,
        "read request unit (on-demand, 4 KB strongly consistent / 8 KB eventually)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/ (after the Nov 2024 price cut)",
    ),
    "dynamodb_storage_gb_month": Price(
        0.25, "GB-month (Standard table class)", "https://aws.amazon.com/dynamodb/pricing/"
    ),
    "lambda_gb_second_arm64": Price(
        0.0000133334, "GB-second, arm64", "https://aws.amazon.com/lambda/pricing/ (first tier)"
    ),
    "lambda_gb_second_x86": Price(
        0.0000166667, "GB-second, x86_64", "https://aws.amazon.com/lambda/pricing/ (first tier)"
    ),
    "lambda_request": Price(0.20 / 1e6, "invocation", "https://aws.amazon.com/lambda/pricing/"),
    "eventbridge_scheduler_invocation": Price(
        1.00 / 1e6,
        "scheduled invocation (schedule creation is not charged)",
        "https://aws.amazon.com/eventbridge/pricing/ (Scheduler)",
    ),
    "step_functions_transition": Price(
        25.0 / 1e6,
        "state transition (Standard workflows)",
        "https://aws.amazon.com/step-functions/pricing/",
    ),
    "s3_put": Price(
        0.005 / 1000, "PUT/COPY/POST/LIST request", "https://aws.amazon.com/s3/pricing/"
    ),
    "s3_get": Price(0.0004 / 1000, "GET request", "https://aws.amazon.com/s3/pricing/"),
    "s3_storage_gb_month": Price(
        0.023, "GB-month of S3 Standard (first 50 TB)", "https://aws.amazon.com/s3/pricing/"
    ),
    "cloudwatch_logs_gb": Price(
        0.50,
        "GB ingested (standard log class)",
        "https://aws.amazon.com/cloudwatch/pricing/ (outside the reference list; shown apart)",
    ),
}
"""Verified against stored copies of the pricing pages and price-cut announcements on
2026-11-21 (SQS, DynamoDB on-demand, Lambda, EventBridge Scheduler, Step Functions); S3 and
CloudWatch Logs as given in the public price lists."""


def price(name: str) -> float:
    """A unit price in dollars."""
    return PRICES[name].usd


# --- assumptions ---------------------------------------------------------------------------

SQS_RECEIVE_MAX: Final = 10
# A strongly consistent read of a key that is not there (a cancel marker that does not exist):
# the emitter checks every message, strongly consistent so that a cancel written before the
# check is seen (an eventually consistent read would cost half).
MISSING_KEY_RRU: Final = DDB_MISSING_KEY_RRU
# A pending-count update writes one small item (well under 1 KB): one write unit; the
# pending-count measurement bills them so (its write units equal its write calls).
PENDING_COUNT_WRU: Final = 1
SCHEDULER_SAFETY_S: Final = 10  # functions/scheduler/app.py: Deadline(safety_ms=10_000)


@dataclass(frozen=True)
class Assumptions:
    """What the model does not measure. Latencies are in-region p50 guesses for wall time
    spent waiting inside a handler (billed), not figures measured here."""

    ms_dynamodb_batch_write: float = scale.MS_DYNAMODB_BATCH_WRITE
    ms_dynamodb_get: float = scale.MS_DYNAMODB_GET
    ms_dynamodb_batch_get: float = scale.MS_DYNAMODB_BATCH_GET
    ms_dynamodb_query: float = scale.MS_DYNAMODB_QUERY
    ms_dynamodb_update: float = scale.MS_DYNAMODB_UPDATE
    ms_sqs_send_batch: float = scale.MS_SQS_SEND_BATCH
    ms_kafka_flush: float = scale.MS_KAFKA_FLUSH
    ms_lambda_api_call: float = 20.0  # CreateSchedule / StartExecution, one message per call
    # The emitter's SQS event source: mean messages per ReceiveMessage (at most 10) at
    # 100 M/day. Full receives when the queue releases ~1,000 messages a second.
    receive_batch_mean: float = 10.0
    # Messages per emitter invocation; None: the template's BatchSize (filled within its
    # batching window at 100 M/day).
    emitter_invocation_batch: float | None = None
    ms_sqs_receive: float = 10.0  # one ReceiveMessage by the event source (its own time)
    ms_lambda_invoke: float = 10.0  # event source -> function hand-over
    # Time from SQS release to the emitter's invocation start (poller latency). 0 = the hold
    # is charged in full (conservative).
    ms_poll_latency: float = 0.0
    # A Graviton core runs this Python as fast as the benchmark machine's core.
    arm_speed_vs_bench_core: float = 1.0
    # Cleanup: TTL removals reach it in stream batches of this size (template: 500, 5 s window).
    cleanup_batch: int = 500
    # Log bytes Lambda itself writes per invocation (START / END / REPORT lines).
    platform_log_bytes_per_invocation: int = 300
    # Extra storage per item that DynamoDB bills (index overhead).
    dynamodb_item_overhead_bytes: int = 100
    # Alternatives.
    reenqueue_memory_mb: int = 512
    reenqueue_period_s: int = 900
    step_functions_transitions: int = 2  # Wait, then a Task that invokes the producer Lambda
    per_message_function_memory_mb: int = 128
    per_message_function_ms: float = 25.0  # cold-ish producer + flush, one message per call


def gb_second_price(fc: FunctionConfig) -> float:
    """The Lambda duration price for the template's architecture."""
    return price("lambda_gb_second_arm64" if fc.architecture == "arm64" else "lambda_gb_second_x86")


def cpu_wall_ms(cpu_ms: float, memory_mb: int, assumptions: Assumptions) -> float:
    """Wall time a CPU-bound stretch takes in a function of ``memory_mb`` (a fraction of a
    vCPU below 1,769 MB)."""
    return cpu_ms / assumptions.arm_speed_vs_bench_core / vcpu_share(memory_mb)


# --- measured inputs -----------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredInputs:
    """What the benchmarks measured and the model uses."""

    # Requests per message (API calls), per path, from bench.calls summaries.
    short: Mapping[str, Any]
    long: Mapping[str, Any]
    mix: Mapping[str, Any]
    # CPU ms per invocation on the benchmark machine (bench.cpu / bench.handlers).
    ingest_cpu_ms_per_batch: float
    ingest_batch: float
    emitter_cpu_ms_per_batch: float
    emitter_batch: float
    scheduler_cpu_ms_per_second: float
    ingest_log_bytes: float
    emitter_log_bytes: float
    item_bytes: int
    lead_ms: int
    max_hold_ms: int
    # Pending-count write units per message for the workload's delay mix in ingest batches of
    # the template's size (bench.calls.measure_pending_counts). The per-path runs above put
    # each batch's delays in a few seconds (so the scheduler covers them in one run), so
    # their pending counts touch one item a batch: the model replaces those with this.
    pending_wru: float


def stored_item_bytes(value: bytes | None = None) -> int:
    """The size of the DynamoDB item ingest writes for one workload message (its value: the
    workload's JSON order event unless given)."""
    request = delay_request(123_456_789, NOW_MS + 3_600_000, value)
    return item_size(message_item(request, 16, 86_400))


def locator_item_bytes() -> int:
    """The size of the locator item the id index (``IdIndex=1``) adds for one message."""
    return item_size(locator_item(delay_request(123_456_789, NOW_MS + 3_600_000), 16, 86_400))


def id_index_usd_per_message(workload: Workload, a: Assumptions, ttl_grace_s: int) -> float:
    """What ``IdIndex=1`` adds per message: its locator's write and storage (it lives as long
    as the message: until due plus the TTL grace)."""
    wru = write_units(locator_item_bytes())
    days = (
        workload.long_share * _storage_days_per_long_message(workload, ttl_grace_s, False)
        + workload.short_share * ttl_grace_s / DAY_SECONDS
    )
    gb = (locator_item_bytes() + a.dynamodb_item_overhead_bytes) / 1e9
    return wru * price("dynamodb_wru") + days * gb * price("dynamodb_storage_gb_month") / 30.4


# A capped burst as the cost row prices it: a release cap of this many messages a second, ingest
# batches of this many records, and emitter batches holding this many messages of one second.
CAPPED_RATE: Final = 1000
CAPPED_INGEST_BATCH: Final = 500
CAPPED_EMITTER_BATCH: Final = 10


def placement_wru_per_message(batch: int = CAPPED_INGEST_BATCH) -> float:
    """Write units of the placements ingest writes for a batch of capped messages released
    after their due second (``store.placement_items``), per message."""
    due_ms = NOW_MS + 3_600_000
    capped = [
        replace(delay_request(n, due_ms), release_ms=due_ms + 1000 * (1 + n // CAPPED_RATE))
        for n in range(batch)
    ]
    items = placement_items(capped, 86_400)
    return sum(write_units(item_size(i)) for i in items) / batch


def capped_usd_per_message() -> float:
    """What a release cap (strict) adds per message, at most: its placement, ingest's slot
    claim (one counter update per batch and second it spans) and the emitter's late-count
    read (one strongly consistent read per batch and second it holds)."""
    seconds_per_batch = math.ceil(CAPPED_INGEST_BATCH / CAPPED_RATE) + 1
    wru = placement_wru_per_message() + seconds_per_batch / CAPPED_INGEST_BATCH
    rru = 1 / CAPPED_EMITTER_BATCH
    return wru * price("dynamodb_wru") + rru * price("dynamodb_rru")


def incompressible_value(size: int = VALUE_BYTES) -> bytes:
    """A value zlib cannot shrink (random bytes: encrypted or already compressed data)."""
    return random_bytes(123_456_789, size)


def largest_incompressible_value_in_one_wru() -> int:
    """The largest incompressible value (bytes) whose stored item still costs one write unit."""
    low, high = 0, VALUE_BYTES
    while low < high:
        mid = (low + high + 1) // 2
        if write_units(stored_item_bytes(incompressible_value(mid))) <= 1:
            low = mid
        else:
            high = mid - 1
    return low


@cache
def emitter_hold_ms(
    lead_ms: int, batch: float, max_hold_ms: int, poll_latency_ms: float, draws: int = 200_000
) -> float:
    """Mean time an emitter invocation holds its batch before the last message is due.

    SQS delays are whole seconds: ``queue_delay_seconds`` (the layer's rounding) releases a
    message between ``lead`` and ``lead + 1 s`` before due. A batch of ``batch`` messages
    visible together waits for the latest due among them (Monte Carlo over random send times
    and due times, with the layer's own rounding function).
    """
    rng = random.Random(3)
    k = max(1, round(batch))
    samples = max(200, draws // k)
    total = 0.0
    for _ in range(samples):
        early = []
        for _ in range(k):
            sent = NOW_MS + rng.randrange(1000)
            due = sent + 60_000 + rng.randrange(60_000)
            release = sent + buckets.queue_delay_seconds(due, sent, lead_ms) * 1000
            e = due - release - poll_latency_ms
            if e <= max_hold_ms:  # earlier ones are re-delayed, not held
                early.append(max(0.0, e))
        total += max(early, default=0.0)
    return total / samples


# --- the model -----------------------------------------------------------------------------


@dataclass
class CostLine:
    """One line of a bill: dollars per million messages and how it was derived."""

    component: str
    usd_per_million: float
    detail: str


@dataclass
class DesignCost:
    """A design's bill per million messages, line by line."""

    name: str
    lines: list[CostLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outside_list: list[CostLine] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Dollars per million messages (lines in the reference price list)."""
        return sum(line.usd_per_million for line in self.lines)

    def add(self, component: str, usd_per_message: float, detail: str) -> None:
        """Add a line given in dollars per message."""
        self.lines.append(CostLine(component, usd_per_message * 1e6, detail))

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return {
            "usd_per_million": round(self.total, 4),
            "lines": [asdict(line) for line in self.lines],
            "outside_price_list": [asdict(line) for line in self.outside_list],
            "notes": self.notes,
        }


def _lambda_line(
    cost: DesignCost, fc: FunctionConfig, use: tuple[str, float, float, int], detail: str
) -> None:
    """Duration and request lines of one function: ``use`` is (function, invocations per
    message, billed ms per invocation, memory MB)."""
    function, invocations_per_message, ms_per_invocation, memory_mb = use
    gb_s = ms_per_invocation / 1000 * memory_mb / 1024
    cost.add(
        f"Lambda {function} (duration)",
        invocations_per_message * gb_s * gb_second_price(fc),
        f"{invocations_per_message:.4f} inv/msg x {ms_per_invocation:.1f} ms x {memory_mb} MB; "
        + detail,
    )
    cost.add(
        f"Lambda {function} (requests)",
        invocations_per_message * price("lambda_request"),
        f"{invocations_per_message:.4f} invocations per message",
    )


def _per(summary: Mapping[str, Any], key: str) -> float:
    return float(summary["by_operation"].get(key, 0.0))


def _storage_days_per_long_message(workload: Workload, ttl_grace_s: int, delete: bool) -> float:
    """Mean days a long message's item is billed: until due (+ the TTL grace unless deleted)."""
    long_bands = [b for b in workload.bands if b.max_s > workload.horizon_seconds]
    share = sum(b.share for b in long_bands)
    mean_delay = sum(b.share * b.mean_s for b in long_bands) / share
    return (mean_delay + (0 if delete else ttl_grace_s)) / DAY_SECONDS


def this_design(
    m: MeasuredInputs,
    workload: Workload,
    fc: FunctionConfig,
    a: Assumptions,
    *,
    explicit_delete: bool = False,
    ttl_grace_s: int = 86_400,
) -> DesignCost:
    """The product as built (watermark + TTL), or with an explicit delete after scheduling."""
    name = "this design + explicit delete" if explicit_delete else "this design"
    cost = DesignCost(name)
    _queues_and_table(
        cost, m, workload, fc, a, explicit_delete=explicit_delete, ttl_grace_s=ttl_grace_s
    )
    _functions(cost, m, workload, fc, a, explicit_delete=explicit_delete)
    return cost


def emitter_batch(
    fc: FunctionConfig,
    a: Assumptions,
    per_queue_message: float = 1.0,
    per_second: float | None = None,
) -> float:
    """Messages per emitter invocation: the assumption if set, else the template's BatchSize
    in SQS messages times the delay messages each carries (bundles, measured), at most what
    arrives within the batching window at ``per_second`` (a batch of at most 10 is one
    receive, so it is also capped by the receive size)."""
    batch = a.emitter_invocation_batch or float(fc.emitter_batch_size) * per_queue_message
    if per_second and fc.emitter_batching_window_s > 0 and a.emitter_invocation_batch is None:
        batch = min(
            batch, max(float(fc.emitter_batch_size), per_second * fc.emitter_batching_window_s)
        )
    if batch <= SQS_RECEIVE_MAX:
        batch = min(batch, a.receive_batch_mean)
    return batch


def measured_emitter_batch(
    m: MeasuredInputs, workload: Workload, fc: FunctionConfig, a: Assumptions
) -> float:
    """:func:`emitter_batch` with the mix's measured messages per SQS message."""
    per_queue_message = float(m.mix.get("messages_per_queue_message", 1.0))
    return emitter_batch(fc, a, per_queue_message, workload.per_second)


def _queues_and_table(
    cost: DesignCost,
    m: MeasuredInputs,
    workload: Workload,
    fc: FunctionConfig,
    a: Assumptions,
    *,
    explicit_delete: bool,
    ttl_grace_s: int,
) -> None:
    """SQS and DynamoDB lines of this design."""
    short, long_ = workload.short_share, workload.long_share
    s, lg = m.short, m.long
    # SQS: sends (ingest or scheduler) + the event source's receives and deletes, measured
    # in billed requests (one per 64 KiB chunk of a call's payload) with bundles. Receives are
    # measured full (10 SQS messages a call); fewer per receive costs more (sensitivity).
    rb = min(SQS_RECEIVE_MAX, a.receive_batch_mean)
    billed = short * float(s["sqs_billed_requests"]) + long_ * float(lg["sqs_billed_requests"])
    calls = {
        op: short * _per(s, f"sqs.{op}") + long_ * _per(lg, f"sqs.{op}")
        for op in ("SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch")
    }
    # Fewer SQS messages per receive: more receive calls, each at least one chunk.
    billed += calls["ReceiveMessage"] * (SQS_RECEIVE_MAX / rb - 1)
    per_bundle = float(m.mix.get("messages_per_queue_message", 1.0))
    cost.add(
        "SQS delay queue",
        billed * price("sqs_standard_request"),
        f"{billed:.4f} billed requests per message (64 KiB chunks, measured): "
        f"{calls['SendMessageBatch']:.4f} SendMessageBatch + {calls['ReceiveMessage']:.4f} "
        f"ReceiveMessage + {calls['DeleteMessageBatch']:.4f} DeleteMessageBatch calls; "
        f"{per_bundle:.1f} messages per SQS message (bundles), {rb:g} SQS messages per receive",
    )
    ticks_per_day = DAY_SECONDS / 60
    msgs_per_day = workload.messages_per_day
    cost.add(
        "SQS FIFO tick queue",
        ticks_per_day * 3 / msgs_per_day * price("sqs_fifo_request"),
        "1 send + 1 receive + 1 delete per minute",
    )

    # DynamoDB writes: measured request units; the pending counts on a line of their own.
    path_pending = {
        name: _stage(summary, "ingest", "dynamodb.UpdateItem") * PENDING_COUNT_WRU
        for name, summary in (("short", s), ("long", lg))
    }
    wru_long = float(lg["dynamodb_wru"]) - path_pending["long"]
    wru_short = float(s["dynamodb_wru"]) - path_pending["short"]
    item_wru = write_units(m.item_bytes)
    delete_wru = item_wru if explicit_delete else 0
    wru = short * wru_short + long_ * (wru_long + delete_wru)
    cost.add(
        "DynamoDB writes",
        wru * price("dynamodb_wru"),
        f"{wru_long:.3f} WRU per long message measured (item of a 1 KB JSON order event: "
        f"{m.item_bytes} B = {item_wru} WRU"
        + (f", + {delete_wru} WRU delete" if explicit_delete else "")
        + f"; watermark and statistics), {wru_short:.3f} per short (emitter statistics)",
    )
    cost.add(
        "DynamoDB pending counts",
        m.pending_wru * price("dynamodb_wru"),
        f"{m.pending_wru:.3f} WRU per message measured for the delay mix in ingest batches of "
        f"{fc.ingest_batch_size} (PendingCounts=1; 0 turns them off)",
    )
    rru = short * float(s["dynamodb_rru"]) + long_ * float(lg["dynamodb_rru"])
    cost.add(
        "DynamoDB reads",
        rru * price("dynamodb_rru"),
        f"{float(lg['dynamodb_rru']):.3f} RRU per long message, {float(s['dynamodb_rru']):.3f} "
        f"per short (measured; strongly consistent cancel-marker BatchGetItem, 1 RRU per key "
        f"found or not, by "
        + ("the scheduler and the emitter" if scheduler_reads_cancel_markers(m) else "the emitter")
        + ")",
    )
    days = _storage_days_per_long_message(workload, ttl_grace_s, explicit_delete)
    gb_per_message_day = (m.item_bytes + a.dynamodb_item_overhead_bytes) / 1e9
    storage = long_ * days * gb_per_message_day * price("dynamodb_storage_gb_month") / 30.4
    cost.add(
        "DynamoDB storage",
        storage,
        f"{m.item_bytes + a.dynamodb_item_overhead_bytes} B per item for {days:.2f} days mean "
        + (
            "(deleted at scheduling)"
            if explicit_delete
            else f"(due + {ttl_grace_s // 3600} h TTL grace)"
        ),
    )


def _functions(
    cost: DesignCost,
    m: MeasuredInputs,
    workload: Workload,
    fc: FunctionConfig,
    a: Assumptions,
    *,
    explicit_delete: bool,
) -> None:
    """Lambda lines of this design, and what falls outside the reference price list."""
    long_ = workload.long_share
    lg = m.long
    ticks_per_day = DAY_SECONDS / 60
    msgs_per_day = workload.messages_per_day
    # Lambda: ingest.
    ingest_io = (
        _per_invocation(m.mix, "ingest", "dynamodb.BatchWriteItem") * a.ms_dynamodb_batch_write
        + _per_invocation(m.mix, "ingest", "dynamodb.GetItem") * a.ms_dynamodb_get
        + _per_invocation(m.mix, "ingest", "sqs.SendMessageBatch") * a.ms_sqs_send_batch
    )
    ingest_cpu = cpu_wall_ms(m.ingest_cpu_ms_per_batch, fc.memory_mb["ingest"], a)
    _lambda_line(
        cost,
        fc,
        ("ingest", 1 / m.ingest_batch, ingest_cpu + ingest_io, fc.memory_mb["ingest"]),
        f"CPU {m.ingest_cpu_ms_per_batch:.2f} ms measured -> {ingest_cpu:.1f} ms at "
        f"{fc.memory_mb['ingest']} MB; I/O {ingest_io:.0f} ms (sequential calls x assumed latency)",
    )

    # Lambda: scheduler (per due-second of long messages).
    per_second = workload.long_per_second
    sends_per_second = _per(lg, "sqs.SendMessageBatch") * per_second
    gets_per_second = _stage(lg, "scheduler", "dynamodb.BatchGetItem") * per_second
    sched_io_per_second = (
        sends_per_second * a.ms_sqs_send_batch
        + gets_per_second * a.ms_dynamodb_batch_get
        + a.ms_dynamodb_query  # shards are queried in parallel
        + a.ms_dynamodb_update
    )
    sched_cpu = cpu_wall_ms(m.scheduler_cpu_ms_per_second, fc.memory_mb["scheduler"], a)
    sched_ms_per_second = sched_cpu + sched_io_per_second
    usable_ms = (fc.timeout_s["scheduler"] - SCHEDULER_SAFETY_S) * 1000
    keeps_up = usable_ms / sched_ms_per_second
    tick_s = 60
    other_ms = sched_ms_per_second - sends_per_second * a.ms_sqs_send_batch
    break_even = (usable_ms / tick_s - other_ms) / sends_per_second
    cost.notes.append(
        f"scheduler throughput: {sched_ms_per_second:.0f} ms of work per due-second at "
        f"{per_second:.0f} messages/s, so one tick ({fc.timeout_s['scheduler']} s timeout, "
        f"{SCHEDULER_SAFETY_S} s safety) covers {keeps_up:.0f} due-seconds; it must cover "
        f"{tick_s} "
        + ("(keeps up)" if keeps_up >= tick_s else "(FALLS BEHIND: the watermark lag grows)")
        + f"; it keeps up only while a SendMessageBatch takes under {break_even:.1f} ms "
        f"(assumed {a.ms_sqs_send_batch:g} ms each)"
    )
    cost.add(
        "Lambda scheduler (duration)",
        long_
        * (sched_ms_per_second / 1000 * fc.memory_mb["scheduler"] / 1024)
        * gb_second_price(fc)
        / per_second,
        f"{sched_ms_per_second:.0f} ms per due-second of {per_second:.0f} messages "
        f"(CPU {sched_cpu:.0f} ms, {sends_per_second:.0f} SendMessageBatch)",
    )
    cost.add(
        "Lambda scheduler + timer (requests)",
        2 * ticks_per_day / msgs_per_day * price("lambda_request"),
        "one timer and one scheduler invocation per minute",
    )

    # Lambda: emitter. The hold dominates: SQS releases lead..lead+1 s early.
    rb_emit = measured_emitter_batch(m, workload, fc, a)
    hold = emitter_hold_ms(m.lead_ms, rb_emit, m.max_hold_ms, a.ms_poll_latency)
    emit_cpu = cpu_wall_ms(
        m.emitter_cpu_ms_per_batch * rb_emit / m.emitter_batch, fc.memory_mb["emitter"], a
    )
    emit_ms = max(hold, emit_cpu + a.ms_dynamodb_batch_get) + a.ms_kafka_flush
    _lambda_line(
        cost,
        fc,
        ("emitter", 1 / rb_emit, emit_ms, fc.memory_mb["emitter"]),
        f"hold {hold:.0f} ms (lead {m.lead_ms} ms + whole-second rounding, the latest due of "
        f"a batch of {rb_emit:g}; the batching window is not subtracted) + Kafka flush "
        f"{a.ms_kafka_flush:g} ms; CPU {emit_cpu:.1f} ms runs inside the hold",
    )

    # Lambda: cleanup (TTL removals of every stored message; not with an explicit delete).
    if not explicit_delete:
        per_record_cpu = m.scheduler_cpu_ms_per_second / per_second
        cleanup_ms = (
            cpu_wall_ms(per_record_cpu * a.cleanup_batch, fc.memory_mb["cleanup"], a)
            + a.ms_dynamodb_get
        )
        _lambda_line(
            cost,
            fc,
            ("cleanup", long_ / a.cleanup_batch, cleanup_ms, fc.memory_mb["cleanup"]),
            f"every stored message comes back as a TTL removal; batches of {a.cleanup_batch}; "
            f"per-record CPU taken as the scheduler's ({per_record_cpu * 1000:.0f} us)",
        )
    else:
        cost.notes.append(
            "explicit delete: the TTL safety net (cleanup) sees no TTL removals of scheduled "
            "items, so its invocations disappear; the delete is a BatchWriteItem DeleteRequest "
            "(25 a call) costing the item's size in WRU"
        )

    # Outside the reference price list: CloudWatch Logs ingestion of what the functions print.
    log_bytes = (m.ingest_log_bytes + a.platform_log_bytes_per_invocation) / m.ingest_batch + (
        m.emitter_log_bytes + a.platform_log_bytes_per_invocation
    ) / rb_emit
    cost.outside_list.append(
        CostLine(
            "CloudWatch Logs ingestion",
            log_bytes / 1e9 * price("cloudwatch_logs_gb") * 1e6,
            f"{log_bytes:.0f} B per message (Powertools EMF + logs measured, "
            f"{a.platform_log_bytes_per_invocation} B Lambda platform lines assumed)",
        )
    )
    cost.notes.append(
        "not in the model: MSK (the target cluster exists anyway), data transfer (in-region), "
        "idle SQS long polling (about 5 pollers x 3 receives a minute per queue: cents a day)"
    )


def _stage(summary: Mapping[str, Any], stage: str, key: str) -> float:
    return float(summary["by_stage"].get(stage, {}).get(key, 0.0))


def scheduler_reads_cancel_markers(m: MeasuredInputs) -> bool:
    """Whether the measured scheduler still reads cancel markers (``BatchGetItem``)."""
    return _stage(m.long, "scheduler", "dynamodb.BatchGetItem") > 0


def _per_invocation(summary: Mapping[str, Any], stage: str, key: str) -> float:
    """Calls of ``key`` per invocation of ``stage`` (measured on the mixed workload)."""
    inv = float(summary["invocations_per_message"].get(stage, 0))
    return _stage(summary, stage, key) / inv if inv else 0.0


def _mean_hops(workload: Workload, period_s: int) -> float:
    """Mean number of SQS passes when a message is re-enqueued every ``period_s``: one per
    started period of its delay (at least one)."""
    total = 0.0
    for band in workload.bands:
        steps = 2000
        width = (band.max_s - band.min_s) / steps
        hops = sum(
            max(1, math.ceil((band.min_s + (i + 0.5) * width) / period_s)) for i in range(steps)
        )
        total += band.share * hops / steps
    return total


def sqs_reenqueue(
    m: MeasuredInputs, workload: Workload, fc: FunctionConfig, a: Assumptions
) -> DesignCost:
    """SQS only: each message passes through the queue once per 15 minutes of its delay
    (receive, not due yet, send again with DelaySeconds 900, delete), then the emitter."""
    cost = DesignCost("SQS-only re-enqueue every 15 min")
    hops = _mean_hops(workload, a.reenqueue_period_s)
    rb = min(SQS_RECEIVE_MAX, a.receive_batch_mean)
    per_hop_requests = 3 / rb  # (re-)send what one receive got, receive, delete batch
    cost.add(
        "SQS",
        hops * per_hop_requests * price("sqs_standard_request"),
        f"{hops:.1f} passes per message (mean) x {per_hop_requests:.2f} requests "
        "(batched send, receive, delete)",
    )
    relay_ms = (
        cpu_wall_ms(m.emitter_cpu_ms_per_batch, a.reenqueue_memory_mb, a) + a.ms_sqs_send_batch
    )
    _lambda_line(
        cost,
        fc,
        ("re-enqueue", (hops - 1) / rb, relay_ms, a.reenqueue_memory_mb),
        "one invocation per received batch that is not due yet (CPU ~ the emitter's, + one send)",
    )
    batch = emitter_batch(fc, a)
    hold = emitter_hold_ms(m.lead_ms, batch, m.max_hold_ms, a.ms_poll_latency)
    emit_cpu = cpu_wall_ms(
        m.emitter_cpu_ms_per_batch * batch / m.emitter_batch, fc.memory_mb["emitter"], a
    )
    emit_ms = max(hold, emit_cpu) + a.ms_kafka_flush
    _lambda_line(
        cost, fc, ("emitter", 1 / batch, emit_ms, fc.memory_mb["emitter"]), "as this design"
    )
    ingest_ms = cpu_wall_ms(m.ingest_cpu_ms_per_batch, fc.memory_mb["ingest"], a) + (
        m.ingest_batch / 10 * a.ms_sqs_send_batch
    )
    _lambda_line(cost, fc, ("ingest", 1 / m.ingest_batch, ingest_ms, fc.memory_mb["ingest"]), "")
    cost.notes.append("no DynamoDB; cancel and 'what is pending' are not possible without one")
    return cost


def eventbridge_scheduler(
    m: MeasuredInputs, workload: Workload, fc: FunctionConfig, a: Assumptions
) -> DesignCost:
    """One EventBridge Scheduler one-time schedule per message, targeting a producer Lambda."""
    cost = DesignCost("EventBridge Scheduler, one schedule per message")
    cost.add(
        "EventBridge Scheduler",
        price("eventbridge_scheduler_invocation"),
        "one invocation per message (CreateSchedule is not charged; ActionAfterCompletion=DELETE)",
    )
    _per_message_functions(
        cost,
        m,
        fc,
        a,
        ingest_detail=f"one CreateSchedule call per record ({a.ms_lambda_api_call:g} ms), "
        "no batch API",
        producer_detail="one invocation per message (Scheduler has no Kafka target)",
    )
    cost.notes.append(
        "precision: one-time schedules fire within about a minute of their time; the default "
        "quota of 1 M schedules per account is far below the ~2 x 10^8 pending at 100 M/day"
    )
    return cost


def _per_message_functions(
    cost: DesignCost,
    m: MeasuredInputs,
    fc: FunctionConfig,
    a: Assumptions,
    *,
    ingest_detail: str,
    producer_detail: str,
) -> None:
    """The two Lambda functions of a one-resource-per-message alternative: an ingest that
    makes one API call per record, and a producer invoked once per message."""
    ingest_ms = cpu_wall_ms(m.ingest_cpu_ms_per_batch, fc.memory_mb["ingest"], a) + (
        m.ingest_batch * a.ms_lambda_api_call
    )
    _lambda_line(
        cost,
        fc,
        ("ingest", 1 / m.ingest_batch, ingest_ms, fc.memory_mb["ingest"]),
        ingest_detail,
    )
    _lambda_line(
        cost,
        fc,
        ("producer", 1.0, a.per_message_function_ms, a.per_message_function_memory_mb),
        producer_detail,
    )


def step_functions(
    m: MeasuredInputs, workload: Workload, fc: FunctionConfig, a: Assumptions
) -> DesignCost:
    """One Standard workflow execution per message: a Wait state, then a Task that produces."""
    cost = DesignCost("Step Functions, one Wait per message")
    cost.add(
        "Step Functions state transitions",
        a.step_functions_transitions * price("step_functions_transition"),
        f"{a.step_functions_transitions} transitions per message (Wait, Task)",
    )
    _per_message_functions(
        cost,
        m,
        fc,
        a,
        ingest_detail=f"one StartExecution per record ({a.ms_lambda_api_call:g} ms)",
        producer_detail="the Task's Lambda, one message per invocation",
    )
    cost.notes.append(
        "open executions are capped (1 M per account by default): ~2 x 10^8 would be pending"
    )
    return cost


# Days an offloaded payload is kept, for the default maximum delay of 7 days (template Mappings
# PayloadRetention; tests/template checks it): no function deletes a payload, so every copy of
# its message (duplicates, retries, dead letters, a capped tenant's spread) finds it.
PAYLOAD_RETENTION_DAYS: Final = 38
DAYS_PER_MONTH: Final = 30.42


def offloaded_payload(value_bytes: int, deliveries: float = 1.0) -> dict[str, Any]:
    """What one message whose value goes through the S3 claim-check adds, per million: a PUT
    at ingest, a GET per delivery, and the object's storage until the lifecycle rule
    expires it (the retention, whatever the delay)."""
    gb = value_bytes / 2**30
    storage = gb * price("s3_storage_gb_month") * PAYLOAD_RETENTION_DAYS / DAYS_PER_MONTH
    requests = price("s3_put") + deliveries * price("s3_get")
    return {
        "value_bytes": value_bytes,
        "retention_days": PAYLOAD_RETENTION_DAYS,
        "usd_per_million": round((storage + requests) * 1e6, 4),
        "storage_usd_per_million": round(storage * 1e6, 4),
        "requests_usd_per_million": round(requests * 1e6, 4),
    }


@dataclass
class CostModel:
    """Every design, with the inputs and assumptions they were computed from."""

    workload: Workload
    measured: MeasuredInputs
    assumptions: Assumptions
    functions: FunctionConfig
    designs: dict[str, DesignCost]
    sensitivity: list[dict[str, Any]]

    def headline(self) -> dict[str, float]:
        """``cost_usd_per_million`` of bench.json."""
        return {key: round(d.total, 4) for key, d in self.designs.items()}

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return {
            **self.headline(),
            "target": {"this_design": 0.75, "met": self.designs["this_design"].total <= 0.75},
            "workload": self.workload.describe(),
            "prices_as_of": PRICES_AS_OF,
            "prices": {k: asdict(v) for k, v in PRICES.items()},
            "assumptions": asdict(self.assumptions),
            "functions": {
                "memory_mb": dict(self.functions.memory_mb),
                "architecture": self.functions.architecture,
                "emitter_batch_size": self.functions.emitter_batch_size,
                "emitter_batching_window_s": self.functions.emitter_batching_window_s,
                "emitter_max_concurrency": self.functions.emitter_max_concurrency,
                "source": self.functions.source,
            },
            "measured_inputs": {
                k: v for k, v in asdict(self.measured).items() if k not in ("short", "long")
            },
            "designs": {k: d.as_dict() for k, d in self.designs.items()},
            "sensitivity": self.sensitivity,
            # On top of this design's figure, for each message whose value is offloaded.
            "offloaded_payload": [offloaded_payload(size) for size in (256 * 1024, 2**20)],
        }


def build(
    m: MeasuredInputs,
    workload: Workload = REFERENCE_MIX,
    functions: FunctionConfig | None = None,
    assumptions: Assumptions | None = None,
) -> CostModel:
    """All five designs plus a sensitivity table for this design."""
    fc = functions or deployed()
    a = assumptions or Assumptions()
    designs = {
        "this_design": this_design(m, workload, fc, a),
        "explicit_delete": this_design(m, workload, fc, a, explicit_delete=True),
        "sqs_reenqueue": sqs_reenqueue(m, workload, fc, a),
        "eventbridge_scheduler": eventbridge_scheduler(m, workload, fc, a),
        "step_functions": step_functions(m, workload, fc, a),
    }
    base = designs["this_design"].total
    sensitivity: list[dict[str, Any]] = []

    def variant(label: str, **kw: Any) -> None:
        fc_v = kw.pop("functions", fc)
        a_v = kw.pop("assumptions", a)
        m_v = kw.pop("measured", m)
        total = this_design(m_v, workload, fc_v, a_v).total + kw.pop("added_usd", 0.0)
        sensitivity.append(
            {"variant": label, "usd_per_million": round(total, 4), "delta": round(total - base, 4)}
        )

    for mb in (128, 256, 512, 1024):
        if mb == fc.memory_mb["emitter"]:
            continue
        variant(
            f"emitter memory {mb} MB",
            functions=replace(fc, memory_mb={**fc.memory_mb, "emitter": mb}),
        )
    for lead in (0, 500, 1000, 1500):
        if lead != m.lead_ms:
            variant(f"emit lead {lead} ms", measured=replace(m, lead_ms=lead))
    for rb in (5.0, 2.0):
        variant(
            f"{rb:g} messages per SQS receive (not 10)",
            assumptions=replace(a, receive_batch_mean=rb),
        )
    if fc.emitter_batch_size != 10:
        variant(
            "emitter BatchSize 10, no batching window",
            assumptions=replace(a, emitter_invocation_batch=10.0),
        )
    else:
        variant(
            "emitter BatchSize 100, batching window 1 s",
            assumptions=replace(a, emitter_invocation_batch=100.0),
        )
    wru_long = float(m.long["dynamodb_wru"])
    raw_bytes = stored_item_bytes(incompressible_value())
    variant(
        f"incompressible 1 KB values (random bytes): item {raw_bytes} B = "
        f"{write_units(raw_bytes)} WRU",
        measured=replace(
            m,
            item_bytes=raw_bytes,
            long={
                **m.long,
                "dynamodb_wru": wru_long - write_units(m.item_bytes) + write_units(raw_bytes),
            },
        ),
    )
    rru_short, rru_long = float(m.short["dynamodb_rru"]), float(m.long["dynamodb_rru"])
    if scheduler_reads_cancel_markers(m):
        variant(
            "without the scheduler's cancel-marker read (emitter's only)",
            measured=replace(m, long={**m.long, "dynamodb_rru": rru_long - MISSING_KEY_RRU}),
        )
    variant("PendingCounts=0 (no pending counts)", measured=replace(m, pending_wru=0.0))
    variant(
        f"IdIndex=1 (a {locator_item_bytes()} B locator per message: by-id operations)",
        added_usd=id_index_usd_per_message(workload, a, 86_400) * 1e6,
    )
    variant(
        f"every message under a strict release cap ({CAPPED_RATE}/s: placement "
        f"{placement_wru_per_message():.3f} WRU, slot claims, late-count reads)",
        added_usd=capped_usd_per_message() * 1e6,
    )
    for share in CONTROL_SHARES:
        reads = marker_reads_per_message(workload, share, c.DEFAULT_SHARDS)
        variant(
            f"a cancel or reschedule for {share:.1%} of messages: {reads:.2f} marker reads "
            f"per message (their buckets' clocks pass the messages' records) and one clock "
            f"raise per control",
            measured=replace(
                m,
                short={**m.short, "dynamodb_rru": rru_short + reads * MISSING_KEY_RRU},
                long={**m.long, "dynamodb_rru": rru_long + reads * MISSING_KEY_RRU},
            ),
            added_usd=share * price("dynamodb_wru") * 1e6,
        )
    return CostModel(workload, m, a, fc, designs, sensitivity)


# Shares of messages that get a cancel or a reschedule, for the sensitivity rows.
CONTROL_SHARES: Final = (0.001, 0.01)


def marker_reads_per_message(workload: Workload, control_share: float, shards: int) -> float:
    """Marker reads per delivered message when ``control_share`` of messages get a control,
    spread evenly over the day: a message reads its marker when some control of an id in its
    clock bucket (``shards`` x 96 buckets) is written during its delay, probability
    ``1 - exp(-rate x delay)`` with the bucket's control rate; averaged over each band's
    uniform delays."""
    buckets_total = shards * control_clock.BUCKETS_PER_SHARD
    rate = control_share * workload.per_second / buckets_total
    total = 0.0
    for band in workload.bands:
        lo, hi = band.min_s, band.max_s
        # The mean of 1 - exp(-rate x d) for d uniform in [lo, hi).
        mean = 1 - (math.exp(-rate * lo) - math.exp(-rate * hi)) / (rate * (hi - lo))
        total += band.share * mean
    return total
