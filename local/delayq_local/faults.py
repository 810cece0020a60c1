"""Fault injection on the embedded stack: what the functions' environment does to them.

A `FaultPlan` (on `StackConfig.faults`) is a frozen description; `EmbeddedStack` installs it
before any handler runs (`ActiveFaults`) and removes it when it stops. Its pieces compose:

- `AwsFault`: one kind of failure (`Throttle`, `ServerError`, `PartialBatch`, `Crash`) on the
  calls a `Calls` selects (service, operations, functions, a seeded rate, a skip/limit budget, a
  time window). Injected at the client edge through botocore's events, on the boto3 default
  session, which only the handlers use (the stack's and the tests' clients have their own
  sessions). A client copies the session's event emitter when it is created, so the plan is
  installed before the handlers build their clients (on their first invocation). Each client
  is stamped with the function that built it (`creating-client-class`), so a fault can target
  one function, including calls made from its worker threads.
- `Crash`: an invocation dies between two calls (`RuntimeCrash`, which no `except Exception`
  in the layer can swallow); the local runtime reports a function error and replaces the
  execution environment, as Lambda does after a process exit.
- Timed faults, run by the demo harness from the start of the workload: `BrokerOutage`,
  `KafkaRequestErrors` (pushed on the mock cluster; `TOPIC_AUTHORIZATION_FAILED` on Produce makes
  the emitter's producer give up on records, `_TRANSPORT` drops its connection; retriable
  Produce error codes are refused, as the mock cannot model them for an idempotent producer),
  `PauseSource` (missed ticks), `ExtraTicks` and `RepeatedTicks` (duplicate ticks).
- `clock_skew_ms`: a function's handler module gets a clock off by that many milliseconds, through
  `delayq.clock.handler_clock`, the clock every handler takes when it is imported.

Never early under skew: the invariant is "never early (same clock)", and the reference clock is
the producing function's: the emitter's, or ingest's for what its direct path produces (due
within its window). Scheduler and cleanup skew must not make anything early in true time; a
producer whose clock is ahead delivers early in true time by exactly its error, which nothing in
the design can detect (the report's `early_received` shows it).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import boto3
from botocore.awsrequest import AWSResponse
from confluent_kafka import KafkaError

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock, system_clock
from delayq.kafka import Failure, classify
from delayq.settings import Settings
from delayq_local.exceptions import LocalStackError
from delayq_local.kafka_mock import ApiKey, MockKafkaCluster
from delayq_local.provision import ProvisionedResource
from delayq_local.sandbox import RuntimeCrash, attribute_clients, current_function
from delayq_local.sources import EventSource, ScheduleEventSource

log = logging.getLogger(__name__)

_DECISION: Final = "delayq_fault"


class Stack(Protocol):
    """What timed faults act on: the running stack (`Stack`)."""

    @property
    def mock_kafka(self) -> MockKafkaCluster | None:
        """The embedded mock cluster (None when the stack uses another cluster)."""

    def source(self, function_id: str, event: str | None = None) -> EventSource:
        """The event source wired to a function."""

    def client(self, service: str) -> Any:
        """A boto3 client on the stack's AWS endpoint."""

    def resource(self, logical_id: str) -> ProvisionedResource:
        """A provisioned resource by logical id."""


# Which calls -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calls:
    """The calls a fault applies to, and how many of them.

    `service` is botocore's service id (`sqs`, `dynamodb`, `s3`); empty `operations` or
    `functions` (logical ids) mean all. Of the matching calls, the first `skip` pass, then each
    is hit with probability `rate` (seeded), at most `limit` times, and only within `window`
    (seconds after the plan was installed).
    """

    service: str
    operations: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()
    rate: float = 1.0
    skip: int = 0
    limit: int | None = None
    window: tuple[float, float] | None = None

    def matches(self, function: str, service: str, operation: str) -> bool:
        """Whether a call is one of these (before the rate and the budget)."""
        return (
            service == self.service
            and (not self.operations or operation in self.operations)
            and (not self.functions or function in self.functions)
        )

    def describe(self) -> str:
        """`service:Op1+Op2@Function` for counters."""
        operations = "+".join(sorted(self.operations)) or "*"
        functions = "+".join(sorted(self.functions)) or "*"
        return f"{self.service}:{operations}@{functions}"


