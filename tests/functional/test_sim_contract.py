"""The checker's contract rules fire on histories with the defect planted (ids reused at one due
time, values swapped, late cancels, refused and chained reschedules, unjustified quota rejects),
and the generator writes the corners that reach them."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from itertools import pairwise
from typing import Any

from delayq import constants as c
from delayq.limits import parse_limits
from delayq.records import Reason
from sim.aws import Produced
from sim.checker import STORED_MARGIN_MS, Checker
from sim.faults import Knobs
from sim.pipeline import Pipeline
from sim.run import simulate
from sim.workload import (
    LARGE_BYTES,
    METERED,
    Intent,
    Kind,
    Shape,
    Workload,
    generate,
    partition_of,
)
from tests.functional.test_sim import PLANT_LIMITED, QUOTA_SEED, calm_run


@cache
def limited_run() -> tuple[Pipeline, Workload]:
    return simulate(QUOTA_SEED, PLANT_LIMITED, Knobs.calm())  # a burst over its quota


def _delivered_alone(pipeline: Pipeline, workload: Workload, stored: bool = False) -> Intent:
    """A delay record of the calm run that is its id's only record and was delivered (with
    ``stored``: one that waited in the store)."""
    checker = Checker(pipeline, workload)
    count = Counter(i.delay_id for i in workload.intents)
    horizon_ms = pipeline.settings.horizon_seconds * 1000
    return next(
        i
        for i in workload.intents
        if i.kind == "delay"
        and count[i.delay_id] == 1
        and checker.deliveries.get((i.delay_id, i.due_ms))
        and (
            not stored
            or i.due_ms - (checker.ack_ms[id(i)] or 0) > horizon_ms + STORED_MARGIN_MS + 60_000
        )
    )


def _later(message: Intent, kind: Kind, after_ms: int, **changes: Any) -> Intent:
    """A record of ``message``'s id written ``after_ms`` later on its partition, past the run's
    last offset (acknowledged by the checker's caller)."""
    return dataclasses.replace(
        message, kind=kind, send_ms=message.send_ms + after_ms, offset=10**6 + after_ms, **changes
    )


@contextmanager
def planted(
    pipeline: Pipeline, workload: Workload, added: list[Intent], log: list[Produced] | None = None
) -> Iterator[Checker]:
    """A checker of the run with ``added`` records (acknowledged when written) and, if given,
    ``log`` as what reached the target cluster; the run is restored afterwards."""
    intents, original = workload.intents, pipeline.cluster.log
    workload.intents = [*intents, *added]
    if log is not None:
        pipeline.cluster.log = log
    try:
        checker = Checker(pipeline, workload)
        for i in added:
            checker.ack_ms[id(i)] = i.send_ms + 500
        yield checker
    finally:
        workload.intents, pipeline.cluster.log = intents, original


def _kinds(checker: Checker) -> set[str]:
    return {v.kind for v in checker.run().violations}


def test_two_messages_sharing_id_and_due_time_are_told_apart() -> None:
    pipeline, workload = calm_run()
    first = _delivered_alone(pipeline, workload)
    again = _later(first, "delay", 1_000, value=b"another value")  # never delivered
    with planted(pipeline, workload, [again]) as checker:
        assert _kinds(checker) == {"lost"}


def test_a_delivery_with_the_other_messages_value_is_the_others() -> None:
    pipeline, workload = calm_run()
    first = _delivered_alone(pipeline, workload, stored=True)
    cancel = _later(first, "cancel", 100, headers=[(c.HEADER_CANCEL, first.delay_id.encode())])
    again = _later(first, "delay", 1_000, value=b"another value")
    # The first is cancelled in time; the second goes out, carrying the first's value.
    log = [
        p for p in pipeline.cluster.log if p.record.header(c.HEADER_ID) != first.delay_id.encode()
    ]
    swapped = next(
        p for p in pipeline.cluster.log if p.record.header(c.HEADER_ID) == first.delay_id.encode()
    )
    with planted(pipeline, workload, [cancel, again], [*log, swapped]) as checker:
        # The delivery is the cancelled one's (its bytes), and the second is lost.
        assert _kinds(checker) == {"cancel", "lost"}


def test_a_cancel_written_after_delivery_time_does_not_excuse_a_loss() -> None:
    pipeline, workload = calm_run()
    message = _delivered_alone(pipeline, workload)
    late = _later(
        message,
        "cancel",
        message.due_ms - message.send_ms + 3_600_000,
        headers=[(c.HEADER_CANCEL, message.delay_id.encode())],
    )
    log = [
        p for p in pipeline.cluster.log if p.record.header(c.HEADER_ID) != message.delay_id.encode()
    ]
    with planted(pipeline, workload, [late], log) as checker:
        assert _kinds(checker) == {"lost"}


def _reschedule(message: Intent, after_ms: int, was_due: int, new_due: int) -> Intent:
    headers = [
        (c.HEADER_RESCHEDULE, message.delay_id.encode()),
        (c.HEADER_WAS_DUE, str(was_due).encode()),
        (c.HEADER_DELIVER_AT, str(new_due).encode()),
    ]
    return _later(
        message,
        "reschedule",
        after_ms,
        headers=headers,
        key=None,
        value=None,
        due_ms=new_due,
        was_due_ms=was_due,
    )


def test_a_timely_reschedule_of_a_stored_message_is_never_refused() -> None:
    pipeline, workload = calm_run()
    message = _delivered_alone(pipeline, workload, stored=True)
    move = _reschedule(message, 2_000, message.due_ms, message.due_ms + 60_000)
    with planted(pipeline, workload, [move]) as checker:
        checker.rejects[(move.partition, move.offset)] = (str(Reason.RESCHEDULE_NOT_FOUND), None)
        assert _kinds(checker) == {"reschedule"}


def test_a_chain_of_reschedules_delivered_at_the_first_time_is_a_violation() -> None:
    pipeline, workload = calm_run()
    message = _delivered_alone(pipeline, workload, stored=True)
    moved = message.due_ms + 120_000
    first = _reschedule(message, 2_000, message.due_ms, moved)
    second = _reschedule(message, 2_020, moved, moved + 60_000)  # in the same batch
    with planted(pipeline, workload, [first, second]) as checker:
        violations = checker.run().violations
    assert {v.kind for v in violations} == {"reschedule"}
    assert any("old time" in v.detail for v in violations)


def test_a_message_delivered_at_its_old_and_its_new_time_is_a_violation() -> None:
    """Whatever the reschedule's timing (here too late to be sure to win): it either moves the
    message or not, never both."""
    pipeline, workload = calm_run()
    message = _delivered_alone(pipeline, workload, stored=True)
    moved = message.due_ms + 120_000
    late = _reschedule(message, message.due_ms - message.send_ms - 500, message.due_ms, moved)
    old = next(
        p for p in pipeline.cluster.log if p.record.header(c.HEADER_ID) == message.delay_id.encode()
    )
    at_new = {c.HEADER_DUE_MS, c.HEADER_EMITTED_MS}
    headers = tuple((n, str(moved).encode() if n in at_new else v) for n, v in old.record.headers)
    copy = dataclasses.replace(
        old, record=dataclasses.replace(old.record, headers=headers), at_ms=moved
    )
    with planted(pipeline, workload, [late]) as checker:
        assert _kinds(checker) == set()
    with planted(pipeline, workload, [late], [*pipeline.cluster.log, copy]) as checker:
        violations = checker.run().violations
    assert {v.kind for v in violations} == {"reschedule"}
    assert any("more than one of its times" in v.detail for v in violations)


def test_a_quota_reject_with_the_quota_unused_is_a_violation() -> None:
    pipeline, workload = limited_run()
    checker = Checker(pipeline, workload)
    verdict = checker.run()
    assert verdict.over_quota > 0
    assert "refused" not in {v.kind for v in verdict.violations}
    generous = json.loads(workload.limits)
    generous[METERED]["ingest_per_second"] = 1_000
    checker.limits = parse_limits(json.dumps(generous))
    assert {v.kind for v in checker.run().violations} == {"refused"}


def _corners(workload: Workload) -> Counter[str]:
    """How often a run writes each corner of the contract."""
    by_id: dict[str, list[Intent]] = {}
    for i in workload.intents:
        by_id.setdefault(i.delay_id, []).append(i)
    found: Counter[str] = Counter()
    for records in by_id.values():
        found["off-partition"] += sum(1 for i in records if i.partition != partition_of(i.delay_id))
        sends = [i for i in records if i.kind == "delay"]
        dues = [i.due_ms for i in sends]
        found["same due"] += len(dues) - len(set(dues))
        found["same due, large"] += len(sends) > len(set(dues)) and all(
            len(i.value or b"") >= LARGE_BYTES for i in sends
        )
        found["same due-second"] += len(dues) - len({d // 1000 for d in dues})
        controls = sorted(i.send_ms for i in records if i.kind in ("cancel", "reschedule"))
        gaps = [b - a for a, b in pairwise(controls)]
        found["chain in one batch"] += any(g <= 40 for g in gaps)
        found["chain across batches"] += any(g >= 500 for g in gaps)
        moves = [i for i in records if i.kind == "reschedule"]
        found["reschedule of a reschedule"] += any(
            m.was_due_ms == n.due_ms for m in moves for n in moves
        )
    return found


def test_the_fixed_seeds_write_the_contracts_corners() -> None:
    found = sum((_corners(generate(random.Random(s), 0, Shape())) for s in range(16)), Counter())
    assert set(found) == {
        "off-partition",
        "same due",
        "same due, large",
        "same due-second",
        "chain in one batch",
        "chain across batches",
        "reschedule of a reschedule",
    }
    assert min(found.values()) >= 3, found
