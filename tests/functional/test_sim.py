"""The simulator end to end: deterministic, green on the product, and its checker bites."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from delayq import constants as c
from delayq import ingest, retry, shaping, store
from delayq.buckets import expires_at
from delayq.cleanup import TtlCleanup
from delayq.envelope import Envelope
from delayq.exceptions import StoreError
from delayq.kafka import KafkaDelivery, OutRecord
from delayq.limits import TenantLimits
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue
from delayq.records import DelayRequest, Rejection
from delayq.store import MessageStore, Page
from sim.__main__ import main, seeds_of
from sim.aws import StreamRecord
from sim.checker import Checker
from sim.faults import Knobs
from sim.iam import roles
from sim.pipeline import Pipeline, sim_settings
from sim.run import run_seed, simulate
from sim.sources import kafka as kafka_source
from sim.sources.stream import STREAM_PARALLELIZATION, lane_of
from sim.workload import CAPPED, DEFERRED, METERED, PARTITIONS, Shape, Workload
from sim.world import Crash, World
from testkit.clock import NOW_MS
from testkit.kafka import ProducedRecord
from tests.factories import delay_request

# A small run: 80 requests written over 5 minutes, due within 40 minutes.
SMALL = Shape(messages=80, window_ms=5 * 60_000, max_delay_ms=40 * 60_000)
# The same with tenant limits: seed 19 has capped and deferred messages released after due
# (stored ones among them), at every priority; seed 1 a burst of the quota'd tenant within
# one second of record timestamps (rejected over its quota).
LIMITED = dataclasses.replace(SMALL, limits=True)
# The mix the planted defects were tuned on: without the contract's corners (their seeds stay
# clean of what the corners find, and the plant is what the checker sees).
PLANT = Shape(contract=False)
PLANT_LIMITED = dataclasses.replace(LIMITED, contract=False)
LIMITED_SEED = 19
QUOTA_SEED = 1


@cache
def calm_run() -> tuple[Pipeline, Workload]:
    return simulate(11, SMALL, Knobs.calm())  # a seed with timely cancels, reschedules, rejects


def violations(pipeline: Pipeline, workload: Workload) -> list[str]:
    return sorted({v.kind for v in Checker(pipeline, workload).run().violations})


def test_the_same_seed_gives_the_same_history() -> None:
    first, again, other = run_seed(5, SMALL), run_seed(5, SMALL), run_seed(6, SMALL)
    assert first.fingerprint == again.fingerprint
    assert first.faults == again.faults
    assert first.verdict.lateness == again.verdict.lateness
    assert other.fingerprint != first.fingerprint


def test_an_ingest_bug_on_every_batch_ends_the_seed_with_its_partitions_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A handler that raises on every batch would be retried to the end of the run (its
    # records never acknowledged, so never checked): each partition is blocked instead.
    def broken(*_: Any, **__: Any) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(kafka_source, "ingest_batch", broken)
    pipeline, workload = simulate(11, SMALL, Knobs.calm())
    found = [v for v in Checker(pipeline, workload).run().violations if v.kind == "stuck"]
    assert {v.delay_id for v in found} == {f"partition {n}" for n in range(PARTITIONS)}
    assert all("TypeError" in v.detail and "offset 0" in v.detail for v in found)
    assert pipeline.functions.invocations["ingest"] == kafka_source.STUCK_AFTER * PARTITIONS


def test_errors_a_retry_may_fix_never_block_a_partition() -> None:
    assert kafka_source.is_bug(KeyError("x"))
    assert not kafka_source.is_bug(None)  # the invocation died (a crash, its timeout)
    assert not kafka_source.is_bug(StoreError("throttled until the deadline"))
    assert not kafka_source.is_bug(EndpointConnectionError(endpoint_url="https://dynamodb"))


def test_without_faults_every_message_is_delivered_once() -> None:
    pipeline, workload = calm_run()
    verdict = Checker(pipeline, workload).run()
    assert verdict.violations == []
    assert verdict.duplicates == 0
    assert verdict.unacknowledged == 0
    assert verdict.messages == verdict.delivered + verdict.cancelled > 50
    assert verdict.rejected == sum(1 for i in workload.intents if i.kind == "invalid") > 0
    assert verdict.cancelled >= 1
    assert pipeline.world.faults == {}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_under_faults_no_guarantee_breaks(seed: int) -> None:
    result = run_seed(seed, SMALL, Knobs())
    assert result.ok, result.verdict.violations[:5]
    assert {"crash", "network-error", "response-lost"} <= set(result.faults)


# --- the checker finds what breaks ---------------------------------------------------------


def tampered(change: str) -> list[str]:
    """The calm run's record with one thing broken (the record is restored afterwards)."""
    pipeline, workload = calm_run()
    original = pipeline.cluster.log
    log = list(original)
    controlled = {i.delay_id.encode() for i in workload.intents if i.kind != "delay"}
    index = next(
        n for n, p in enumerate(log) if dict(p.record.headers)[c.HEADER_ID] not in controlled
    )
    first = log[index]
    headers = first.record.headers
    if change == "lost":
        delay_id = dict(headers)[c.HEADER_ID]
        log = [p for p in log if dict(p.record.headers).get(c.HEADER_ID) != delay_id]
    elif change == "early":
        due = int(dict(headers)[c.HEADER_DUE_MS] or 0)
        early = tuple(
            (n, str(due - 1).encode() if n == c.HEADER_EMITTED_MS else v) for n, v in headers
        )
        log[0] = dataclasses.replace(first, record=dataclasses.replace(first.record, headers=early))
    elif change == "corrupt":
        log[0] = dataclasses.replace(
            first, record=dataclasses.replace(first.record, value=b"other")
        )
    pipeline.cluster.log = log
    try:
        return violations(pipeline, workload)
    finally:
        pipeline.cluster.log = original