# What happens to them ----------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorReply:
    """An error answer in place of the call (botocore raises it as a `ClientError`)."""

    code: str
    status: int
    message: str = "injected fault"

    def parsed(self) -> dict[str, Any]:
        """The parsed error response, as botocore's parsers build it."""
        return {
            "Error": {"Code": self.code, "Message": self.message},
            "ResponseMetadata": {"HTTPStatusCode": self.status, "HTTPHeaders": {}},
        }


# Each service's name for "slow down" and "server error" (the status codes AWS sends with them).
THROTTLING: Final[Mapping[str, ErrorReply]] = {
    "dynamodb": ErrorReply("ProvisionedThroughputExceededException", 400),
    "sqs": ErrorReply("RequestThrottled", 400),
    "s3": ErrorReply("SlowDown", 503),
}
SERVER_ERRORS: Final[Mapping[str, ErrorReply]] = {
    "dynamodb": ErrorReply("InternalServerError", 500),
    "sqs": ErrorReply("InternalError", 500),
    "s3": ErrorReply("ServiceUnavailable", 503),
}


@dataclass(frozen=True)
class Throttle:
    """The service's throttling error instead of the call."""

    def reply(self, service: str) -> ErrorReply:
        """The error for `service`."""
        return THROTTLING[service]


@dataclass(frozen=True)
class ServerError:
    """The service's 5xx error instead of the call."""

    def reply(self, service: str) -> ErrorReply:
        """The error for `service`."""
        return SERVER_ERRORS[service]


@dataclass(frozen=True)
class PartialBatch:
    """A batch call that succeeds for some entries only: `share` of the entries (at least one)
    are taken out of the request, so they are really not sent, written or read, and reported
    as SQS `Failed[]`, DynamoDB `UnprocessedItems` or `UnprocessedKeys`."""

    share: float = 0.5


@dataclass(frozen=True)
class Crash:
    """The invocation dies at this call: after it was made (`after_call`), or instead of it."""

    after_call: bool = True


Action = Throttle | ServerError | PartialBatch | Crash


@dataclass(frozen=True)
class AwsFault:
    """An action on the calls `calls` selects."""

    action: Action
    calls: Calls

    @property
    def name(self) -> str:
        """The counter name: `<action> <calls>`."""
        return f"{type(self.action).__name__.lower()} {self.calls.describe()}"


def throttling_and_server_errors(
    services: Sequence[str] = ("sqs", "dynamodb", "s3"), rate: float = 0.1, limit: int = 40
) -> tuple[AwsFault, ...]:
    """Throttling and 5xx errors on every call of the handlers to `services`."""
    return tuple(
        AwsFault(action, Calls(service, rate=rate, limit=limit))
        for service in services
        for action in (Throttle(), ServerError())
    )


# Partial batches: where the entries are in the request, and where the failures go in the answer.


class _BatchShape(Protocol):
    def take(self, params: dict[str, Any], pick: Callable[[int], list[int]]) -> Any:
        """Remove the picked entries from `params` (in place); return what was removed."""

    def empty(self, params: Mapping[str, Any]) -> bool:
        """Whether nothing is left to send."""

    def report(self, parsed: dict[str, Any], removed: Any) -> None:
        """Add the removed entries to the parsed answer as failed."""


def _split(entries: Sequence[Any], pick: Callable[[int], list[int]]) -> tuple[list[Any], list[Any]]:
    chosen = set(pick(len(entries)))
    kept = [e for i, e in enumerate(entries) if i not in chosen]
    return kept, [e for i, e in enumerate(entries) if i in chosen]


class _SqsEntries:
    """SendMessageBatch / DeleteMessageBatch: `Entries` in, `Failed[]` out."""

    def take(self, params: dict[str, Any], pick: Callable[[int], list[int]]) -> Any:
        params["Entries"], removed = _split(params["Entries"], pick)
        return removed

    def empty(self, params: Mapping[str, Any]) -> bool:
        return not params["Entries"]

    def report(self, parsed: dict[str, Any], removed: Any) -> None:
        parsed.setdefault("Successful", [])
        parsed.setdefault("Failed", []).extend(
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "injected"}
            for e in removed
        )


class _DynamoWrites:
    """BatchWriteItem: `RequestItems` in, `UnprocessedItems` out."""

    def take(self, params: dict[str, Any], pick: Callable[[int], list[int]]) -> Any:
        kept: dict[str, list[Any]] = {}
        removed: dict[str, list[Any]] = {}
        for table, requests in params["RequestItems"].items():
            kept[table], removed[table] = _split(requests, pick)
        params["RequestItems"] = {t: r for t, r in kept.items() if r}
        return {t: r for t, r in removed.items() if r}

    def empty(self, params: Mapping[str, Any]) -> bool:
        return not params["RequestItems"]

    def report(self, parsed: dict[str, Any], removed: Any) -> None:
        unprocessed = parsed.setdefault("UnprocessedItems", {})
        for table, requests in removed.items():
            unprocessed.setdefault(table, []).extend(requests)


