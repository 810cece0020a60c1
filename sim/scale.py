"""The pipeline at AWS scale on the simulator's clock: messages move as counted cohorts.

The handler-level simulation (:mod:`sim.pipeline`) runs the real code, about 40 us per
simulated AWS call: fine for thousands of messages, not for a 10 M burst. This model runs on
the same :class:`sim.world.World` (its clock, event queue and seeded random source) but moves
messages in aggregates: a cohort is ``count`` messages of one tenant and priority sharing a due
time and a release time. Bystanders travel one message per cohort, so their lateness
distribution (p50/p99/max) is counted message by message, not derived from a formula.

What each stage does, and which documented AWS limit bounds it (the constants below, each with
its page; checked November 2026):

* **ingest**: the delay topic's event source runs one invocation per partition at a time; each
  takes the measured CPU of a batch (at its memory's vCPU share) plus its DynamoDB calls. A
  due-second's items go to ``shards`` keys (``<second>#<shard>``), each partition taking
  1,000 WCU a second, and the table as a whole takes its warm throughput at once (a new
  on-demand table: 4,000 write units a second, more when pre-warmed). A capped tenant's
  messages get release slots here, at most ``cap`` per second from their due second on
  (:mod:`delayq.shaping`), and are stored by release second (a placement pair, ~0.04 write
  units, for each stored away from its due second).
* **scheduler**: one run per tick (the timer's minute fires somewhere within the minute: the
  seed draws where), up to its timeout less a safety margin; round by round it reads a page of
  every shard (``QUERY_CHUNK_SECONDS`` seconds at a time while seconds are light), sends the
  round in full bundles ``send_workers`` SendMessageBatch calls at a time, records its cursor,
  and pays the measured scheduler CPU per message. Strongly consistent Queries: 3,000 RCU of
  4 KB per partition.
* **delay queues** (one per priority): SQS ``DelaySeconds`` is whole seconds, rounded so a
  message becomes visible at or before its release time less the emit lead.
* **event sources**: standard mode starts 5 concurrent batches and adds up to 300 a minute
  while messages wait, up to ``MaximumConcurrency`` (at most 1,000); provisioned mode keeps
  ``MinimumPollers`` ready (10 concurrent invocations and about 1 MB/s each) and adds 1,000
  concurrent invocations a minute up to ``MaximumPollers``. Each source gathers up to its
  batch size (SQS messages, each a bundle of delay messages) or waits its batching window.
  Every emitter invocation counts against the account's concurrency, shared with ingest and
  the scheduler.
* **emitter**: receives (10 messages per ReceiveMessage) and hand-over, the control-clock
  read (one BatchGetItem of every shard's clock, strongly consistent: one read unit on each
  ``clock#<shard>`` partition, which every emitter shares; the traffic holds no cancels, so no
  marker is read, ``delayq.control_clock``; the seals of a release second, one write and one
  read per shard by its first batch, are left out), holds to the release time, then the
  measured CPU per
  message at its vCPU share and one flush; messages of a batch leave in order, so lateness
  within a batch grows message by message.

What is not modelled: throttling and retries (the limits are respected, not exceeded), DynamoDB
adaptive capacity beyond warm throughput, cold starts, failures. The figures are simulated,
not measured in AWS.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from delayq import constants as c
from delayq.scheduler import QUERY_CHUNK_SECONDS
from sim.world import World

# --- documented AWS limits ---------------------------------------------------------------------

# DynamoDB: each partition serves 1,000 write units and 3,000 read units a second; a new
# on-demand table serves 4,000 write units a second at once (its warm throughput).
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html
DDB_PARTITION_WCU: Final = 1000
DDB_PARTITION_RCU: Final = 3000
DDB_NEW_ON_DEMAND_TABLE_WRU: Final = 4000
# A capped message's placement: a [sort key, offset] pair in an item its ingest batch shares
# with the others of its due second and id group (64 groups): a batch of 500 writes up to 64
# small items, one write unit each (bench.cost.placement_wru_per_message measures it).
PLACEMENT_WRU: Final = 64 / 500
# One RCU is one strongly consistent read of up to 4 KB (the scheduler's Queries are; the
# emitter's read of a shard's control clock, an item under 1 KB, costs one); a strongly
# consistent read of a key that is absent costs one read unit too.
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html
DDB_RCU_BYTES: Final = 4096
DDB_MISSING_KEY_RRU: Final = 1.0
# Lambda's SQS event source, standard mode: 5 concurrent batches to start, up to 300 more a
# minute, at most 1,000 at once; ScalingConfig.MaximumConcurrency is 2 to 1,000.
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
# https://docs.aws.amazon.com/lambda/latest/dg/API_ScalingConfig.html
SQS_STANDARD_START_CONCURRENCY: Final = 5
SQS_STANDARD_SCALE_PER_MINUTE: Final = 300
SQS_STANDARD_MAX_CONCURRENCY: Final = 1000
# Provisioned mode: each event poller serves up to 10 concurrent invocations and about 1 MB/s;
# scaling adds up to 1,000 concurrent invocations a minute, up to 20,000;
# MinimumPollers is at most 200 (ProvisionedPollerConfig).
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
# https://aws.amazon.com/blogs/aws/aws-lambda-enhances-sqs-processing-with-new-provisioned-mode-3x-faster-scaling-16x-higher-capacity
# https://docs.aws.amazon.com/lambda/latest/api/API_ProvisionedPollerConfig.html
SQS_POLLER_INVOCATIONS: Final = 10
SQS_POLLER_BYTES_PER_SECOND: Final = 1_000_000
SQS_PROVISIONED_SCALE_PER_MINUTE: Final = 1000
SQS_PROVISIONED_MAX_CONCURRENCY: Final = 20_000
SQS_PROVISIONED_MIN_POLLERS_MAX: Final = 200
# ReceiveMessage returns at most 10 messages.
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html
SQS_RECEIVE_MAX_MESSAGES: Final = 10
SQS_MAX_DELAY_SECONDS: Final = 900
# Lambda: 1,000 concurrent executions per Region by default (a quota increase raises it); a
# function gets one vCPU at 1,769 MB, a share below.
# https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
# https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html
LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY: Final = 1000
LAMBDA_FULL_VCPU_MB: Final = 1769
# Kafka event sources: one concurrent invocation per partition; a provisioned event poller
# moves about 5 MB/s.
# https://docs.aws.amazon.com/lambda/latest/dg/with-msk.html
# https://docs.aws.amazon.com/lambda/latest/api/API_ProvisionedPollerConfig.html
KAFKA_INVOCATIONS_PER_PARTITION: Final = 1
KAFKA_POLLER_BYTES_PER_SECOND: Final = 5_000_000
# Ingest writes a batch of 100 records in 4 BatchWriteItem calls of 25, plus one read.
INGEST_BATCH: Final = 100

PRIORITIES: Final = ("high", "normal", "low")
# What binds an event source while messages wait (sampled each second).
BOUND_SCALE_OUT: Final = "scale-out"
BOUND_CEILING: Final = "ceiling"
BOUND_ACCOUNT: Final = "account concurrency"
BOUND_POLLER_BYTES: Final = "poller throughput"
BOUND_CLOCKS: Final = "control-clock reads"
BOUND_WINDOW: Final = "batching window (the queue fills slower than a batch)"
# What bound the scheduler's crowded rounds.
SCHEDULER_CPU: Final = "cpu"
SCHEDULER_SENDS: Final = "sends"
SCHEDULER_READS: Final = "reads"
# Where a message's lateness was spent.
LATE_SCHEDULER: Final = "scheduler"
LATE_SOURCE: Final = "event source"
LATE_EMITTER: Final = "emitter"
LATE_CLOCKS: Final = "control-clock reads"
LATE_TARGET: Final = "target cluster"
# A chunk that waits longer than this for the target cluster is held back by it.
CLUSTER_WAIT_MS: Final = 1.0
STEP_MS: Final = 1000  # scaling and ingest advance a second at a time


def vcpu_share(memory_mb: int) -> float:
    """Lambda allocates CPU in proportion to memory: one vCPU at 1,769 MB."""
    return min(1.0, memory_mb / LAMBDA_FULL_VCPU_MB)


# --- inputs ------------------------------------------------------------------------------------

# In-region p50 wall time of one call inside a handler, in ms: assumptions, not measured here
# (the cost model bills them too: ``bench.cost.Assumptions``).
MS_DYNAMODB_BATCH_WRITE: Final = 8.0
MS_DYNAMODB_GET: Final = 4.0
MS_DYNAMODB_BATCH_GET: Final = 6.0
MS_DYNAMODB_QUERY: Final = 6.0
MS_DYNAMODB_UPDATE: Final = 5.0
MS_SQS_SEND_BATCH: Final = 10.0
MS_KAFKA_FLUSH: Final = 10.0  # acks=all round trip to the cluster for one batch


@dataclass(frozen=True)
class Costs:
    """Measured CPU (benchmark core, per message or batch) and per-call latencies (in-region
    p50 assumptions, ``bench.cost.Assumptions``)."""

    ingest_cpu_ms_per_batch: float
    scheduler_cpu_ms_per_message: float
    emitter_cpu_ms_per_message: float
    ms_dynamodb_batch_write: float = MS_DYNAMODB_BATCH_WRITE
    ms_dynamodb_get: float = MS_DYNAMODB_GET
    ms_dynamodb_batch_get: float = MS_DYNAMODB_BATCH_GET
    ms_dynamodb_query: float = MS_DYNAMODB_QUERY
    ms_dynamodb_update: float = MS_DYNAMODB_UPDATE
    ms_sqs_send_batch: float = MS_SQS_SEND_BATCH
    ms_sqs_receive: float = 10.0
    ms_lambda_invoke: float = 10.0
    ms_kafka_flush: float = MS_KAFKA_FLUSH
    arm_speed_vs_bench_core: float = 1.0


@dataclass(frozen=True)
class EventSource:
    """One delay queue's SQS event source. ``minimum_pollers`` 0: standard mode, bounded by
    ``max_concurrency``; otherwise provisioned mode between the two poller counts."""

    max_concurrency: int = SQS_STANDARD_MAX_CONCURRENCY
    minimum_pollers: int = 0
    maximum_pollers: int = 200
    batch_size: int = 100
    window_ms: int = 1000
    start_concurrency: int = SQS_STANDARD_START_CONCURRENCY

    @property
    def provisioned(self) -> bool:
        """Provisioned mode (dedicated pollers)."""
        return self.minimum_pollers > 0

    @property
    def ceiling(self) -> int:
        """The most concurrent invocations the source ever runs."""
        if self.provisioned:
            return min(
                SQS_PROVISIONED_MAX_CONCURRENCY, self.maximum_pollers * SQS_POLLER_INVOCATIONS
            )
        return min(SQS_STANDARD_MAX_CONCURRENCY, self.max_concurrency)

    @property
    def initial(self) -> int:
        """Concurrent invocations when the burst arrives."""
        if self.provisioned:
            return min(self.ceiling, self.minimum_pollers * SQS_POLLER_INVOCATIONS)
        return min(self.ceiling, max(SQS_STANDARD_START_CONCURRENCY, self.start_concurrency))

    @property
    def scale_per_second(self) -> float:
        """Concurrent invocations added per second while messages wait."""
        per_minute = (
            SQS_PROVISIONED_SCALE_PER_MINUTE if self.provisioned else SQS_STANDARD_SCALE_PER_MINUTE
        )
        return per_minute / 60


# The target cluster: what the burst's records go to. A stated input, not measured: three
# Express brokers of the largest size, each taking up to 500 MBps of ingress (AWS News Blog,
# "Introducing Express brokers for Amazon MSK", 2024; the Express best-practices page lists
# each size's recommended ingress). A record on the wire: its value and key, its user headers
# and the delay headers the emitter adds.
# https://aws.amazon.com/blogs/aws/introducing-express-brokers-for-amazon-msk-to-deliver-high-throughput-and-faster-scaling-for-your-kafka-clusters/
# https://docs.aws.amazon.com/msk/latest/developerguide/bestpractices-express.html
TARGET_BROKER_TYPE: Final = "express.m7g.16xlarge"
TARGET_BROKER_INGRESS_MBPS: Final = 500.0
RECORD_OVERHEAD_BYTES: Final = 160


@dataclass(frozen=True)
class TargetCluster:
    """The cluster the emitters produce to: ``brokers`` taking ``ingress_mbps`` each."""

    brokers: int = 3
    broker_type: str = TARGET_BROKER_TYPE
    ingress_mbps: float = TARGET_BROKER_INGRESS_MBPS

    @property
    def bytes_per_ms(self) -> float:
        """What the cluster accepts, bytes a millisecond."""
        return self.brokers * self.ingress_mbps * 1e6 / 1000

    def seconds_for(self, messages: int, record_bytes: int) -> float:
        """How long the cluster needs to accept ``messages`` records, at the least."""
        return messages * record_bytes / self.bytes_per_ms / 1000


@dataclass(frozen=True)
class Deployment:
    """The deployed settings the model needs (template parameters and layer settings)."""

    shards: int = c.DEFAULT_SHARDS
    page_items: int = c.DEFAULT_SCHEDULER_PAGE_ITEMS
    lookahead_s: int = c.DEFAULT_LOOKAHEAD_SECONDS
    tick_s: int = c.DEFAULT_TICK_SECONDS
    emit_lead_ms: int = c.DEFAULT_EMIT_LEAD_MS
    bundle_max_messages: int = c.DEFAULT_BUNDLE_MAX_MESSAGES
    bundle_max_bytes: int = c.DEFAULT_BUNDLE_MAX_BYTES
    send_workers: int = 8
    scheduler_safety_s: int = 10
    delay_topic_partitions: int = 64
    ingest_pollers: int | None = None  # Kafka provisioned pollers; None: on-demand
    table_warm_write_units: int = DDB_NEW_ON_DEMAND_TABLE_WRU
    account_concurrency: int = LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY
    memory_mb: Mapping[str, int] = field(
        default_factory=lambda: {"ingest": 512, "scheduler": 1769, "emitter": 256}
    )
    scheduler_timeout_s: int = 60
    sources: Mapping[str, EventSource] = field(
        default_factory=lambda: {p: EventSource() for p in PRIORITIES}
    )
    target: TargetCluster = field(default_factory=TargetCluster)


@dataclass(frozen=True)
class Traffic:
    """A burst of one tenant due in one second, and another tenant's steady traffic due from
    that second on (written before the burst, as steady traffic due during a burst mostly is).
    """

    burst_messages: int
    value_bytes: int = 1024
    burst_priority: str = "normal"
    burst_cap_per_second: int | None = None
    bystander_rate: float = 0.0
    bystander_seconds: int = 60
    written_before_due_s: int = 3600
    item_bytes: int = 722  # the stored item (measured)
    wru_per_item: int = 1

    @property
    def body_bytes(self) -> int:
        """An envelope in the delay queue: the value in base64 and ~150 B of fields."""
        return math.ceil(self.value_bytes * 4 / 3) + 150

    @property
    def record_bytes(self) -> int:
        """A record the emitter produces to the target cluster."""
        return self.value_bytes + RECORD_OVERHEAD_BYTES


# --- the model ---------------------------------------------------------------------------------

BURST: Final = "burst"
BYSTANDER: Final = "bystander"


@dataclass
class _Cohort:
    """``count`` messages of one class, due and released at the same times."""

    cls: str
    priority: str
    due_ms: int
    release_ms: int
    count: int


@dataclass
class _Chunk:
    """A cohort's share of the delay queue, in bundles of ``per_bundle``."""

    cohort: _Cohort
    count: int
    per_bundle: int
    visible_ms: int

    @property
    def sqs_messages(self) -> int:
        return math.ceil(self.count / self.per_bundle)