@pytest.mark.parametrize("change", ["lost", "early", "corrupt"])
def test_the_checker_finds_a_broken_record(change: str) -> None:
    assert violations(*calm_run()) == []
    assert tampered(change) == [change]


def test_the_checker_finds_a_delivery_after_a_timely_cancel() -> None:
    pipeline, workload = calm_run()
    checker = Checker(pipeline, workload)
    cancelled = next(
        i
        for i in workload.intents
        if i.kind == "delay"
        and any(
            j.kind == "cancel"
            and j.delay_id == i.delay_id
            and j.send_ms > i.send_ms
            and checker._early_enough(j, i.due_ms)
            for j in workload.intents
        )
    )
    headers = (
        *((n, v) for n, v in cancelled.headers if not n.startswith(c.HEADER_PREFIX)),
        (c.HEADER_ID, cancelled.delay_id.encode()),
        (c.HEADER_DUE_MS, str(cancelled.due_ms).encode()),
        (c.HEADER_EMITTED_MS, str(cancelled.due_ms).encode()),
    )
    record = ProducedRecord("orders.timeout", cancelled.key, cancelled.value, headers)
    pipeline.cluster.log.append(type(pipeline.cluster.log[0])(record, cancelled.due_ms, "emitter"))
    try:
        assert "cancel" in violations(pipeline, workload)
    finally:
        pipeline.cluster.log.pop()


def test_the_command_writes_the_results_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "sim.json"
    args = ["--seeds", "3", "--workers", "1", "--hours", "0.05", "--out", str(out), "--quiet"]
    assert main([*args, "--messages", "37"]) == 0
    assert "lost 0, early 0" in capsys.readouterr().out
    report = json.loads(out.read_text())
    required = {"seeds", "messages", "simulated_hours", "faults", "lost", "early", "duplicates"}
    assert required | {"lateness_ms"} <= set(report)
    assert report["seeds"]["count"] == 1
    assert report["shape"]["messages"] == 37
    assert 30 <= report["messages"] <= 45  # bursts and id reuse make the count approximate
    with pytest.raises(SystemExit):
        main([*args, "--messages", "0"])


def test_a_failing_seed_prints_how_to_reproduce_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A product bug: a record counts as delivered as soon as it is handed to the producer.
    def produce(self: KafkaDelivery, record: OutRecord, on_result: Callable[..., None]) -> None:
        on_result(None)

    monkeypatch.setattr(KafkaDelivery, "produce", produce)
    assert seeds_of("1,4-6") == [1, 4, 5, 6]
    args = ["--seeds", "3", "--workers", "1", "--hours", "0.05", "--out", str(tmp_path / "s.json")]
    assert main(args) == 1
    text = capsys.readouterr().out
    command = ".venv/bin/python -m sim --seeds 3 --workers 1 --hours 0.05"
    assert f"seed 3 broke a guarantee; reproduce with: {command}" in text
    assert "lost: m-" in text
    assert "history of m-" in text
    assert "acknowledged" in text