class _DynamoReads:
    """BatchGetItem: `RequestItems.<table>.Keys` in, `UnprocessedKeys` out."""

    def take(self, params: dict[str, Any], pick: Callable[[int], list[int]]) -> Any:
        kept: dict[str, Any] = {}
        removed: dict[str, Any] = {}
        for table, request in params["RequestItems"].items():
            keys, taken = _split(request["Keys"], pick)
            if keys:
                kept[table] = {**request, "Keys": keys}
            if taken:
                removed[table] = {**request, "Keys": taken}
        params["RequestItems"] = kept
        return removed

    def empty(self, params: Mapping[str, Any]) -> bool:
        return not params["RequestItems"]

    def report(self, parsed: dict[str, Any], removed: Any) -> None:
        parsed.setdefault("Responses", {})
        unprocessed = parsed.setdefault("UnprocessedKeys", {})
        for table, request in removed.items():
            unprocessed.setdefault(table, {**request, "Keys": []})["Keys"].extend(request["Keys"])


BATCH_SHAPES: Final[Mapping[tuple[str, str], _BatchShape]] = {
    ("sqs", "SendMessageBatch"): _SqsEntries(),
    ("sqs", "DeleteMessageBatch"): _SqsEntries(),
    ("dynamodb", "BatchWriteItem"): _DynamoWrites(),
    ("dynamodb", "BatchGetItem"): _DynamoReads(),
}


# Timed faults ------------------------------------------------------------------------------


class TimedFault(Protocol):
    """Something done to the stack at given seconds after the workload starts."""

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        """`(at seconds, counter name, action)`, in any order."""

    def restore(self, stack: Stack) -> None:
        """Undo whatever is still in effect (the run may end early)."""


def _faithful_produce_error(code: int) -> bool:
    """A dropped connection, or an error the layer's producer classifies as a refusal."""
    return code == KafkaError._TRANSPORT or classify(KafkaError(code)).failure is Failure.REFUSED


def _cluster(stack: Stack) -> MockKafkaCluster:
    if stack.mock_kafka is None:
        raise LocalStackError("Kafka faults need the embedded mock cluster")
    return stack.mock_kafka


@dataclass(frozen=True)
class BrokerOutage:
    """Every mock broker down at `at` seconds, up again `seconds` later."""

    at: float
    seconds: float

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        return [
            (self.at, "kafka brokers down", lambda s: _cluster(s).broker_down(-1)),
            (self.at + self.seconds, "kafka brokers up", self.restore),
        ]

    def restore(self, stack: Stack) -> None:
        if stack.mock_kafka is not None and stack.mock_kafka.running:
            stack.mock_kafka.broker_up(-1)


@dataclass(frozen=True)
class KafkaRequestErrors:
    """The mock cluster answers the next `len(errors)` requests of `api` with these codes
    (`confluent_kafka.KafkaError` values), from `at` seconds on. They hit any client: push
    Produce errors only once the workload is sent.

    On Produce, only errors the mock models faithfully for an idempotent producer are taken: a
    dropped connection (`_TRANSPORT`) or an error the producer gives up on (a refusal, such as
    `TOPIC_AUTHORIZATION_FAILED`). A retriable error code (`NOT_ENOUGH_REPLICAS`,
    `REQUEST_TIMED_OUT`, ...) is refused: the mock checks the sequence numbers of transactional
    producers only (rdkafka_mock.c), so the request in flight behind the failed one is
    appended where Kafka would refuse it (`OUT_OF_ORDER_SEQUENCE_NUMBER`), and librdkafka then
    reports a record as delivered that is not in the log -- a loss real Kafka cannot cause.
    """

    api: ApiKey
    errors: tuple[int, ...]
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.api != ApiKey.PRODUCE:
            return
        unfaithful = [code for code in self.errors if not _faithful_produce_error(code)]
        if unfaithful:
            names = ", ".join(KafkaError(code).name() for code in unfaithful)
            raise ValueError(
                f"Produce errors {names}: the mock cluster cannot model retriable Produce errors "
                "for an idempotent producer (it acknowledges records it never appended); use "
                "KafkaError._TRANSPORT (a dropped connection) or an error the producer gives up on"
            )

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        name = f"kafka {self.api.name.lower()} errors pushed"

        def push(stack: Stack) -> None:
            _cluster(stack).push_request_errors(self.api, self.errors)

        return [(self.at, name, push)]

    def restore(self, stack: Stack) -> None:
        """Pushed errors are consumed by requests; nothing to undo."""


