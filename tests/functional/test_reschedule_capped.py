"""Reschedules of messages a tenant's release cap stored away from their due second: the
caller names the due time it knows, never the release slot the cap chose."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from delayq import constants as c
from delayq.shaping import Shaper
from delayq.store import request_from_item
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.functional.conftest import Pipeline
from tests.functional.test_reschedule import deliver_around, emitted, move, rejects

DUE_MS = NOW_MS + 3_600_000 + 400  # beyond the horizon: stored
LATER_MS = DUE_MS + 1_800_000


@pytest.fixture
def capped(pipeline: Pipeline) -> Pipeline:
    """The pipeline with tenant ``bulk`` capped at one release a second."""
    settings = pipeline.settings.with_overrides(
        tenant_limits=json.dumps({"bulk": {"release_per_second": 1}})
    )
    pipeline.set_watermark(NOW_MS // 1000 - 1)
    return dataclasses.replace(
        pipeline, settings=settings, shaper=Shaper(pipeline.store, settings.limits)
    )


def burst(count: int) -> dict[str, Any]:
    """``count`` messages of bulk, all due at DUE_MS: the cap releases them a second apart."""
    return kafka_event(
        *(
            kafka_record(
                offset=i,
                timestamp=NOW_MS + i,
                target="reminders",
                deliver_at=str(DUE_MS),
                id=f"b-{i}",
                tenant="bulk",
                value=f"b-{i}".encode(),
            )
            for i in range(count)
        )
    )


def release_seconds(p: Pipeline) -> dict[str, int]:
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    requests = [request_from_item(i) for i in items if i["kind"]["S"] == c.KIND_MESSAGE]
    return {r.delay_id: r.release_at_ms // 1000 for r in requests if not r.moved_src}


def release(p: Pipeline) -> None:
    """Run the scheduler and the emitter over the burst's three release seconds."""
    for second in range(3):
        deliver_around(p, DUE_MS + second * 1000)


def test_a_capped_message_is_moved_by_its_due_time(capped: Pipeline) -> None:
    capped.ingest(burst(3))
    seconds = release_seconds(capped)
    assert sorted(seconds.values()) == [DUE_MS // 1000 + n for n in range(3)]
    last = max(seconds, key=seconds.__getitem__)  # released two seconds after its due time

    result = capped.ingest(kafka_event(move(10, LATER_MS, was_due_ms=DUE_MS, delay_id=last)))

    assert result.rescheduled == 1
    assert rejects(capped) == []
    release(capped)
    assert last not in {delay_id for delay_id, _, _ in emitted(capped)}
    deliver_around(capped, LATER_MS)
    assert (last, LATER_MS, last.encode()) in emitted(capped)
    assert len(emitted(capped)) == 3


def test_a_reschedule_naming_the_release_slot_instead_of_the_due_time_is_refused(
    capped: Pipeline,
) -> None:
    capped.ingest(burst(3))
    seconds = release_seconds(capped)
    last = max(seconds, key=seconds.__getitem__)
    slot_ms = seconds[last] * 1000

    capped.ingest(kafka_event(move(10, LATER_MS, was_due_ms=slot_ms, delay_id=last)))

    assert [r["reason"] for r in rejects(capped)] == ["reschedule-not-found"]
    release(capped)
    assert last in {delay_id for delay_id, _, _ in emitted(capped)}


def test_a_burst_placed_away_from_its_due_second_costs_a_few_placement_items(
    capped: Pipeline,
) -> None:
    capped.ingest(burst(3))
    items = capped.aws.dynamodb.scan(TableName=capped.settings.table_name)["Items"]
    placed = [json.loads(i[c.ATTR_PLACEMENTS]["S"]) for i in items if i["kind"]["S"] == "placed"]
    seconds = release_seconds(capped)
    # The two placed after their due second, one item per id group they fall in.
    assert sorted([key.partition("#")[0], off] for pairs in placed for key, off in pairs) == sorted(
        [i, s - DUE_MS // 1000] for i, s in seconds.items() if s != DUE_MS // 1000
    )
    assert len(placed) <= 2
    assert not [i for i in items if i["kind"]["S"] == c.KIND_LOCATOR]  # no id index