@dataclass
class Lateness:
    """Weighted samples (milliseconds, messages)."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, ms: float, count: int) -> None:
        """``count`` messages this late."""
        if count > 0:
            self.samples.append((ms, count))

    @property
    def count(self) -> int:
        """Messages recorded."""
        return sum(n for _, n in self.samples)

    def percentile(self, p: float) -> float | None:
        """The smallest lateness at or above which ``p`` % of the messages lie."""
        total = self.count
        if not total:
            return None
        need = p / 100 * total
        seen = 0
        for ms, n in sorted(self.samples):
            seen += n
            if seen >= need:
                return ms
        return max(ms for ms, _ in self.samples)

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and max, rounded to the millisecond."""
        out = {"p50": self.percentile(50), "p99": self.percentile(99), "max": self.percentile(100)}
        return {k: None if v is None else round(v) for k, v in out.items()}


@dataclass
class SourceFigures:
    """What one event source did."""

    priority: str
    mode: str
    ceiling: int
    invocations: int = 0
    messages: int = 0
    peak_concurrency: int = 0
    final_scaled: float = 0.0
    bound_seconds: Counter[str] = field(default_factory=Counter)

    @property
    def bound_by(self) -> str | None:
        """What held it back longest while messages waited (None: nothing did)."""
        return self.bound_seconds.most_common(1)[0][0] if self.bound_seconds else None