def _direct_path_skips_cancel_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = MessageStore.cancelled

    def cancelled(self: MessageStore, requests: Any, now_ms: int, deadline: Any) -> list[bool]:
        if sys._getframe(1).f_globals["__name__"] == "delayq.direct":
            return [False] * len(requests)
        return checked(self, requests, now_ms, deadline)

    monkeypatch.setattr(MessageStore, "cancelled", cancelled)


def _network_errors_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "NETWORK_ERRORS", ())


def _scheduler_skips_expired_items(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scheduler's Query leaves out items whose TTL has passed but that TTL has not deleted.
    worlds: list[World] = []
    init = World.__post_init__

    def post_init(self: World) -> None:
        init(self)
        worlds.append(self)

    page = MessageStore._query_page
    grace_s = sim_settings(roles()).ttl_grace_seconds

    def query_page(self: MessageStore, *args: Any, **kwargs: Any) -> Page:
        found = page(self, *args, **kwargs)
        now_s = worlds[-1].now_ms // 1000
        kept = [m for m in found.messages if expires_at(m.release_at_ms, grace_s) > now_s]
        return dataclasses.replace(found, messages=kept)

    monkeypatch.setattr(World, "__post_init__", post_init)
    monkeypatch.setattr(MessageStore, "_query_page", query_page)


def _pending_counts_forget_counted_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ingest adds a redelivered batch's pending counts again."""

    def count(self: PendingCounts, key: Any, entries: Any, deadline: Any) -> int:
        return self._update(key, entries, None, deadline)

    monkeypatch.setattr(PendingCounts, "_count", count)


def _reschedules_never_sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    """No emitter or retried batch seals a release second: a reschedule's marker write that
    lands late is applied whatever was delivered meanwhile."""
    monkeypatch.setattr(MessageStore, "seal", lambda *_: None)


# Defects the simulator finds, each with a seed that shows it (a change to the workload or the
# knobs may move them: find another with a few seeds of the plant).
# The direct path's cancel check shows when a cancel on the other partition goes through while
# the message's partition stalls: every direct-path message gets a cancel, every run a stall.
PLANT_DIRECT = (
    dataclasses.replace(PLANT, direct_cancel=1.0),
    dataclasses.replace(Knobs(), ingest_stall=1.0),
)

# A reschedule's marker write landing late shows with reschedules near their cutoffs and many
# DynamoDB writes landing late.
PLANT_LATE = (
    Shape(reschedule=0.5, near_cutoff=1.0, extra_controls=0.3),
    dataclasses.replace(Knobs(), late_effect=0.3),
)


@pytest.mark.parametrize(
    ("plant", "seed", "kind", "world"),
    [
        (_direct_path_skips_cancel_markers, 5, "cancel", PLANT_DIRECT),
        (_reschedules_never_sealed, 2, "reschedule", PLANT_LATE),
        (_network_errors_not_retried, 0, "unretried", (PLANT, Knobs())),
        (_scheduler_skips_expired_items, 11, "held", (PLANT, Knobs())),
        (_pending_counts_forget_counted_offsets, 35, "counted", (PLANT, Knobs())),
    ],
    ids=["direct-path-cancel", "late-marker", "network-errors", "expired-items", "pending-recount"],
)
def test_the_simulator_finds_a_planted_defect(
    monkeypatch: pytest.MonkeyPatch,
    plant: Callable[[pytest.MonkeyPatch], None],
    seed: int,
    kind: str,
    world: tuple[Shape, Knobs],
) -> None:
    assert run_seed(seed, *world).ok
    plant(monkeypatch)
    assert kind in {v.kind for v in run_seed(seed, *world).verdict.violations}


def _stream_record(sequence: int, item: str, at_ms: int = NOW_MS) -> StreamRecord:
    keys = {"pk": {"S": "msg#1"}, "sk": {"S": item}}
    return StreamRecord(sequence, {"eventID": str(sequence), "dynamodb": {"Keys": keys}}, at_ms)


def _stream_run(
    fails: Callable[[int, int], BaseException | None],
    items: dict[int, str] | None = None,
    later: tuple[int, list[int]] = (0, []),
    pause_ms: dict[int, int] | None = None,
) -> tuple[Pipeline, list[tuple[int, int, int]]]:
    """A calm pipeline whose stream holds records 1-8 (of one item, or of ``items[n]``);
    ``fails(sequence, call)`` gives what the n-th handle() call raises, if anything, after
    ``pause_ms[sequence]`` of work. ``later`` holds records written ``later[0]`` ms after the
    start instead (as a TTL sweep does). Returns the pipeline and the handle() calls, in the
    order they began: ``(sequence, began, ended)`` (simulated ms since the start)."""
    world = World(1, NOW_MS)
    pipeline = Pipeline(world, Knobs.calm())
    began: list[tuple[int, int]] = []  # (sequence, when), call by call
    ended: dict[int, int] = {}  # call -> when
    item_of = items or {}
    after_ms, written_later = later

    def handle(self: TtlCleanup, record: Any) -> None:
        sequence = int(record["eventID"])
        call = len(began)
        began.append((sequence, world.now_ms - NOW_MS))
        world.pause((pause_ms or {}).get(sequence, 1))
        ended[call] = world.now_ms - NOW_MS
        error = fails(sequence, call)
        if error is not None:
            raise error

    def write(sequences: list[int]) -> None:
        for n in sequences:
            pipeline.ttl.stream.append(_stream_record(n, item_of.get(n, "one"), world.now_ms))

    write([n for n in range(1, 9) if n not in written_later])
    pipeline.stream.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TtlCleanup, "handle", handle)
        pipeline.stream.poll()
        if written_later:

            def sweep() -> None:
                write(written_later)
                pipeline.ttl.on_records()

            world.at(NOW_MS + after_ms, sweep)
        world.run_until(NOW_MS + 120_000)
    world.stop()
    return pipeline, [(sequence, at, ended[n]) for n, (sequence, at) in enumerate(began)]


