"""The knobs of AWS's weak semantics, and the client wrapper that applies them to every call a
function makes.

Each knob is a documented behaviour of the service, at a rate a campaign can turn up:

- every AWS call: a latency; throttling; a network error before the request reached AWS
  (botocore's ``EndpointConnectionError``); a response lost after the request took effect
  (``ReadTimeoutError``: the write happened, the caller does not know); a DynamoDB write that
  takes effect after the caller gave up on it (its read timed out; a signed request is
  accepted up to five minutes after its timestamp); the process dying before or after the
  call (a crash, or Lambda's timeout when the clock passes it);
- batch calls: some entries not done (DynamoDB ``UnprocessedItems`` / ``UnprocessedKeys``,
  SQS ``Failed[]``), the others done;
- the rest (eventual consistency, TTL lag, at-least-once streams and queues, late ticks,
  Kafka outages) live with the service they belong to (:mod:`sim.aws`, :mod:`sim.sources`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from delayq.retry import Backoff
from delayq_local.iam import IamGuard
from sim.world import SAFETY_MS, Crash, Invocation, World

# DynamoDB writes of one request (a batch write's entries are retried by the caller anyway).
_SINGLE_WRITES: Final = frozenset(
    {"put_item", "update_item", "delete_item", "transact_write_items"}
)
# What the caller waits before its read times out (the layer's default read timeout).
_READ_TIMEOUT_MS: Final = 5_000

# Calls that are not API requests of the functions (set-up, inspection).
_NOT_API: Final = frozenset({"create_table", "create_queue", "create_bucket", "items", "messages"})

_THROTTLE_CODE: Final = {
    "dynamodb": ("ProvisionedThroughputExceededException", 400),
    "sqs": ("RequestThrottled", 403),
    "s3": ("SlowDown", 503),
}
_THROTTLE_CODES: Final = frozenset(
    {"ThrottlingException", *(c for c, _ in _THROTTLE_CODE.values())}
)


@dataclass(frozen=True)
class Knobs:
    """Fault rates (per call, per message or per run, as named) and AWS's periods."""

    # Every AWS call a function makes.
    latency_ms: tuple[int, int] = (2, 40)
    throttle: float = 0.003
    network_error: float = 0.003
    response_lost: float = 0.003
    # A DynamoDB write whose caller times out (after the layer's read timeout) and which takes
    # effect later, within the bounds (AWS: "a request must reach AWS within five minutes of
    # the time stamp in the request"), its conditions judged when it lands: most land within
    # seconds of the call (late_effect_mean_ms past the first bound), a few minutes later.
    late_effect: float = 0.002
    late_effect_ms: tuple[int, int] = (1_000, 300_000)
    late_effect_mean_ms: int = 5_000
    crash_before_call: float = 0.0007
    crash_after_call: float = 0.0007
    partial_batch: float = 0.02  # per batch call: some entries fail, the others are done
    # DynamoDB: eventually consistent reads see writes up to this late; TTL deletes an
    # expired item at most this late (AWS: "typically within two days"; now "a few days");
    # stream records repeat.
    stale_read_ms: int = 10_000
    ttl_lag_s: int = 48 * 3_600
    # Most deletions come much sooner than the bound: this share within ttl_prompt_lag_s (so
    # that both a prompt TTL and a slow one meet every expiry path).
    ttl_prompt: float = 0.5
    ttl_prompt_lag_s: int = 3_600
    stream_duplicate: float = 0.02
    # Per run: the stream's event source cannot invoke cleanup (throttled, no concurrency
    # left) for up to this long; it retries until records expire (the stream keeps 24 h).
    cleanup_outage: float = 0.1
    cleanup_outage_max_s: int = 36 * 3_600
    # S3: an object a lifecycle rule expires is removed up to this long after the midnight
    # UTC it becomes eligible (asynchronously; AWS names no bound).
    s3_expiry_lag_s: int = 24 * 3_600
    # SQS: a delivered and deleted message comes again (at-least-once); a received message is
    # received again, concurrently, before its visibility timeout ends (standard queues).
    sqs_duplicate: float = 0.01
    sqs_concurrent_receive: float = 0.005
    # EventBridge: a tick late within the period, missed, or delivered twice.
    tick_late_ms: int = 40_000
    tick_missed: float = 0.03
    tick_duplicated: float = 0.03
    # Per run: the scheduler down for longer than the TTL grace (ticks fail), and the target
    # cluster down for minutes to hours.
    scheduler_outage: float = 0.15
    # Per run: the stack is new (no control clock yet: they are created on first use, and
    # every marker is read for their first hour); otherwise it has run for a day.
    fresh_stack: float = 0.25
    kafka_outage: float = 0.2
    # Per successful ingest batch: its offsets are not committed (a rebalance, a commit the
    # event source lost), so the batch comes again from the same offset, holding as many
    # records as are there by then (AWS: "Lambda processes each event at least once"); in a
    # run whose consumer group keeps rebalancing (per run), kafka_rebalancing_redeliver.
    kafka_redeliver: float = 0.01
    kafka_rebalancing: float = 0.25
    kafka_rebalancing_redeliver: float = 0.2
    # Per run: an operator runs ``delayq redrive`` (the reject queue, then the delay queue's
    # dead-letter queue) one to three times, at arbitrary times (sim.sources.operator).
    redrive: float = 0.3
    kafka_outage_max_s: int = 3_600
    # Per run: one delay-topic partition's event source stalls for 10 s to 5 minutes (its
    # records are read late, some past due); ingest's clock is 1-3 minutes behind (the
    # guarantees that compare clocks widen by that much; the scheduler's guard must hold).
    ingest_stall: float = 0.3
    ingest_clock_behind: float = 0.1
    # Per record produced: the delivery report lost after the write; produce() refused.
    report_lost: float = 0.005
    produce_refused: float = 0.003
    # Per execution environment: its clock is off by up to this much (either way), and drifts
    # by up to this many parts per million; when the drift would take it past the bound, time
    # sync steps it back within (forwards or backwards, as NTP may).
    clock_skew_ms: int = 400
    clock_drift_ppm: int = 200
    # Per invocation: Lambda throttles it (429: the account or the function has no concurrency
    # left); the event source retries as after a failure.
    lambda_throttled: float = 0.002
    # Per partition key and second (DynamoDB's documented per-partition maximums).
    partition_wcu: int = 1000
    partition_rcu: int = 3000

    @classmethod
    def calm(cls) -> Knobs:
        """No fault at all (AWS on a good day; the checker's baseline)."""
        kept = (
            "latency_ms",
            "late_effect_ms",
            "late_effect_mean_ms",
            "stale_read_ms",
            "ttl_lag_s",
            "ttl_prompt",
            "ttl_prompt_lag_s",
            "s3_expiry_lag_s",
            "partition_wcu",
            "partition_rcu",
        )
        zero: dict[str, Any] = {f.name: 0 for f in fields(cls) if f.name not in kept}
        return replace(cls(), **zero)