@dataclass
class StageFigures:
    """A stage's span on the clock (relative to the burst's due time) and what bound it."""

    name: str
    messages: int
    started_s: float | None
    finished_s: float | None
    messages_per_second: float
    bound_by: str


@dataclass
class ScaleRun:
    """The outcome of one run: lateness per class and what each stage did."""

    seed: int
    traffic: Traffic
    due_ms: int
    lateness_from_release: dict[str, Lateness]
    lateness_after_due: dict[str, Lateness]
    stages: list[StageFigures]
    sources: dict[str, SourceFigures]
    scheduler_runs: int
    scheduler_rounds: int
    max_released_per_second: int
    peak_account_concurrency: int
    last_burst_emit_ms: int | None
    delivered: Counter[str]
    late_by: dict[str, Counter[str]]
    scheduler_bound: str | None
    target_cluster_seconds: float = 0.0

    def late_mostly_in(self, cls: str) -> str | None:
        """The stage where the class's messages spent most of their lateness."""
        spent = self.late_by.get(cls)
        if not spent or not sum(spent.values()):
            return None
        return spent.most_common(1)[0][0]

    @property
    def drain_seconds_after_due(self) -> float | None:
        """When the burst's last message left, after its due time."""
        if self.last_burst_emit_ms is None:
            return None
        return (self.last_burst_emit_ms - self.due_ms) / 1000

    def stage(self, name: str) -> StageFigures:
        """The stage of that name."""
        return next(s for s in self.stages if s.name == name)