def test_the_stream_source_resumes_from_the_first_failed_record() -> None:
    # Record 3 fails once: every record of the batch is tried (as the handler's batch
    # processor does), and the retry starts at record 3.
    pipeline, calls = _stream_run(
        lambda sequence, call: RuntimeError("once") if (sequence, call) == (3, 2) else None
    )
    assert [sequence for sequence, _, _ in calls] == [1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8]
    assert pipeline.stream.failures == []


def test_a_failed_invocation_halves_its_batch_and_a_poison_record_goes_to_the_destination() -> None:
    # Record 5 kills every invocation that reaches it: the first batch (1-8) dies there, its
    # retry takes half (1-4) and succeeds; from 5 on the batch halves down to record 5 alone,
    # which goes to the on-failure destination after the retries; 6-8 are then handled.
    pipeline, calls = _stream_run(lambda sequence, _: Crash("dies") if sequence == 5 else None)
    seen = [sequence for sequence, _, _ in calls]
    assert seen[:10] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert seen[-3:] == [6, 7, 8]
    assert [r["eventID"] for r in pipeline.stream.failures] == ["5"]


def test_the_stream_source_runs_up_to_its_parallelization_factor_of_batches_at_once() -> None:
    # Eight items, each record a second of work: the lanes' batches overlap in time, and
    # never more of them than the factor (template.yaml's ParallelizationFactor).
    items = {n: f"item-{n}" for n in range(1, 9)}
    _, calls = _stream_run(lambda _s, _c: None, items, pause_ms=dict.fromkeys(items, 1000))
    assert sorted(sequence for sequence, _, _ in calls) == list(range(1, 9))
    at_once = max(
        sum(1 for _, began, ended in calls if began <= moment < ended) for _, moment, _ in calls
    )
    assert at_once == STREAM_PARALLELIZATION == 2


