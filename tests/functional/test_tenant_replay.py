"""Tenant limits under replay: a redelivered batch and a lost counter response reach the
decisions of the first attempt (admitted, refused, deferred, the same release slot)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from delayq import constants as c
from delayq.ingest import IngestResult
from delayq.shaping import Shaper
from delayq.store import request_from_item
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.factories import ClientProxy, client_error
from tests.functional.conftest import Pipeline

LIMITS = {
    "bulk": {"release_per_second": 40},
    "noisy": {"ingest_per_second": 3},
    "patient": {"ingest_per_second": 2, "over_quota": "defer"},
}
STORED_DUE_MS = NOW_MS + 3_600_000 + 400  # beyond the horizon: stored by its release time


@pytest.fixture
def limited(pipeline: Pipeline) -> Pipeline:
    """The pipeline with the tenant limits of LIMITS (and a watermark just behind now)."""
    settings = pipeline.settings.with_overrides(tenant_limits=json.dumps(LIMITS))
    pipeline.set_watermark(NOW_MS // 1000 - 1)
    return dataclasses.replace(
        pipeline, settings=settings, shaper=Shaper(pipeline.store, settings.limits)
    )


def batch() -> dict[str, Any]:
    """60 of bulk's (cap 40/s), 5 of noisy's (quota 3/s), 5 of patient's (quota 2/s, defer)."""
    counts = {"bulk": 60, "noisy": 5, "patient": 5}
    records = [
        kafka_record(
            offset=100 * n + i,
            target="reminders",
            deliver_at=str(STORED_DUE_MS),
            id=f"{tenant}-{i}",
            tenant=tenant,
            value=f"{tenant}-{i}".encode(),
        )
        for n, (tenant, count) in enumerate(counts.items())
        for i in range(count)
    ]
    return kafka_event(*records)