class _Queue:
    """A delay queue: chunks by the time they become visible."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, _Chunk]] = []
        self._seq = itertools.count()

    def put(self, visible_ms: int, chunk: _Chunk) -> None:
        heapq.heappush(self.heap, (visible_ms, next(self._seq), chunk))

    def visible_since(self, now_ms: int) -> int | None:
        """When the oldest visible message became visible (None: none is)."""
        return self.heap[0][0] if self.heap and self.heap[0][0] <= now_ms else None

    def take(self, now_ms: int, sqs_messages: int) -> list[_Chunk]:
        """Up to ``sqs_messages`` visible SQS messages, oldest first."""
        out: list[_Chunk] = []
        left = sqs_messages
        while left > 0 and self.heap and self.heap[0][0] <= now_ms:
            visible, seq, chunk = heapq.heappop(self.heap)
            if chunk.sqs_messages <= left:
                out.append(chunk)
                left -= chunk.sqs_messages
                continue
            n = left * chunk.per_bundle
            out.append(_Chunk(chunk.cohort, n, chunk.per_bundle, chunk.visible_ms))
            chunk.count -= n
            heapq.heappush(self.heap, (visible, seq, chunk))
            left = 0
        return out

    def visible_messages(self, now_ms: int, enough: int) -> int:
        """Visible SQS messages, counted up to ``enough``."""
        total = 0
        for visible, _, chunk in heapq.nsmallest(enough, self.heap):
            if visible > now_ms or total >= enough:
                break
            total += chunk.sqs_messages
        return total


class _Source:
    """An event source's state: scaled concurrency, invocations in flight, poller bytes."""

    def __init__(self, priority: str, config: EventSource) -> None:
        self.priority = priority
        self.config = config
        self.queue = _Queue()
        self.scaled = float(config.initial)
        self.in_flight = 0
        self.bytes_left = self._byte_budget()
        self.pump_at: int | None = None
        self.figures = SourceFigures(
            priority, "provisioned" if config.provisioned else "standard", config.ceiling
        )

    def _byte_budget(self) -> float:
        if not self.config.provisioned:
            return math.inf
        pollers = math.ceil(self.scaled / SQS_POLLER_INVOCATIONS)
        return pollers * SQS_POLLER_BYTES_PER_SECOND * STEP_MS / 1000