def test_a_later_record_of_an_item_waits_for_the_earlier_one_to_succeed() -> None:
    # Record 1 (item a) works for 10 s and fails once; records 2-8 come meanwhile, 6 of item a
    # too. The other lane goes on with the other items, but record 6 is handed to cleanup only
    # after record 1 succeeded, never beside it nor before its retry.
    items = {n: f"item-{n}" for n in range(1, 9)} | {6: "item-1"}
    lanes = {lane_of(_stream_record(n, items[n])) for n in range(2, 9) if n != 6}
    assert lanes == {0, 1}  # some records overtake record 1 in the other lane
    pipeline, calls = _stream_run(
        lambda sequence, call: RuntimeError("once") if (sequence, call) == (1, 0) else None,
        items,
        later=(1000, [2, 3, 4, 5, 6, 7, 8]),
        pause_ms={1: 10_000},
    )
    of_item = [(sequence, began, ended) for sequence, began, ended in calls if sequence in (1, 6)]
    assert [sequence for sequence, _, _ in of_item] == [1, 1, 6]
    assert of_item[2][1] >= of_item[1][2]  # 6 began after the retried 1 ended
    overtaking = [s for s, began, _ in calls if s not in (1, 6) and began < of_item[1][2]]
    assert overtaking  # the other keys did not wait for item a
    assert pipeline.stream.failures == []


def test_a_throttled_invocation_never_runs_and_its_source_retries() -> None:
    world = World(1, NOW_MS)
    pipeline = Pipeline(world, dataclasses.replace(Knobs.calm(), lambda_throttled=1.0))
    ran: list[str] = []
    settled: list[bool] = []
    pipeline.functions.invoke("emitter", lambda _cn, _inv: ran.append("ran"), settled.append)
    world.run_until(NOW_MS + 1)
    assert ran == []
    assert settled == [False]
    assert world.faults["lambda-throttled"] == 1


# --- tenant limits in the simulation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pk", "allowed"), [("rate#bulk#1795248000", True), ("quota#bulk#1", False)]
)
def test_the_emitters_role_lets_it_claim_release_slots_and_no_other_counter(
    pk: str, allowed: bool
) -> None:
    guard = roles().guard
    params = {
        "TableName": sim_settings(roles()).table_name,
        "Key": {"pk": {"S": pk}, "sk": {"S": "-"}},
        "UpdateExpression": "ADD #n :amount",
        "ExpressionAttributeNames": {"#n": "n"},
        "ExpressionAttributeValues": {":amount": {"N": "1"}},
        "ReturnValues": "UPDATED_NEW",
    }
    assert (guard.check("emitter", "dynamodb", "UpdateItem", params) is None) is allowed


def test_with_release_caps_every_function_stays_within_its_role() -> None:
    # Every target capped at 1/s: ingest claims slots, the emitter claims new ones for what
    # the run makes late; the fakes answer the counters' UpdateItem (ReturnValues) as AWS does.
    settings = sim_settings(
        roles(), tenant_limits=json.dumps({"*": {"release_per_second": 1}}), strict_caps=1
    )
    pipeline, workload = simulate(3, SMALL, Knobs.calm(), settings)
    assert pipeline.roles.guard.denials == []
    verdict = Checker(pipeline, workload).run()
    assert verdict.unacknowledged == 0
    assert verdict.delivered + verdict.cancelled + verdict.rejected >= verdict.messages > 50
    # The counters were written (TTL may have deleted them before the long run's end).
    items = [*pipeline.dynamodb.items(settings.table_name), *pipeline.ttl.deleted_items]
    assert [i for i in items if i["pk"]["S"].startswith("rate#")]


@cache
def limited_run() -> tuple[Pipeline, Workload]:
    return simulate(LIMITED_SEED, LIMITED, Knobs.calm())


def test_with_tenant_limits_the_limits_bind_and_no_guarantee_breaks() -> None:
    pipeline, workload = limited_run()
    verdict = Checker(pipeline, workload).run()
    assert verdict.violations == []
    assert verdict.unacknowledged == 0
    assert verdict.limited > 0
    assert sum(verdict.limited_lateness.values()) == verdict.limited
    tenants = {i.delay_id: i.tenant for i in workload.intents if i.kind == "delay"}
    held = {
        tenants[(p.record.header(c.HEADER_ID) or b"").decode()]
        for p in pipeline.cluster.log
        if p.record.header(c.HEADER_RELEASE_MS)
    }
    assert held == {CAPPED, DEFERRED}  # released after due by a cap, or deferred
    assert pipeline.settings.limits.of(METERED).ingest_per_second is not None
    # One delay queue per priority, each with its own event source, all of them used.
    assert len(pipeline.delay_queues) == 3
    assert [poller.url for poller in pipeline.delay_queues] == list(pipeline.delay_queue_urls)
    assert all(poller.received for poller in pipeline.delay_queues)


