"""Reschedule's pure parts: which record of a batch wins, and what a copy keeps."""

from __future__ import annotations

from dataclasses import replace

from delayq.records import RescheduleRequest
from delayq.reschedule import chains, copy_of
from testkit.clock import NOW_MS
from tests.factories import delay_request


def move(delay_id: str, offset: int, ts_ms: int) -> RescheduleRequest:
    return RescheduleRequest(delay_id, NOW_MS, NOW_MS + offset, f"delay-requests-0-{offset}", ts_ms)


def test_the_reschedules_of_an_id_are_chained_in_their_records_order() -> None:
    first, tie, older, other = move("a", 1, 10), move("a", 2, 10), move("a", 3, 5), move("b", 4, 1)
    # Timestamps first, then the offset on a tie; whatever order the batch holds them in.
    assert chains([tie, first, older, other]) == [[older, first, tie], [other]]


def test_across_partitions_a_tie_is_broken_by_partition_then_offset() -> None:
    late_partition = RescheduleRequest("a", NOW_MS, NOW_MS + 1, "delay-requests-10-1", 10)
    early_partition = RescheduleRequest("a", NOW_MS, NOW_MS + 2, "delay-requests-2-7", 10)
    assert chains([late_partition, early_partition]) == [[early_partition, late_partition]]


def test_a_copy_keeps_record_time_payload_and_tenant_but_not_the_old_release_slot() -> None:
    original = replace(
        delay_request(payload_ref="s3://b/payloads/x/1", value=None),
        ts_ms=NOW_MS - 5,
        release_ms=NOW_MS + 90_000,
        attempts=2,
        tenant="t-1",
        offloaded_bytes=300_000,
    )
    r = move("order-1", 9, NOW_MS)
    copy = copy_of(original, r)
    assert (copy.due_ms, copy.release_ms, copy.attempts) == (r.due_ms, 0, 0)
    assert (copy.moved_ts_ms, copy.moved_src) == (r.ts_ms, r.src)
    assert (copy.ts_ms, copy.src, copy.tenant) == (original.ts_ms, original.src, "t-1")
    assert (copy.payload_ref, copy.offloaded_bytes) == (original.payload_ref, 300_000)