@dataclass(frozen=True)
class PauseSource:
    """Pause a function's event source (the timer's: its rule disabled, ticks missed) at `at`
    seconds, resume it `seconds` later."""

    function: str
    at: float
    seconds: float

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        return [
            (self.at, f"{self.function} paused", lambda s: s.source(self.function).pause()),
            (self.at + self.seconds, f"{self.function} resumed", self.restore),
        ]

    def restore(self, stack: Stack) -> None:
        stack.source(self.function).resume()


@dataclass(frozen=True)
class ExtraTicks:
    """The schedule fires the timer once more every `every` seconds from `start` to `stop`
    (EventBridge may deliver a scheduled event twice)."""

    every: float
    start: float
    stop: float
    function: str = "TimerFunction"

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        def fire(stack: Stack) -> None:
            source = stack.source(self.function)
            if not isinstance(source, ScheduleEventSource):
                raise LocalStackError(f"{self.function} is not driven by a schedule")
            source.fire_now()

        return [(t, "extra timer firings", fire) for t in _times(self.start, self.stop, self.every)]

    def restore(self, stack: Stack) -> None:
        """Nothing stays in effect."""


@dataclass(frozen=True)
class RepeatedTicks:
    """A second tick message for the current period every `every` seconds from `start` to
    `stop`, under a de-duplication id of its own (what FIFO lets through after its 5-minute
    window, or from a second timer): the scheduler runs again for a window it has done."""

    every: float
    start: float
    stop: float
    queue: str = "TickQueue"

    def events(self) -> list[tuple[float, str, Callable[[Stack], None]]]:
        numbers = itertools.count(1)

        def send(stack: Stack) -> None:
            now_ms = system_clock()
            # The period the handlers use: the stack has put their settings in the environment.
            tick_seconds = Settings.from_env().tick_seconds
            index = buckets.tick_index(now_ms, tick_seconds)
            stack.client("sqs").send_message(
                QueueUrl=stack.resource(self.queue).ref,
                MessageBody=json.dumps(
                    {"tick": index, "tick_seconds": tick_seconds, "at_ms": now_ms}
                ),
                MessageGroupId=c.TICK_GROUP_ID,
                MessageDeduplicationId=f"repeat-{index}-{next(numbers)}",
            )

        return [
            (t, "repeated tick messages", send) for t in _times(self.start, self.stop, self.every)
        ]

    def restore(self, stack: Stack) -> None:
        """Nothing stays in effect."""