def test_with_an_ingest_quota_a_burst_over_it_is_rejected_whole() -> None:
    pipeline, workload = simulate(QUOTA_SEED, LIMITED, Knobs.calm())
    verdict = Checker(pipeline, workload).run()
    assert verdict.violations == []
    assert verdict.over_quota > 0  # the quota'd tenant's burst, in the reject queue whole


def _slots_ignore_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every capped message gets a slot in its due second, whatever the counter says."""

    def release_slots(
        _claim: Any, _key: str, due_second: int, count: int, _per_second: int, **kw: Any
    ) -> dict[int, tuple[int, int]]:
        second = max(due_second, kw.get("first_second") or due_second)
        return dict.fromkeys(range(count), (second, 0))

    monkeypatch.setattr(shaping, "release_slots", release_slots)


def _slot_replaces_due_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message's release is the start of its slot's second, even before its due time, and
    the release replaces the due time when it is produced."""

    def released(request: DelayRequest, slot_second: int, rank: int) -> DelayRequest:
        return dataclasses.replace(request, release_ms=slot_second * 1000, release_rank=rank)

    monkeypatch.setattr(shaping, "_released", released)
    monkeypatch.setattr(
        DelayRequest,
        "release_at_ms",
        property(lambda r: r.paced_ms or r.release_ms or r.due_ms),
    )


def _quota_rejects_lose_their_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reject of a record over its quota keeps its coordinates but not its value."""
    refused = ingest._refused

    def without_value(event: Any, over: Any) -> list[Rejection]:
        return [
            dataclasses.replace(r, record={**r.record, "value": None}) for r in refused(event, over)
        ]

    monkeypatch.setattr(ingest, "_refused", without_value)


def _deferring_quota_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over its quota, a deferring tenant's messages are rejected instead (ingest reads its
    limits as if they said ``reject``)."""
    admit = shaping.Shaper.admit

    def rejecting(self: shaping.Shaper, *args: Any) -> shaping.Admission:
        named = tuple(
            (name, dataclasses.replace(limits, over_quota="reject"))
            for name, limits in self.limits.named
        )
        limits = TenantLimits(named, self.limits.default)
        return admit(dataclasses.replace(self, limits=limits), *args)

    monkeypatch.setattr(shaping.Shaper, "admit", rejecting)


def _one_delay_queue_for_every_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every priority waits in the normal delay queue (behind any low burst)."""
    monkeypatch.setattr(DelayQueue, "of_priority", lambda self, _priority: self.queue)


def _stored_messages_forget_their_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored item leaves out the priority: the scheduler queues them as normal."""
    item_of = store.message_item

    def without_priority(*args: Any) -> Any:
        item = item_of(*args)
        item.pop(c.ATTR_PRIORITY, None)
        return item

    monkeypatch.setattr(store, "message_item", without_priority)


# Seed 7 has a burst of the deferring tenant (seed 1 has none over its quota).
@pytest.mark.parametrize(
    ("plant", "seed", "kind"),
    [
        (_slots_ignore_the_counters, LIMITED_SEED, "cap"),
        (_slot_replaces_due_time, LIMITED_SEED, "early"),
        (_quota_rejects_lose_their_value, QUOTA_SEED, "lost"),
        (_deferring_quota_rejects, 7, "refused"),
        (_one_delay_queue_for_every_priority, LIMITED_SEED, "misrouted"),
        (_stored_messages_forget_their_priority, LIMITED_SEED, "priority"),
    ],
    ids=[
        "over-the-cap",
        "capped-early",
        "quota-reject-without-bytes",
        "deferral-rejected",
        "one-queue-for-all",
        "stored-priority-lost",
    ],
)
def test_with_tenant_limits_the_checker_finds_a_planted_defect(
    monkeypatch: pytest.MonkeyPatch,
    plant: Callable[[pytest.MonkeyPatch], None],
    seed: int,
    kind: str,
) -> None:
    run = simulate(seed, PLANT_LIMITED, Knobs.calm())
    assert violations(*run) == []
    plant(monkeypatch)
    assert kind in violations(*simulate(seed, PLANT_LIMITED, Knobs.calm()))