class ScaleModel:
    """One run of the pipeline at AWS scale on a :class:`World`."""

    def __init__(
        self, deployment: Deployment, costs: Costs, traffic: Traffic, *, seed: int = 0
    ) -> None:
        self.d = deployment
        self.c = costs
        self.t = traffic
        self.world = World(seed=seed, now_ms=0)
        self.due_ms = traffic.written_before_due_s * 1000
        body = traffic.body_bytes
        self.per_bundle = max(
            1, min(deployment.bundle_max_messages, deployment.bundle_max_bytes // body)
        )
        self.sources = {p: _Source(p, deployment.sources[p]) for p in PRIORITIES}
        self.stored: dict[int, list[_Cohort]] = defaultdict(list)  # release second -> cohorts
        self.kafka: list[_Cohort] = []  # the delay topic's backlog, in order
        self.slots: Counter[int] = Counter()  # capped tenant's releases per second
        self.from_release: dict[str, Lateness] = defaultdict(Lateness)
        self.after_due: dict[str, Lateness] = defaultdict(Lateness)
        self.delivered: Counter[str] = Counter()
        self.late_by: dict[str, Counter[str]] = defaultdict(Counter)
        self.total = 0
        self.scheduler_busy = False
        self.scheduler_runs = 0
        self.scheduler_rounds = 0
        self.longest_round_ms = 0.0
        self.ingest_running = 0
        self.peak_account = 0
        self.last_burst_emit: int | None = None
        self.ingest_first: int | None = None
        self.ingest_last: int | None = None
        self.ingest_bound: Counter[str] = Counter()
        self.sched_first: int | None = None
        self.sched_last: int | None = None
        self.sched_bound: Counter[str] = Counter()
        self.sched_round_ms = 0.0
        self.sched_text: dict[str, str] = {}
        self.queued_first: int | None = None
        # The control clocks' partitions, read once by every emitter invocation: when they are
        # next free (each serves DDB_PARTITION_RCU reads a second).
        self.clocks_free_at = 0.0
        self.clocks_throttled_at: int | None = None
        self.clock_reads_per_ms = DDB_PARTITION_RCU / 1000
        # The target cluster, shared by every emitter: when it next takes a record.
        self.cluster_free_at = 0.0
        self.record_ms = self.t.record_bytes / deployment.target.bytes_per_ms

    # --- traffic -------------------------------------------------------------------------------

    def _write_traffic(self) -> None:
        """Bystanders first (written earlier), then the burst, all on the delay topic now."""
        t = self.t
        rng = self.world.rng
        n = int(t.bystander_rate * t.bystander_seconds)
        for _ in range(n):
            due = self.due_ms + rng.randrange(t.bystander_seconds * 1000)
            self.kafka.append(_Cohort(BYSTANDER, "normal", due, due, 1))
        self.kafka.sort(key=lambda c: c.due_ms)
        self.kafka.append(
            _Cohort(BURST, t.burst_priority, self.due_ms, self.due_ms, t.burst_messages)
        )
        self.total = n + t.burst_messages

    # --- ingest --------------------------------------------------------------------------------

    def ingest_rates(self) -> dict[str, float]:
        """Messages a second each limit lets ingest write."""
        d, c, t = self.d, self.c, self.t
        batch_ms = (
            c.ingest_cpu_ms_per_batch
            / c.arm_speed_vs_bench_core
            / vcpu_share(d.memory_mb["ingest"])
            + math.ceil(INGEST_BATCH / 25) * c.ms_dynamodb_batch_write
            + c.ms_dynamodb_get
        )
        rates = {
            f"ingest concurrency ({d.delay_topic_partitions} partitions x {INGEST_BATCH} per "
            f"{batch_ms:.0f} ms)": math.inf
            if batch_ms <= 0
            else d.delay_topic_partitions
            * KAFKA_INVOCATIONS_PER_PARTITION
            * INGEST_BATCH
            / (batch_ms / 1000),
            f"DynamoDB table warm throughput ({d.table_warm_write_units:,} WRU/s; "
            "TableWarmWriteUnitsPerSecond lifts it)": d.table_warm_write_units / t.wru_per_item,
        }
        if d.ingest_pollers:
            rates[f"Kafka provisioned pollers ({d.ingest_pollers} x 5 MB/s)"] = (
                d.ingest_pollers * KAFKA_POLLER_BYTES_PER_SECOND / (t.value_bytes + 100)
            )
        return rates

    def _ingest_step(self) -> None:
        """One second of ingest: write what the limits allow, by due (or release) second."""
        now = self.world.now_ms
        if not self.kafka:
            self.ingest_running = 0
            return
        rates = self.ingest_rates()
        budget = min(rates.values())
        per_key = self.d.shards * DDB_PARTITION_WCU / self.t.wru_per_item
        per_second_written: Counter[int] = Counter()
        self.ingest_running = self.d.delay_topic_partitions
        self.ingest_first = now if self.ingest_first is None else self.ingest_first
        key_bound = False
        while self.kafka and budget >= 1:
            cohort = self.kafka[0]
            cap = self.t.burst_cap_per_second if cohort.cls == BURST else None
            second = self._release_second(cohort, cap)
            room = per_key - per_second_written[second]
            # A message stored away from its due second also writes its placement (a pair in
            # an item of its batch, another partition key: the table's throughput only).
            units = 1 + (PLACEMENT_WRU if second != cohort.due_ms // 1000 else 0)
            n = int(min(cohort.count, budget / units, room))
            if cap is not None:
                n = min(n, cap - self.slots[second])
            if n <= 0:
                key_bound = True
                break
            release = max(cohort.due_ms, second * 1000)
            self.stored[second].append(
                _Cohort(cohort.cls, cohort.priority, cohort.due_ms, release, n)
            )
            if cap is not None:
                self.slots[second] += n
            per_second_written[second] += n
            budget -= n * units
            cohort.count -= n
            if cohort.count == 0:
                self.kafka.pop(0)
        if self.kafka:
            if key_bound:
                self.ingest_bound[
                    f"DynamoDB partitions ({self.d.shards} shards x {DDB_PARTITION_WCU} WCU / "
                    f"{self.t.wru_per_item} WRU per item)"
                ] += 1
            else:
                self.ingest_bound[min(rates, key=lambda k: rates[k])] += 1
        self.ingest_last = now + STEP_MS
        self.world.at(now + STEP_MS, self._ingest_step)

    def _release_second(self, cohort: _Cohort, cap: int | None) -> int:
        """The first second from the cohort's due second with room under its cap."""
        second = cohort.due_ms // 1000
        if cap is None:
            return second
        while self.slots[second] >= cap:
            second += 1
        return second

    # --- scheduler -----------------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.world.now_ms
        self.world.at(now + self.d.tick_s * 1000, self._tick)
        if self.scheduler_busy or not self._pending_seconds(now):
            return
        self.scheduler_busy = True
        self.scheduler_runs += 1
        end = now + (self.d.scheduler_timeout_s - self.d.scheduler_safety_s) * 1000
        self._round(end)

    def _pending_seconds(self, now_ms: int) -> list[int]:
        limit = now_ms // 1000 + self.d.lookahead_s
        return sorted(s for s, cohorts in self.stored.items() if cohorts and s <= limit)

    def _round(self, end_ms: int) -> None:
        """Read a page of every shard (light seconds a chunk at a time), send, checkpoint."""
        now = self.world.now_ms
        seconds = self._pending_seconds(now)
        if not seconds or now + self.longest_round_ms > end_ms:
            self.scheduler_busy = False
            return
        d, c = self.d, self.c
        capacity = capacity_full = d.shards * d.page_items
        taken: list[_Cohort] = []
        first = seconds[0]
        for second in seconds:
            if second >= first + QUERY_CHUNK_SECONDS or capacity <= 0:
                break
            cohorts = self.stored[second]
            while cohorts and capacity > 0:
                cohort = cohorts[0]
                n = min(cohort.count, capacity)
                taken.append(
                    _Cohort(cohort.cls, cohort.priority, cohort.due_ms, cohort.release_ms, n)
                )
                cohort.count -= n
                capacity -= n
                if cohort.count == 0:
                    cohorts.pop(0)
            if not cohorts:
                del self.stored[second]
        n = sum(x.count for x in taken)
        bundles = sum(math.ceil(x.count / self.per_bundle) for x in taken)
        calls = math.ceil(bundles / SQS_RECEIVE_MAX_MESSAGES)
        cpu_ms = (
            c.scheduler_cpu_ms_per_message
            * n
            / c.arm_speed_vs_bench_core
            / vcpu_share(d.memory_mb["scheduler"])
        )
        work_ms = (
            c.ms_dynamodb_query
            + math.ceil(calls / d.send_workers) * c.ms_sqs_send_batch
            + c.ms_dynamodb_update
            + cpu_ms
        )
        read_ms = n * self.t.item_bytes / (d.shards * DDB_PARTITION_RCU * DDB_RCU_BYTES) * 1000
        round_ms = max(work_ms, read_ms)
        if n >= capacity_full:
            memory = d.memory_mb["scheduler"]
            parts = {
                SCHEDULER_CPU: cpu_ms,
                SCHEDULER_SENDS: work_ms - cpu_ms,
                SCHEDULER_READS: read_ms,
            }
            self.sched_bound[max(parts, key=lambda k: parts[k])] += 1
            self.sched_round_ms = round_ms
            self.sched_text = {
                SCHEDULER_CPU: f"its CPU, {cpu_ms:.0f} of {round_ms:.0f} ms per round of "
                f"{n:,} at {memory} MB ({vcpu_share(memory):.2f} vCPU)",
                SCHEDULER_SENDS: f"its sends, {calls} SendMessageBatch per round "
                f"{d.send_workers} at a time",
                SCHEDULER_READS: f"Query reads ({d.shards} partitions x {DDB_PARTITION_RCU:,} RCU)",
            }
        self.longest_round_ms = max(self.longest_round_ms, round_ms)
        self.scheduler_rounds += 1
        self.sched_first = now if self.sched_first is None else self.sched_first
        done = now + math.ceil(round_ms)

        def sent() -> None:
            self._send(taken)
            self.sched_last = self.world.now_ms
            self._round(end_ms)

        self.world.at(done, sent)

    def _send(self, cohorts: Sequence[_Cohort]) -> None:
        """The round reaches its delay queues, each with whole DelaySeconds."""
        now = self.world.now_ms
        lead = self.d.emit_lead_ms
        for cohort in cohorts:
            delay_s = min(SQS_MAX_DELAY_SECONDS, max(0, (cohort.release_ms - lead - now) // 1000))
            visible = now + delay_s * 1000
            source = self.sources[cohort.priority]
            source.queue.put(visible, _Chunk(cohort, cohort.count, self.per_bundle, visible))
            self._pump_at(source, visible)
        self.queued_first = now if self.queued_first is None else self.queued_first

    # --- event sources and the emitter ---------------------------------------------------------

    def _account_free(self) -> int:
        used = sum(s.in_flight for s in self.sources.values())
        used += self.ingest_running + (1 if self.scheduler_busy else 0)
        return self.d.account_concurrency - used

    def _pump_at(self, source: _Source, when_ms: int) -> None:
        if source.pump_at is not None and source.pump_at <= when_ms:
            return
        source.pump_at = when_ms
        self.world.at(when_ms, lambda: self._pump(source, when_ms))

    def _pump(self, source: _Source, scheduled: int | None = None) -> None:
        """Start invocations while the source's concurrency, the account and its pollers
        allow and a batch is ready (full, or its window has passed)."""
        if scheduled is not None:
            if source.pump_at != scheduled:
                return
            source.pump_at = None
        now = self.world.now_ms
        config = source.config
        while source.in_flight < math.floor(source.scaled) and self._account_free() > 0:
            oldest = source.queue.visible_since(now)
            if oldest is None:
                nxt = source.queue.heap[0][0] if source.queue.heap else None
                if nxt is not None:
                    self._pump_at(source, nxt)
                return
            if source.bytes_left <= 0:
                return  # the next scaling step refills the pollers' budget
            ready = source.queue.visible_messages(now, config.batch_size)
            if ready < config.batch_size and now < oldest + config.window_ms:
                self._pump_at(source, oldest + config.window_ms)
                return
            batch = source.queue.take(now, config.batch_size)
            source.bytes_left -= sum(ch.sqs_messages for ch in batch) * min(
                self.per_bundle * self.t.body_bytes, self.d.bundle_max_bytes
            )
            self._invoke(source, batch)

    def _invoke(self, source: _Source, batch: list[_Chunk]) -> None:
        d, c = self.d, self.c
        now = self.world.now_ms
        source.in_flight += 1
        used = d.account_concurrency - self._account_free()
        self.peak_account = max(self.peak_account, used)
        figures = source.figures
        figures.invocations += 1
        figures.peak_concurrency = max(figures.peak_concurrency, source.in_flight)
        n = sum(ch.count for ch in batch)
        figures.messages += n
        sqs_messages = sum(ch.sqs_messages for ch in batch)
        received = (
            now
            + math.ceil(sqs_messages / SQS_RECEIVE_MAX_MESSAGES) * c.ms_sqs_receive
            + c.ms_lambda_invoke
        )
        # The clock read shares the clock#<shard> partitions' read units with every other
        # emitter: past their rate, reads wait (throttled and retried) for their share.
        share = 1 / self.clock_reads_per_ms
        reads_start = max(received, self.clocks_free_at)
        self.clocks_free_at = reads_start + share
        unthrottled = received + c.ms_dynamodb_batch_get
        ready = max(unthrottled, self.clocks_free_at)
        read_wait = ready - unthrottled
        # Reads queued longer than a read takes: the pipeline runs at the clocks' rate, and a
        # message that waited in the queue meanwhile waited for them, not for an invocation.
        saturated = reads_start - received > c.ms_dynamodb_batch_get
        if saturated:
            self.clocks_throttled_at = now
        per_message = (
            c.emitter_cpu_ms_per_message
            / c.arm_speed_vs_bench_core
            / vcpu_share(d.memory_mb["emitter"])
        )
        # The emitter holds each message to its release time and produces them in that order,
        # as fast as its CPU and the target cluster's share left to it allow.
        cursor = float(ready)
        for chunk in sorted(batch, key=lambda ch: ch.cohort.release_ms):
            cursor = max(cursor, chunk.cohort.release_ms)
            start = max(cursor, self.cluster_free_at)
            # Waiting for the cluster: the pipeline runs at its rate, and a message that waited
            # in the queue meanwhile waited for it (the emitters it held), not for an invocation.
            cluster_bound = start - cursor > CLUSTER_WAIT_MS
            self.cluster_free_at = start + chunk.count * self.record_ms
            spacing = max(per_message, self.record_ms)
            self._record(chunk, start + c.ms_kafka_flush, spacing)
            self._attribute(
                chunk,
                now,
                start + chunk.count * spacing / 2 + c.ms_kafka_flush,
                read_wait,
                saturated=saturated,
                cluster_wait=start - cursor + chunk.count * (spacing - per_message) / 2,
                cluster_bound=cluster_bound,
            )
            cursor = start + chunk.count * spacing
        end = cursor + c.ms_kafka_flush

        def finished() -> None:
            source.in_flight -= 1
            self._pump(source)
            for other in self.sources.values():
                if other is not source:
                    self._pump(other)

        self.world.at(math.ceil(end), finished)

    def _record(self, chunk: _Chunk, base: float, per_message: float) -> None:
        """The chunk's messages leave one after another from ``base``: a few slices, each at
        its middle message's time."""
        cohort = chunk.cohort
        slices = min(chunk.count, 4)
        for i in range(slices):
            lo = chunk.count * i // slices
            hi = chunk.count * (i + 1) // slices
            at = base + ((lo + hi) / 2 + 0.5) * per_message
            self.from_release[cohort.cls].add(at - cohort.release_ms, hi - lo)
            self.after_due[cohort.cls].add(at - cohort.due_ms, hi - lo)
        self.delivered[cohort.cls] += chunk.count
        if cohort.cls == BURST:
            last = math.ceil(base + chunk.count * per_message)
            self.last_burst_emit = max(self.last_burst_emit or 0, last)

    def _attribute(
        self,
        chunk: _Chunk,
        started_ms: int,
        emitted_ms: float,
        read_wait: float,
        *,
        saturated: bool,
        cluster_wait: float = 0.0,
        cluster_bound: bool = False,
    ) -> None:
        """Where the chunk's lateness (emitted minus released) was spent: reaching the queue
        after its release less the lead (the scheduler), waiting for an invocation (the event
        source), waiting for the control clocks' read units, for the target cluster, or inside
        the emitter."""
        cohort = chunk.cohort
        late = max(0.0, emitted_ms - cohort.release_ms)
        wanted = cohort.release_ms - self.d.emit_lead_ms
        scheduler = min(late, max(0, chunk.visible_ms - wanted))
        source = min(late - scheduler, max(0, started_ms - max(chunk.visible_ms, wanted)))
        spent = self.late_by[cohort.cls]
        spent[LATE_SCHEDULER] += round(scheduler * chunk.count)
        clocks = min(late - scheduler - source, read_wait)
        cluster = min(late - scheduler - source - clocks, max(0.0, cluster_wait))
        emitter = late - scheduler - source - clocks - cluster
        if saturated:
            clocks, source = clocks + source, 0.0
        if cluster_bound:
            cluster, source = cluster + source, 0.0
        spent[LATE_SOURCE] += round(source * chunk.count)
        spent[LATE_CLOCKS] += round(clocks * chunk.count)
        spent[LATE_TARGET] += round(cluster * chunk.count)
        spent[LATE_EMITTER] += round(emitter * chunk.count)

    def _scale(self) -> None:
        """Each second: sources with waiting messages scale out; note what held each back."""
        now = self.world.now_ms
        self.world.at(now + STEP_MS, self._scale)
        for source in self.sources.values():
            config = source.config
            waiting = source.queue.visible_since(now) is not None
            if waiting:
                source.figures.bound_seconds[self._holding(source)] += 1
                if source.in_flight >= math.floor(source.scaled):
                    source.scaled = min(config.ceiling, source.scaled + config.scale_per_second)
            source.bytes_left = min(source.bytes_left, 0) + source._byte_budget()
            source.figures.final_scaled = source.scaled
            self._pump(source)

    def _holding(self, source: _Source) -> str:
        throttled = self.clocks_throttled_at
        if throttled is not None and self.world.now_ms - throttled < STEP_MS:
            return BOUND_CLOCKS
        if source.bytes_left <= 0:
            return BOUND_POLLER_BYTES
        if source.in_flight < math.floor(source.scaled):
            return BOUND_ACCOUNT if self._account_free() <= 0 else BOUND_WINDOW
        if source.scaled < source.config.ceiling:
            return BOUND_SCALE_OUT
        return BOUND_CEILING

    # --- the run -------------------------------------------------------------------------------

    def run(self, horizon_s: int = 6 * 3600) -> ScaleRun:
        """Until every message has left (or ``horizon_s`` after due)."""
        world = self.world
        self._write_traffic()
        world.at(0, self._ingest_step)
        world.at(world.rng.randrange(self.d.tick_s * 1000), self._tick)
        world.at(0, self._scale)
        limit = self.due_ms + horizon_s * 1000
        while sum(self.delivered.values()) < self.total and world.now_ms < limit:
            world.run_until(world.now_ms + 60_000)
        return ScaleRun(
            seed=world.seed,
            traffic=self.t,
            due_ms=self.due_ms,
            lateness_from_release=dict(self.from_release),
            lateness_after_due=dict(self.after_due),
            stages=self._stages(),
            sources={p: s.figures for p, s in self.sources.items()},
            scheduler_runs=self.scheduler_runs,
            scheduler_rounds=self.scheduler_rounds,
            max_released_per_second=max(self.slots.values(), default=0),
            peak_account_concurrency=self.peak_account,
            last_burst_emit_ms=self.last_burst_emit,
            delivered=Counter(self.delivered),
            late_by={k: Counter(v) for k, v in self.late_by.items()},
            scheduler_bound=self.sched_bound.most_common(1)[0][0] if self.sched_bound else None,
            target_cluster_seconds=self.d.target.seconds_for(self.total, self.t.record_bytes),
        )

    def _stages(self) -> list[StageFigures]:
        def rel(ms: int | None) -> float | None:
            return None if ms is None else round((ms - self.due_ms) / 1000, 1)

        def rate(first: int | None, last: int | None) -> float:
            if first is None or last is None or last <= first:
                return 0.0
            return self.total / ((last - first) / 1000)

        def top(counter: Counter[str]) -> str:
            return counter.most_common(1)[0][0] if counter else "-"

        emitted = [s.figures for s in self.sources.values() if s.figures.messages]
        emit_bound = "; ".join(
            f"{f.priority} queue ({f.mode}, up to {f.ceiling:,} concurrent): {f.bound_by or '-'}"
            for f in emitted
        )
        return [
            StageFigures(
                "ingest -> DynamoDB",
                self.total,
                rel(self.ingest_first),
                rel(self.ingest_last),
                rate(self.ingest_first, self.ingest_last),
                top(self.ingest_bound),
            ),
            StageFigures(
                "scheduler",
                self.total,
                rel(self.sched_first),
                rel(self.sched_last),
                rate(self.sched_first, self.sched_last),
                self.sched_text.get(top(self.sched_bound), "light seconds only")
                + f"; runs {self.d.scheduler_timeout_s - self.d.scheduler_safety_s} s of "
                f"every {self.d.tick_s} s tick from {self.d.lookahead_s} s before due",
            ),
            StageFigures(
                "emitter",
                sum(self.delivered.values()),
                rel(self.queued_first),
                rel(self.last_burst_emit),
                rate(self.due_ms, self.last_burst_emit),
                emit_bound,
            ),
        ]


def simulate(deployment: Deployment, costs: Costs, traffic: Traffic, *, seed: int = 0) -> ScaleRun:
    """One seeded run of the model."""
    return ScaleModel(deployment, costs, traffic, seed=seed).run()