def _times(start: float, stop: float, every: float) -> list[float]:
    count = int((stop - start) // every) + 1
    return [start + i * every for i in range(max(0, count))]


# The plan ----------------------------------------------------------------------------------


def skewed_clock(offset_ms: int, clock: Clock = system_clock) -> Clock:
    """`clock` off by `offset_ms` milliseconds."""

    def now() -> int:
        return clock() + offset_ms

    return now


@dataclass(frozen=True)
class FaultPlan:
    """Everything done to one stack run; `seed` makes the AWS faults' choices reproducible."""

    aws: tuple[AwsFault, ...] = ()
    timed: tuple[TimedFault, ...] = ()
    clock_skew_ms: Mapping[str, int] = field(default_factory=dict)
    seed: int = 6

    def install(self) -> ActiveFaults:
        """Start injecting (before the handlers create their clients)."""
        return ActiveFaults(self).install()


class ActiveFaults:
    """An installed plan: the botocore handlers, the timed faults still to run, the counters."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._counts: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._pending = sorted(
            (event for fault in plan.timed for event in fault.events()), key=lambda e: e[0]
        )
        self._events: Any = None
        self._handlers: list[tuple[str, Callable[..., Any]]] = [
            ("before-parameter-build", self._decide),
            ("before-call", self._before_call),
            ("after-call", self._after_call),
        ]

    # Installing ------------------------------------------------------------------------

    def install(self) -> ActiveFaults:
        """Register on the boto3 default session (created if there is none)."""
        if self.plan.aws:
            if boto3.DEFAULT_SESSION is None:
                boto3.setup_default_session()
            assert boto3.DEFAULT_SESSION is not None
            self._events = boto3.DEFAULT_SESSION.events
            attribute_clients(self._events)
            for event, handler in self._handlers:
                self._events.register(event, handler)
        return self

    def remove(self) -> None:
        """Stop injecting into clients created from now on (the handlers' are discarded)."""
        if self._events is not None:
            for event, handler in self._handlers:
                self._events.unregister(event, handler)
            self._events = None

    def handler_clock(self, function: str) -> Clock | None:
        """The skewed clock `function`'s handler modules take when imported (None: no skew)."""
        offset = self.plan.clock_skew_ms.get(function)
        return skewed_clock(offset) if offset else None

    # What happened ---------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """How many times each fault was injected, by name."""
        with self._lock:
            return dict(self._counts)

    # Timed faults ----------------------------------------------------------------------

    def step(self, stack: Stack, elapsed: float) -> None:
        """Run the timed faults due by `elapsed` seconds into the workload."""
        while self._pending and self._pending[0][0] <= elapsed:
            _, name, action = self._pending.pop(0)
            log.warning("fault at %.1fs: %s", elapsed, name)
            action(stack)
            with self._lock:
                self._counts[name] += 1

    def restore(self, stack: Stack) -> None:
        """Undo what the timed faults left in effect."""
        self._pending.clear()
        for fault in self.plan.timed:
            fault.restore(stack)

    # The botocore handlers -------------------------------------------------------------

    def _choose(self, function: str, service: str, operation: str) -> AwsFault | None:
        elapsed = time.monotonic() - self._started
        with self._lock:
            for fault in self.plan.aws:
                calls = fault.calls
                if not calls.matches(function, service, operation) or (
                    isinstance(fault.action, PartialBatch)
                    and (service, operation) not in BATCH_SHAPES
                ):
                    continue
                self._seen[fault.name] += 1
                if self._seen[fault.name] <= calls.skip:
                    continue
                if calls.limit is not None and self._counts[fault.name] >= calls.limit:
                    continue
                if calls.window and not calls.window[0] <= elapsed < calls.window[1]:
                    continue
                if self._rng.random() >= calls.rate:
                    continue
                self._counts[fault.name] += 1
                return fault
        return None

    def _pick(self, share: float) -> Callable[[int], list[int]]:
        def pick(size: int) -> list[int]:
            with self._lock:
                return self._rng.sample(range(size), max(1, min(size, round(size * share))))

        return pick

    def _decide(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        function = current_function()
        if not function:
            return
        service = model.service_model.service_id.hyphenize()
        fault = self._choose(function, service, model.name)
        if fault is None:
            return
        removed, nothing_left = None, False
        if isinstance(fault.action, PartialBatch):
            shape = BATCH_SHAPES[(service, model.name)]
            removed = shape.take(params, self._pick(fault.action.share))
            nothing_left = shape.empty(params)
        context[_DECISION] = _Decision(fault, service, model.name, removed, nothing_left)
        log.info("injecting %s into %s %s.%s", fault.name, function, service, model.name)

    def _before_call(
        self, context: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        decision: _Decision | None = context.get(_DECISION)
        if decision is None:
            return None
        action = decision.fault.action
        if isinstance(action, Throttle | ServerError):
            reply = action.reply(decision.service)
            return _response(reply.status), reply.parsed()
        if isinstance(action, Crash) and not action.after_call:
            raise RuntimeCrash(f"injected crash before {decision.call}")
        if decision.nothing_left:
            # Every entry was taken out: answer for the service, which refuses an empty batch.
            return _response(200), {"ResponseMetadata": {"HTTPStatusCode": 200}}
        return None

    def _after_call(
        self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        decision: _Decision | None = context.get(_DECISION)
        if decision is None:
            return
        action = decision.fault.action
        if isinstance(action, PartialBatch):
            BATCH_SHAPES[(decision.service, decision.operation)].report(parsed, decision.removed)
        elif isinstance(action, Crash) and action.after_call and http_response.status_code < 300:
            raise RuntimeCrash(f"injected crash after {decision.call}")


@dataclass(frozen=True)
class _Decision:
    """What was decided for one call (kept in botocore's per-call context)."""

    fault: AwsFault
    service: str
    operation: str
    removed: Any
    nothing_left: bool

    @property
    def call(self) -> str:
        return f"{self.service}.{self.operation}"


def _response(status: int) -> AWSResponse:
    return AWSResponse("", status, {}, None)