def _stored_capped_delivery(pipeline: Pipeline, workload: Workload) -> tuple[int, Any]:
    """The index in the cluster's log of the first delivery of a stored message its cap
    released after due, with no cancel or reschedule after it."""
    checker = Checker(pipeline, workload)
    controlled = {i.delay_id for i in workload.intents if i.kind != "delay"}
    for index, produced in enumerate(pipeline.cluster.log):
        key = (
            (produced.record.header(c.HEADER_ID) or b"").decode(),
            int(produced.record.header(c.HEADER_DUE_MS) or 0),
        )
        intent = checker.by_key.get(key)
        ack = checker.ack_ms[id(intent)] if intent else None
        if (
            intent is not None
            and ack is not None
            and produced.record.header(c.HEADER_RELEASE_MS)
            and intent.delay_id not in controlled
            and intent.due_ms - ack > 20 * 60_000
            and len(checker.deliveries[key]) == 1
        ):
            return index, key
    raise AssertionError("no stored capped message in the run")


def test_with_tenant_limits_a_capped_message_is_judged_from_its_release_slot() -> None:
    pipeline, workload = limited_run()
    original = pipeline.cluster.log
    index, key = _stored_capped_delivery(pipeline, workload)
    first = original[index]
    release = int(first.record.header(c.HEADER_RELEASE_MS) or 0)
    assert release > key[1]

    def judged(at_ms: int, emitted_ms: int) -> list[str]:
        headers = tuple(
            (n, str(emitted_ms).encode() if n == c.HEADER_EMITTED_MS else v)
            for n, v in first.record.headers
        )
        record = dataclasses.replace(first.record, headers=headers)
        pipeline.cluster.log = [
            *original[:index],
            dataclasses.replace(first, record=record, at_ms=at_ms),
            *original[index + 1 :],
        ]
        try:
            return violations(pipeline, workload)
        finally:
            pipeline.cluster.log = original

    assert judged(first.at_ms, release) == []
    # After its due time but before its release: early (and, when the slot is a second's
    # first and the second before it was full, over the cap in that second too).
    assert set(judged(first.at_ms, release - 1)) - {"cap"} == {"early"}
    # Half an hour after its release second was passed: held, unless the emitter gave it a
    # new slot (it was late there) and it went within 10 minutes of that slot.
    late = release + 30 * 60_000
    assert judged(late, late) == ["held"]
    pipeline.paced[key] = late - 5 * 60_000
    try:
        assert judged(late, late) == []
    finally:
        del pipeline.paced[key]


def test_with_tenant_limits_pending_counts_are_judged_in_the_period_of_each_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, workload = limited_run()
    assert Checker(pipeline, workload)._overcounted() == []
    monkeypatch.setattr(Checker, "_limited", lambda _self, _intent: False)  # at due times
    assert {v.kind for v in Checker(pipeline, workload)._overcounted()} == {"counted"}


def test_the_pipeline_keeps_the_slot_a_late_capped_message_was_paced_to() -> None:
    pipeline, _ = limited_run()
    request = dataclasses.replace(
        delay_request(delay_id="late-1", due_ms=NOW_MS), tenant=CAPPED, paced_ms=NOW_MS + 7_000
    )
    url = pipeline.delay_queue_urls[-1]
    before = dict(pipeline.paced)
    pipeline._sent(url, {"QueueUrl": url, "MessageBody": Envelope(request).encode()})
    try:
        assert pipeline.paced == {**before, ("late-1", NOW_MS): NOW_MS + 7_000}
    finally:
        pipeline.paced.pop(("late-1", NOW_MS), None)


def test_the_run_counts_the_histories_that_exercised_each_clause() -> None:
    pipeline, workload = simulate(QUOTA_SEED, LIMITED, Knobs.calm())
    coverage = Checker(pipeline, workload).run().coverage
    exercised = {
        "cancel",
        "reschedule",
        "id reuse",
        "across partitions",
        "release cap or deferral",
        "priority high or low",
        "ingest quota refusal",
        "large payload (S3)",
    }
    assert exercised <= {name for name, n in coverage.items() if n > 0}
    # Counted from the records, not guessed: as many cancels as messages a later cancel names.
    cancelled = {i.delay_id for i in workload.intents if i.kind == "cancel"}
    assert (
        0
        < coverage["cancel"]
        <= sum(1 for i in workload.intents if i.kind == "delay" and i.delay_id in cancelled)
    )