def stored(p: Pipeline) -> Counter[tuple[str, int]]:
    """``(delay id, release second)`` of every message item in the table."""
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    requests = [request_from_item(i) for i in items if i["kind"]["S"] == c.KIND_MESSAGE]
    return Counter((r.delay_id, r.release_at_ms // 1000) for r in requests)


def released(p: Pipeline) -> dict[str, int]:
    """The release second of each stored message."""
    return dict(stored(p).keys())


def rejected_offsets(p: Pipeline) -> list[int]:
    return sorted(r["source"]["offset"] for r in p.aws.bodies(p.settings.reject_queue_url))


def assert_first_attempt_decisions(p: Pipeline, result: IngestResult) -> None:
    """What one ingest of ``batch()`` decides: noisy's first 3 admitted, patient's last 3
    deferred, bulk's 60 over two seconds."""
    assert sorted(r.offset or 0 for r in result.rejected) == [103, 104]
    assert result.deferred == 3
    due = STORED_DUE_MS // 1000
    seconds = released(p)
    assert Counter(s for i, s in seconds.items() if i.startswith("bulk-")) == {
        due: 40,
        due + 1: 20,
    }
    assert [seconds[f"noisy-{i}"] for i in range(3)] == [due] * 3
    assert [seconds[f"patient-{i}"] for i in range(5)] == [due, due, due, due, due + 1]


def test_a_redelivered_batch_reaches_the_decisions_of_the_first_attempt(
    limited: Pipeline,
) -> None:
    first = limited.ingest(batch())
    assert_first_attempt_decisions(limited, first)
    limited.clock.advance(1_500)  # redelivered a second later, by another container
    again = dataclasses.replace(limited, shaper=Shaper(limited.store, limited.settings.limits))
    second = again.ingest(batch())
    assert sorted(r.offset or 0 for r in second.rejected) == [103, 104]
    assert second.deferred == first.deferred
    # Each message is stored once, in the slot the first attempt gave it.
    assert set(stored(limited).values()) == {1}
    assert_first_attempt_decisions(limited, first)
    # No record the first attempt kept was rejected by the second.
    assert set(rejected_offsets(limited)) == {103, 104}


def test_the_same_container_ingesting_a_batch_again_gives_the_same_slots(
    limited: Pipeline,
) -> None:
    first = limited.ingest(batch())
    second = limited.ingest(batch())
    assert (second.capped, second.deferred) == (first.capped, first.deferred)
    assert set(stored(limited).values()) == {1}
    assert_first_attempt_decisions(limited, first)


def test_a_lost_counter_response_is_not_counted_twice(limited: Pipeline) -> None:
    lost: set[str] = set()

    def update_item(**kwargs: Any) -> Any:
        answer = limited.aws.dynamodb.update_item(**kwargs)
        pk = kwargs["Key"][c.ATTR_PK]["S"]
        if pk.startswith((c.RATE_PK_PREFIX, c.QUOTA_PK_PREFIX)) and pk not in lost:
            lost.add(pk)  # the write took effect; its caller sees a server error
            raise client_error("InternalServerError", status=500, operation="UpdateItem")
        return answer

    proxy = ClientProxy(limited.aws.dynamodb, update_item=update_item)
    flaky = limited.with_store_client(proxy)
    flaky = dataclasses.replace(flaky, shaper=Shaper(flaky.store, limited.settings.limits))
    result = flaky.ingest(batch())
    assert lost  # the counters' first responses were lost
    assert_first_attempt_decisions(limited, result)
    assert set(stored(limited).values()) == {1}
    assert rejected_offsets(limited) == [103, 104]


def record_of(tenant: str, partition: int, offset: int) -> dict[str, Any]:
    """``tenant``'s record at ``offset`` of ``partition``, due at STORED_DUE_MS."""
    name = f"{tenant}-{partition}-{offset}"
    return kafka_record(
        offset=offset,
        partition=partition,
        target="reminders",
        deliver_at=str(STORED_DUE_MS),
        id=name,
        tenant=tenant,
        value=name.encode(),
    )


def test_a_redelivered_batch_holding_more_records_keeps_the_first_decisions(
    limited: Pipeline,
) -> None:
    """Kafka retries a batch from its first offset with the records there by then: the
    retry holds more records than the first attempt. The records both attempts hold are
    decided as the first time (never kept by one and rejected by the other); the new ones
    get what the quota has left."""
    records = [record_of("noisy", 0, i) for i in range(5)]
    first = limited.ingest(kafka_event(*records[:2]))
    assert first.rejected == []
    limited.clock.advance(1_500)
    again = dataclasses.replace(limited, shaper=Shaper(limited.store, limited.settings.limits))
    second = again.ingest(kafka_event(*records))
    assert sorted(r.offset or 0 for r in second.rejected) == [3, 4]
    assert set(stored(limited)) == {(f"noisy-0-{i}", STORED_DUE_MS // 1000) for i in range(3)}
    assert rejected_offsets(limited) == [3, 4]


def test_release_slots_of_a_redelivered_batch_of_two_partitions_holding_more_records(
    limited: Pipeline,
) -> None:
    """The cap's slots (40/s) of a batch of two partitions: a retry holding more records of
    both gives the first attempt's records the slots they had, the new ones what is left."""
    due = STORED_DUE_MS // 1000

    def attempt(per_partition: int) -> list[dict[str, Any]]:
        return [record_of("bulk", p, i) for p in (0, 1) for i in range(per_partition)]

    limited.ingest(kafka_event(*attempt(20)))
    first = released(limited)
    assert set(first.values()) == {due}
    again = dataclasses.replace(limited, shaper=Shaper(limited.store, limited.settings.limits))
    again.ingest(kafka_event(*attempt(30)))
    assert set(stored(limited).values()) == {1}  # each message stored once
    seconds = released(limited)
    assert {i: seconds[i] for i in first} == first
    assert Counter(seconds.values()) == {due: 40, due + 1: 20}