def access_denied(service: str, operation: str, why: str) -> ClientError:
    """What AWS answers a call IAM refuses."""
    code = "AccessDeniedException" if service == "dynamodb" else "AccessDenied"
    return ClientError(
        {"Error": {"Code": code, "Message": why}, "ResponseMetadata": {"HTTPStatusCode": 403}},
        operation,
    )


def _transient(error: Exception) -> bool:
    """Throttling, a network error or a lost response (not a refusal, not a failed condition)."""
    if isinstance(error, ClientError):
        return error.response["Error"]["Code"] in _THROTTLE_CODES
    return True


def _throttled(service: str, operation: str) -> ClientError:
    code, status = _THROTTLE_CODE.get(service, ("ThrottlingException", 400))
    return ClientError(
        {
            "Error": {"Code": code, "Message": "Rate exceeded"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


class DriftingClock:
    """An execution environment's clock: the true time plus an offset that starts anywhere
    within ``bound_ms`` and drifts at a fixed rate; past the bound it is stepped to a new
    offset within it (counted as ``clock-step``). ``behind_ms`` is subtracted throughout."""

    def __init__(self, world: World, knobs: Knobs, behind_ms: int = 0) -> None:
        self._world = world
        self._bound = knobs.clock_skew_ms
        self._offset = float(world.rng.randint(-self._bound, self._bound))
        self._rate = world.rng.uniform(-1, 1) * knobs.clock_drift_ppm / 1_000_000
        self._at = world.now_ms
        self._behind = behind_ms

    def __call__(self) -> int:
        now = self._world.now_ms
        offset = self._offset + (now - self._at) * self._rate
        if abs(offset) > self._bound:
            offset = float(self._world.rng.randint(-self._bound, self._bound))
            self._world.faults["clock-step"] += 1
        self._offset, self._at = offset, now
        return now + round(offset) - self._behind


@dataclass
class Unretried:
    """A transient error (throttling, a network error, a lost response) after which the
    invocation never made that call again, though it had time to."""

    function: str
    call: str
    at_ms: int
    error: str


@dataclass
class RetryLedger:
    """Which transient errors each invocation has not retried yet.

    A call of the same operation by the same invocation counts as the retry. When an
    invocation ends on its own (not killed), an error it never retried, though at least
    ``slack_ms`` (more than the back-off's longest pause) and the handler's safety margin were
    left, is a defect: AWS documents these errors as transient, and a retry is what the
    layer promises.
    """

    slack_ms: int = 5_000
    # The layer's own bound (``delayq.retry.Backoff.max_attempts``): a call that failed this
    # many times running has been retried as promised, and may be given up.
    attempts: int = Backoff().max_attempts
    found: list[Unretried] = field(default_factory=list)
    _open: dict[int, dict[str, tuple[int, str, int]]] = field(default_factory=dict)

    def called(self, invocation: Invocation | None, call: str) -> None:
        """``invocation`` makes ``call`` (again); None: not an invocation's call."""
        left = self._open.get(invocation.number) if invocation else None
        if left and call in left:
            at_ms, _, failures = left[call]
            left[call] = (at_ms, "", failures)  # retried: open again only if it fails again

    def succeeded(self, invocation: Invocation | None, call: str) -> None:
        """``call`` went through: its earlier failures were retried."""
        left = self._open.get(invocation.number) if invocation else None
        if left:
            left.pop(call, None)

    def failed(self, invocation: Invocation, call: str, at_ms: int, error: Exception) -> None:
        """The world answered ``call`` with a transient error."""
        left = self._open.setdefault(invocation.number, {})
        failures = left[call][2] + 1 if call in left else 1
        left[call] = (at_ms, type(error).__name__, failures)

    def ended(self, invocation: Invocation, killed: bool, out_of_time: bool = False) -> None:
        """``invocation`` is over; ``killed``: it crashed or timed out (no retry was possible);
        ``out_of_time``: it failed because the layer's deadline for a call left no time for
        another try (a shorter deadline than the invocation's: a reschedule's cutoff)."""
        left = self._open.pop(invocation.number, {})
        if killed or out_of_time:
            return
        last_chance = invocation.end_ms - SAFETY_MS - self.slack_ms
        for call, (at_ms, error, failures) in left.items():
            if error and at_ms <= last_chance and failures < self.attempts:
                self.found.append(Unretried(invocation.function, call, at_ms, error))


class Faulty:
    """Wraps one in-memory client: each API call a function makes pays a latency (the world
    moves on meanwhile), may die or fail as the knobs say, and is checked against the
    invocation's timeout.

    Each API name is wrapped once, on its first use (the wrapper then answers attribute
    lookups directly): the simulation makes some hundred thousand calls a seed, nearly all
    of them the same few."""

    def __init__(
        self,
        inner: Any,
        world: World,
        knobs: Knobs,
        service: str,
        guard: IamGuard | None = None,
        *,
        ledger: RetryLedger | None = None,
    ) -> None:
        self._inner = inner
        self._world = world
        self._knobs = knobs
        self._service = service
        self._guard = guard
        self._ledger = ledger or RetryLedger()
        self._endpoint = f"https://{service}.us-east-1.amazonaws.com"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or name in _NOT_API or not callable(attr):
            return attr
        call = self._api(name, attr)
        self.__dict__[name] = call  # the next lookup of ``name`` finds it without __getattr__
        return call

    def _api(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """The wrapper of one API call, with what depends only on ``name`` and the knobs
        worked out once. Each fault is drawn as :meth:`World.chance` draws it, inline."""
        world, knobs, service, guard, ledger = (
            self._world,
            self._knobs,
            self._service,
            self._guard,
            self._ledger,
        )
        random, faults, endpoint = world.rng.random, world.faults, self._endpoint
        latency = world.draw_between(*knobs.latency_ms)
        call_name = f"{service}.{name}"
        operation = "".join(part.capitalize() for part in name.split("_"))
        throttled = f"{service}-throttled"
        # Each knob, and whether World.chance would draw for it at all (not when <= 0).
        crash_before, crash_after = knobs.crash_before_call, knobs.crash_after_call
        throttle, network_error = knobs.throttle, knobs.network_error
        response_lost = knobs.response_lost
        draw_crash_before, draw_crash_after = not crash_before <= 0, not crash_after <= 0
        draw_throttle, draw_network_error = not throttle <= 0, not network_error <= 0
        draw_response_lost = not response_lost <= 0
        late = self._late_of(name, method)
        partial = self._partial_of(name, method)

        def call(**kwargs: Any) -> Any:
            invocation = world.invocation
            ledger.called(invocation, call_name)
            try:
                world.pause(latency())
                world.check_alive()
                if invocation is not None:
                    if draw_crash_before and not random() >= crash_before:
                        faults["crash"] += 1
                        raise Crash(f"crash before {call_name}")
                    if guard is not None:  # IAM first: a call the role does not grant is refused
                        denial = guard.check(invocation.function, service, operation, kwargs)
                        if denial is not None:
                            faults["iam-denied"] += 1
                            raise access_denied(service, operation, str(denial))
                if draw_throttle and not random() >= throttle:
                    faults[throttled] += 1
                    raise _throttled(service, name)
                if draw_network_error and not random() >= network_error:
                    faults["network-error"] += 1
                    raise EndpointConnectionError(endpoint_url=endpoint)
                if late is not None:
                    late(kwargs)
                result = partial(kwargs) if partial is not None else method(**kwargs)
                if draw_response_lost and not random() >= response_lost:
                    faults["response-lost"] += 1
                    raise ReadTimeoutError(endpoint_url=endpoint)
                if invocation is not None and draw_crash_after and not random() >= crash_after:
                    faults["crash"] += 1
                    raise Crash(f"crash after {call_name}")
            except (ClientError, EndpointConnectionError, ReadTimeoutError) as e:
                if invocation is not None and _transient(e):
                    ledger.failed(invocation, call_name, world.now_ms, e)
                raise
            ledger.succeeded(invocation, call_name)
            return result

        return call

    def _late_of(
        self, name: str, method: Callable[..., Any]
    ) -> Callable[[dict[str, Any]], None] | None:
        """For a DynamoDB write: what may make it land late (it then raises the caller's read
        timeout and takes effect later, its conditions judged then); None for other calls."""
        world, knobs = self._world, self._knobs
        if self._service != "dynamodb" or name not in _SINGLE_WRITES or knobs.late_effect <= 0:
            return None
        # Its own random stream: turning it up leaves every other draw of a seed as it was.
        draw, call_name, endpoint = world.side_rng, f"dynamodb.{name}", self._endpoint

        def land(kwargs: dict[str, Any]) -> None:
            keys = [kwargs.get("Key") or kwargs.get("Item")]
            keys += [b.get("Key") for i in kwargs.get("TransactItems", []) for b in i.values()]
            what = f"{call_name} of {[(k['pk']['S'], k['sk']['S']) for k in keys if k]}"
            try:
                method(**kwargs)
            except ClientError as e:  # its condition failed when it landed, or it was throttled
                world.note(f"{what} landed late and failed: {e.response['Error']['Code']}")
            else:
                world.note(f"{what} landed late")

        def maybe_late(kwargs: dict[str, Any]) -> None:
            if draw.random() >= knobs.late_effect:
                return
            world.faults["late-effect"] += 1
            low, high = knobs.late_effect_ms
            lag = min(high, round(low + draw.expovariate(1 / knobs.late_effect_mean_ms)))
            world.at(world.now_ms + lag, functools.partial(land, copy.deepcopy(kwargs)))
            world.pause(_READ_TIMEOUT_MS)
            world.check_alive()
            raise ReadTimeoutError(endpoint_url=endpoint)

        return maybe_late

    def _partial_of(
        self, name: str, method: Callable[..., Any]
    ) -> Callable[[dict[str, Any]], Any] | None:
        """For a batch call: the call that may leave some entries not done (told in the
        answer); None for the others."""
        partial = _PARTIAL_BATCHES.get(name)
        if partial is None:
            return None
        kind, leave_some, needs_two = partial
        world, rate = self._world, self._knobs.partial_batch

        def call(kwargs: dict[str, Any]) -> Any:
            # (A SendMessageBatch of one entry is never answered in part.)
            if (not needs_two or len(kwargs["Entries"]) > 1) and world.chance(rate, kind):
                return leave_some(world, method, kwargs)
            return method(**kwargs)

        return call


def _failed_entries(world: World, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """SendMessageBatch sending only some entries; the rest come back in ``Failed``."""
    entries = list(kwargs["Entries"])
    failed = world.rng.sample(entries, world.rng.randint(1, len(entries) - 1))
    ids = {e["Id"] for e in failed}
    answer = dict(method(**{**kwargs, "Entries": [e for e in entries if e["Id"] not in ids]}))
    answer["Failed"] = [
        {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "try again"}
        for e in failed
    ]
    return answer


def _unprocessed_items(world: World, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """BatchWriteItem doing only some of its requests; the rest come back unprocessed."""
    done: dict[str, list[Any]] = {}
    left: dict[str, list[Any]] = {}
    for table, requests in kwargs["RequestItems"].items():
        for request in requests:
            (left if world.rng.random() < 0.5 else done).setdefault(table, []).append(request)
    if not left:
        return method(**kwargs)
    answer = dict(method(**{**kwargs, "RequestItems": done})) if done else {}
    answer["UnprocessedItems"] = left
    return answer


def _unprocessed_keys(world: World, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """BatchGetItem answering only some keys; the rest come back in ``UnprocessedKeys``."""
    done: dict[str, Any] = {}
    left: dict[str, Any] = {}
    for table, spec in kwargs["RequestItems"].items():
        keys = list(spec["Keys"])
        cut = world.rng.randint(0, len(keys) - 1) if len(keys) > 1 else 0
        if keys[:cut]:
            done[table] = {**spec, "Keys": keys[:cut]}
        left[table] = {**spec, "Keys": keys[cut:]}
    answer = dict(method(**{**kwargs, "RequestItems": done})) if done else {"Responses": {}}
    answer["UnprocessedKeys"] = left
    return answer


# Batch calls that may leave some entries not done: the fault's kind, how the answer leaves
# them, and whether the batch needs two entries or more.
_PARTIAL_BATCHES: Final[
    dict[str, tuple[str, Callable[[World, Callable[..., Any], Mapping[str, Any]], Any], bool]]
] = {
    "send_message_batch": ("sqs-failed-entries", _failed_entries, True),
    "batch_write_item": ("dynamodb-unprocessed", _unprocessed_items, False),
    "batch_get_item": ("dynamodb-unprocessed", _unprocessed_keys, False),
}
