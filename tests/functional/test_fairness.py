"""Fairness through the wired pipeline: a capped tenant's burst goes out at its cap and never
early while another tenant's messages keep their time; quotas reject (bytes kept) or defer;
each priority class waits in its own delay queue."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from delayq import constants as c
from delayq.emitter import EmitResult
from delayq.envelope import dead_letter_of, decode_body
from delayq.producing import Delivery
from delayq.queues import DelayQueue, SqsQueue
from delayq.records import Reason
from delayq.shaping import Shaper
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import control_headers, kafka_event, kafka_record
from testkit.kafka import FakeProducer
from tests.factories import ClientProxy, client_error
from tests.functional.conftest import Pipeline

LIMITS = {
    "bulk": {"release_per_second": 40},
    "noisy": {"ingest_per_second": 3},
    "patient": {"ingest_per_second": 2, "over_quota": "defer"},
}
DUE_MS = NOW_MS + 90_000 + 400  # within the look-ahead: ingest queues it at once


@pytest.fixture
def limited(pipeline: Pipeline) -> Pipeline:
    """The pipeline with the tenant limits of LIMITS (and a watermark just behind now)."""
    settings = pipeline.settings.with_overrides(tenant_limits=json.dumps(LIMITS))
    pipeline.set_watermark(NOW_MS // 1000 - 1)
    return dataclasses.replace(
        pipeline, settings=settings, shaper=Shaper(pipeline.store, settings.limits)
    )


def records(tenant: str, count: int, due_ms: int, first_offset: int, **control: str) -> list[Any]:
    return [
        kafka_record(
            offset=first_offset + i,
            target="reminders",
            deliver_at=str(due_ms),
            id=f"{tenant}-{i}",
            tenant=tenant,
            value=f"{tenant}-{i}".encode(),
            headers=control_headers(**control),
        )
        for i in range(count)
    ]


def deliveries_by_tenant(deliveries: list[Delivery]) -> dict[str, list[Delivery]]:
    out: dict[str, list[Delivery]] = {}
    for d in deliveries:
        out.setdefault(d.tenant, []).append(d)
    return out


def test_a_capped_burst_keeps_its_cap_and_the_bystanders_keep_their_time(limited: Pipeline) -> None:
    burst = records("bulk", 200, DUE_MS, 0)
    bystanders = [
        kafka_record(
            offset=1000 + i,
            target="reminders",
            deliver_at=str(DUE_MS + i * 250),
            id=f"b-{i}",
            tenant="steady",
        )
        for i in range(20)
    ]
    ingested = limited.ingest(kafka_event(*burst, *bystanders))
    assert ingested.rejected == []
    assert ingested.capped == 160
    delivered = limited.deliver_released()
    by_tenant = deliveries_by_tenant(delivered.deliveries)
    assert len(by_tenant["bulk"]) == 200
    assert len(by_tenant["steady"]) == 20
    # Never early, never late beyond the slot the cap gave, never more than the cap a second.
    assert all(d.emitted_ms >= d.due_ms for d in delivered.deliveries)
    per_second = Counter(d.emitted_ms // 1000 for d in by_tenant["bulk"])
    assert max(per_second.values()) <= 40
    assert sorted(per_second) == [DUE_MS // 1000 + s for s in range(5)]
    # The cap's wait is counted apart from lateness: nothing here was late.
    assert max(d.lateness_ms for d in delivered.deliveries) == 0
    assert sorted({d.cap_delay_ms > 0 for d in by_tenant["bulk"]}) == [False, True]
    # The bystanders went at their due time although the burst was released around them.
    assert all(d.emitted_ms == d.due_ms and d.cap_delay_ms == 0 for d in by_tenant["steady"])


def test_a_capped_message_says_when_it_was_released(limited: Pipeline) -> None:
    limited.ingest(kafka_event(*records("bulk", 41, DUE_MS, 0)))
    limited.deliver_released()
    released = {
        o.header("delay-id"): o.headers for o in limited.producer.produced if o.topic == "reminders"
    }
    last = dict(released[b"bulk-40"])
    assert int(last[c.HEADER_RELEASE_MS] or b"0") == (DUE_MS // 1000 + 1) * 1000
    assert int(last[c.HEADER_DUE_MS] or b"0") == DUE_MS
    assert c.HEADER_RELEASE_MS not in dict(released[b"bulk-0"])


def test_a_capped_burst_beyond_the_look_ahead_is_stored_by_its_release(limited: Pipeline) -> None:
    due_ms = NOW_MS + 3_600_000 + 400
    limited.ingest(kafka_event(*records("bulk", 90, due_ms, 0)))
    assert limited.delayed() == []
    limited.pass_empty_seconds()
    # The scheduler's window reaches the last release second.
    limited.clock.now_ms = due_ms - limited.settings.lookahead_seconds * 1000 + 3000
    while limited.schedule().sent:
        pass
    queued = [x.request for e in limited.delayed() for x in decode_body(e.body) if x.request]
    assert len(queued) == 90
    assert Counter(r.release_at_ms // 1000 for r in queued) == {
        due_ms // 1000: 40,
        due_ms // 1000 + 1: 40,
        due_ms // 1000 + 2: 10,
    }
    delivered = limited.deliver_released()
    assert len(delivered.deliveries) == 90
    assert all(d.emitted_ms >= max(d.due_ms, d.release_ms) for d in delivered.deliveries)


# --- the cap while the pipeline catches up ----------------------------------------------------


def outage(p: Pipeline, burst: int, outage_ms: int) -> None:
    """Ingest ``burst`` of bulk's messages due at DUE_MS (slots over burst / 40 seconds) and
    keep the target unreachable for ``outage_ms`` from then: every delivery is retried."""
    assert p.ingest(kafka_event(*records("bulk", burst, DUE_MS, 0))).capped == burst - 40
    p.producer.unavailable = True
    while p.clock() < DUE_MS + outage_ms:
        p.deliver_released()
    assert p.producer.produced == []
    p.producer.unavailable = False


def catch_up(p: Pipeline, expected: int) -> EmitResult:
    """The emitter, behind after the outage, takes every retry waiting in the delay queue in
    one batch (they are all visible by then), then what the queue releases after it."""
    waiting = [e for e in p.delayed() if id(e) not in p.handed_over]
    total = EmitResult()
    if waiting:
        p.clock.now_ms = max(p.clock.now_ms, *(e.release_ms for e in waiting))
        p.handed_over.update(id(e) for e in waiting)
        total = p.emit(waiting)
    for _ in range(100):
        if len(total.deliveries) >= expected:
            break
        done = p.deliver_released()
        total.deliveries += done.deliveries
        total.cap_held += done.cap_held
        total.errors += done.errors
        total.failed += done.failed
    return total


def test_after_a_target_outage_the_catch_up_keeps_the_cap_in_every_second(
    limited: Pipeline,
) -> None:
    outage(limited, 200, 120_000)
    result = catch_up(limited, 200)
    assert sorted(d.delay_id for d in result.deliveries) == sorted(f"bulk-{i}" for i in range(200))
    per_second = Counter(d.emitted_ms // 1000 for d in result.deliveries)
    assert max(per_second.values()) <= 40
    assert len(per_second) >= 5  # the burst was spread again, not sent at once
    assert result.cap_held > 0
    # Those held past this invocation went back to the delay queue carrying their new slot.
    resent = [x.request for e in limited.delayed() for x in decode_body(e.body) if x.request]
    assert {r.paced_ms % 1000 for r in resent if r.paced_ms} == {0}
    assert any(r.paced_ms for r in resent)
    # Never early, nothing dead-lettered, no SQS message failed: held ones were re-sent.
    assert all(d.emitted_ms >= max(d.due_ms, d.release_ms) for d in result.deliveries)
    assert limited.dead_lettered() == []
    assert result.failed == []
    # Its lateness still counts from the slot ingest gave it: the outage shows.
    assert min(d.lateness_ms for d in result.deliveries) >= 120_000 - 60_000


def test_late_messages_go_before_later_on_time_ones(limited: Pipeline) -> None:
    # 800 at 40/s hold the cap's seconds for 20 s after due. The emitter is 3 s behind: the
    # first 120 reach it late. They claim the seconds from the emitter's hold ahead on, and the
    # on-time messages of those seconds are displaced after them (before, the late ones took
    # only the room the burst left: after its end).
    limited.ingest(kafka_event(*records("bulk", 800, DUE_MS, 0)))
    limited.clock.now_ms = DUE_MS + 3_000
    behind = [e for e in limited.delayed() if e.release_ms < DUE_MS + 3_000]
    limited.handed_over.update(id(e) for e in behind)
    deliveries = limited.emit(behind).deliveries
    for _ in range(100):  # then SQS releases the rest at their times
        if len(deliveries) >= 800:
            break
        deliveries += limited.deliver_released().deliveries
    assert sorted(d.delay_id for d in deliveries) == sorted(f"bulk-{i}" for i in range(800))
    assert max(Counter(d.emitted_ms // 1000 for d in deliveries).values()) <= 40
    due_s = DUE_MS // 1000
    late = [d for d in deliveries if max(d.due_ms, d.release_ms) // 1000 < due_s + 3]
    assert len(late) == 120
    # From the emitter's hold + 2 s ahead, three seconds for the 120.
    assert max(d.emitted_ms for d in late) < (due_s + 13) * 1000
    assert all(d.emitted_ms >= max(d.due_ms, d.release_ms) for d in deliveries)


def test_without_strict_caps_the_same_catch_up_exceeds_the_cap(limited: Pipeline) -> None:
    limited.settings = limited.settings.with_overrides(strict_caps=0)
    outage(limited, 200, 120_000)
    result = catch_up(limited, 200)
    assert len(result.deliveries) == 200
    assert max(Counter(d.emitted_ms // 1000 for d in result.deliveries).values()) > 40
    assert result.cap_held == 0


def test_on_time_the_emitter_makes_no_call_for_the_cap(limited: Pipeline) -> None:
    limited.ingest(kafka_event(*records("bulk", 200, DUE_MS, 0)))
    proxy = ClientProxy(limited.aws.dynamodb, update_item=limited.aws.dynamodb.update_item)
    delivered = limited.with_store_client(proxy).deliver_released()
    assert len(delivered.deliveries) == 200
    assert max(Counter(d.emitted_ms // 1000 for d in delivered.deliveries).values()) == 40
    # No counter is touched (the control clocks the first read creates are not counters).
    touched = [kw["Key"]["pk"]["S"] for _, kw in proxy.calls]
    assert [pk for pk in touched if not pk.startswith("clock#")] == []
    assert delivered.cap_held == 0


def test_when_the_cap_counter_fails_nothing_goes_over_it_and_nothing_is_lost(
    limited: Pipeline,
) -> None:
    outage(limited, 80, 30_000)
    throttled = True

    def update_item(**kwargs: Any) -> Any:
        if throttled and kwargs["Key"]["pk"]["S"].startswith(c.RATE_PK_PREFIX):
            raise client_error("ThrottlingException")
        return limited.aws.dynamodb.update_item(**kwargs)

    proxy = ClientProxy(limited.aws.dynamodb, update_item=update_item)
    down = limited.with_store_client(proxy)
    while limited.clock() < DUE_MS + 90_000:
        held = down.deliver_released()
        assert held.deliveries == []  # fail closed: no token, no delivery
        assert held.failed == []  # re-sent, not failed: no receive used up
    assert any("release cap: " in e and "ThrottlingException" in e for e in held.errors)
    assert limited.dead_lettered() == []
    throttled = False
    result = catch_up(down, 80)
    assert sorted(d.delay_id for d in result.deliveries) == sorted(f"bulk-{i}" for i in range(80))
    assert max(Counter(d.emitted_ms // 1000 for d in result.deliveries).values()) <= 40


def test_a_slot_whose_second_ends_while_it_is_claimed_is_not_used(limited: Pipeline) -> None:
    limited.ingest(kafka_event(*records("bulk", 1, DUE_MS, 0)))
    (entry,) = limited.delayed()
    limited.handed_over.add(id(entry))
    limited.clock.now_ms = DUE_MS + 5_000  # late: its slot was DUE_MS's second

    def slow_update_item(**kwargs: Any) -> Any:
        answer = limited.aws.dynamodb.update_item(**kwargs)
        # The claim returns when the second it claimed may already be checked.
        limited.clock.advance(limited.settings.max_hold_ms + c.RESCHEDULE_MARGIN_MS + 1_000)
        return answer

    proxy = ClientProxy(limited.aws.dynamodb, update_item=slow_update_item)
    result = limited.with_store_client(proxy).emit([entry])
    assert result.deliveries == []
    assert result.failed == []
    (resent,) = [e for e in limited.delayed() if e is not entry]
    assert resent.release_ms == limited.clock()  # back at once, to claim a later second
    delivered = catch_up(limited, 1)
    assert [d.delay_id for d in delivered.deliveries] == ["bulk-0"]
    assert all(d.emitted_ms // 1000 > (DUE_MS + 5_000) // 1000 for d in delivered.deliveries)


def test_ingest_leaves_a_capped_message_past_its_slot_to_the_emitter(limited: Pipeline) -> None:
    # Ingest behind: due two seconds ago, within its cap; the direct path would send it at once.
    late = records("bulk", 1, NOW_MS - 2000, 0) + records("steady", 1, NOW_MS - 2000, 10)
    result = limited.ingest(kafka_event(*late), direct=True)
    assert [d.delay_id for d in result.deliveries] == ["steady-0"]
    queued = [x.request for e in limited.delayed() for x in decode_body(e.body) if x.request]
    assert [r.delay_id for r in queued] == ["bulk-0"]
    delivered = catch_up(limited, 1)
    assert [d.delay_id for d in delivered.deliveries] == ["bulk-0"]


def test_under_strict_caps_a_capped_message_due_now_goes_through_the_emitter(
    limited: Pipeline,
) -> None:
    # Due in this second, within its cap: the direct path leaves it to the emitter, which
    # checks whether late messages took its second (a message produced by ingest in the next
    # second would also land in a second whose counter did not count it: found by the
    # simulator with tenant limits, seed 52).
    due_ms = NOW_MS - NOW_MS % 1000 + 500
    limited.clock.now_ms = due_ms - 300
    result = limited.ingest(
        kafka_event(*records("bulk", 1, due_ms, 0), *records("steady", 1, due_ms, 10)),
        direct=True,
    )
    assert [d.delay_id for d in result.deliveries] == ["steady-0"]
    queued = [x.request for e in limited.delayed() for x in decode_body(e.body) if x.request]
    assert [(r.delay_id, r.release_rank) for r in queued] == [("bulk-0", 0)]
    delivered = limited.deliver_released()
    assert [d.delay_id for d in delivered.deliveries] == ["bulk-0"]


def test_a_capped_message_whose_second_ends_while_the_emitter_holds_it_comes_back(
    limited: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On time when the emitter takes it, but its hold ends in the next second (the container
    # was paused): it goes back to the delay queue to claim a later second.
    limited.ingest(kafka_event(*records("bulk", 1, DUE_MS, 0)))
    (entry,) = limited.delayed()
    limited.handed_over.add(id(entry))
    limited.clock.now_ms = DUE_MS - 200
    sleep = limited.clock.sleep
    monkeypatch.setattr(limited.clock, "sleep", lambda seconds: sleep(seconds + 1.0))
    result = limited.emit([entry])
    assert result.deliveries == []
    assert result.failed == []
    (resent,) = [e for e in limited.delayed() if e is not entry]
    assert resent.release_ms == limited.clock()  # back at once
    monkeypatch.setattr(limited.clock, "sleep", sleep)
    delivered = catch_up(limited, 1)
    assert [d.delay_id for d in delivered.deliveries] == ["bulk-0"]
    assert all(d.emitted_ms // 1000 > DUE_MS // 1000 for d in delivered.deliveries)


def test_without_strict_caps_ingest_sends_it_direct(limited: Pipeline) -> None:
    limited.settings = limited.settings.with_overrides(strict_caps=0)
    result = limited.ingest(kafka_event(*records("bulk", 1, NOW_MS - 2000, 0)), direct=True)
    assert [d.delay_id for d in result.deliveries] == ["bulk-0"]


def test_over_its_quota_a_tenant_is_rejected_with_its_bytes_and_the_batch_goes_on(
    limited: Pipeline,
) -> None:
    noisy = records("noisy", 5, DUE_MS, 0)
    others = records("steady", 2, DUE_MS, 100)
    result = limited.ingest(kafka_event(*noisy, *others))
    assert [r.reason for r in result.rejected] == [Reason.QUOTA_EXCEEDED] * 2
    rejects = limited.aws.bodies(limited.settings.reject_queue_url)
    assert sorted(r["source"]["offset"] for r in rejects) == [3, 4]
    assert {r["reason"] for r in rejects} == {"quota-exceeded"}
    assert rejects[0]["detail"] == "tenant 'noisy' is over its ingest quota of 3 messages/s"
    assert {base64.b64decode(r["record"]["value"]) for r in rejects} == {b"noisy-3", b"noisy-4"}
    delivered = limited.deliver_released()
    assert sorted(d.delay_id for d in delivered.deliveries) == [
        "noisy-0",
        "noisy-1",
        "noisy-2",
        "steady-0",
        "steady-1",
    ]


def test_over_its_quota_a_deferring_tenant_is_accepted_and_released_at_the_quota_rate(
    limited: Pipeline,
) -> None:
    result = limited.ingest(kafka_event(*records("patient", 6, DUE_MS, 0)))
    assert (result.rejected, result.deferred) == ([], 4)
    delivered = limited.deliver_released()
    assert len(delivered.deliveries) == 6
    assert all(d.emitted_ms >= d.due_ms for d in delivered.deliveries)
    seconds = Counter(d.emitted_ms // 1000 for d in delivered.deliveries)
    assert seconds == {DUE_MS // 1000: 4, DUE_MS // 1000 + 1: 2}


@pytest.fixture
def classes(limited: Pipeline) -> Pipeline:
    """The pipeline with a delay queue per priority class, as the template declares them."""
    urls = {
        priority: limited.aws.sqs.create_queue(QueueName=f"delayq-delay-{priority}")["QueueUrl"]
        for priority in (c.PRIORITY_HIGH, c.PRIORITY_LOW)
    }
    settings = limited.settings.with_overrides(
        delay_queue_high_url=urls[c.PRIORITY_HIGH], delay_queue_low_url=urls[c.PRIORITY_LOW]
    )
    backoff = no_sleep_backoff()
    queue = DelayQueue(
        SqsQueue(as_sqs_client(limited.sqs), settings.delay_queue_url, backoff),
        settings.emit_lead_ms,
        by_priority={k: SqsQueue(as_sqs_client(limited.sqs), u, backoff) for k, u in urls.items()},
    )
    return dataclasses.replace(limited, settings=settings, delay_queue=queue)


def queued_in(p: Pipeline, url: str) -> list[str]:
    return sorted(
        x.request.delay_id for e in p.sqs.to(url) for x in decode_body(e.body) if x.request
    )


def test_each_priority_waits_in_its_own_delay_queue(classes: Pipeline) -> None:
    p = classes
    batch = [
        *records("hi", 2, DUE_MS, 0, priority="high"),
        *records("lo", 30, DUE_MS, 10, priority="low"),
        *records("mid", 2, DUE_MS, 50),
    ]
    p.ingest(kafka_event(*batch))
    assert queued_in(p, p.settings.delay_queue_high_url) == ["hi-0", "hi-1"]
    assert len(queued_in(p, p.settings.delay_queue_low_url)) == 30
    assert queued_in(p, p.settings.delay_queue_url) == ["mid-0", "mid-1"]


def test_a_message_not_yet_due_goes_back_to_the_queue_it_came_from(classes: Pipeline) -> None:
    p = classes
    far = DUE_MS + 100_000  # still within the look-ahead: queued by ingest
    p.ingest(kafka_event(*records("lo", 1, far, 0, priority="low")))
    [entry] = p.sqs.to(p.settings.delay_queue_low_url)
    url = p.settings.delay_queue_low_url
    p.aws.sqs.send_message(QueueUrl=url, MessageBody=entry.body)
    [message] = p.aws.sqs.receive_message(QueueUrl=url)["Messages"]
    early = dataclasses.replace(entry, sent_ms=p.clock.now_ms, delay_seconds=0)
    result = p.emit([early], receipt_handles=[message["ReceiptHandle"]])
    assert result.redelayed == 1
    assert [(u, h) for u, h, _ in p.sqs.visibility_changes] == [(url, message["ReceiptHandle"])]
    assert p.producer.produced == []


@pytest.mark.parametrize("priority", [c.PRIORITY_HIGH, c.PRIORITY_LOW])
def test_a_dead_letter_that_cannot_be_sent_waits_again_in_its_priority_queue(
    classes: Pipeline, priority: str
) -> None:
    # The target refuses the last allowed attempt and the dead-letter queue refuses the dead
    # letter: the message goes back to the delay queue of its own priority (a low one never
    # takes the normal queue's concurrency, a high one never waits behind its bursts).
    def send_message_batch(**_: object) -> object:
        raise client_error("AccessDenied", status=403)

    p = classes
    p.settings = p.settings.with_overrides(delivery_max_attempts=1)
    p.producer = FakeProducer(fail_topics={"reminders"}, clock=p.clock)
    p.dead_letters = DelayQueue(
        SqsQueue(
            as_sqs_client(ClientProxy(p.sqs, send_message_batch=send_message_batch)),
            p.settings.delay_dlq_url,
            no_sleep_backoff(),
        ),
        p.settings.emit_lead_ms,
    )
    url = {c.PRIORITY_HIGH: p.settings.delay_queue_high_url}.get(
        priority, p.settings.delay_queue_low_url
    )
    p.ingest(kafka_event(*records("bulk", 1, NOW_MS, 0, priority=priority)))
    [queued] = p.sqs.to(url)
    result = p.emit([queued])
    assert "dead-letter queue" in " ".join(result.errors)
    assert (result.dead_lettered, result.requeued, result.failed) == (0, 1, [])
    assert queued_in(p, p.settings.delay_queue_url) == []
    assert queued_in(p, url) == ["bulk-0", "bulk-0"]  # the ingested one, and again
    assert p.sqs.to(url)[-1].delay_seconds == c.EMIT_RETRY_MAX_SECONDS


def test_a_late_message_the_cap_has_no_room_for_is_not_dead_lettered_as_target_unavailable(
    limited: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bulk's burst holds its cap's seconds for 20 s after due (800 at 40/s); an outage of 30 s
    # makes them all late: the catch-up places the oldest first, at most its spread (2 s) ahead.
    # The target is up: those that then wait for the cap longer than the outage allowance
    # (10 s here) are dead-lettered with a reason that says it is the cap.
    monkeypatch.setattr(c, "CATCH_UP_SPREAD_SECONDS", 2)
    limited.settings = limited.settings.with_overrides(target_outage_max_seconds=10)
    outage(limited, 800, 30_000)
    for _ in range(40):
        limited.clock.advance(1_000)
        limited.deliver_released()
    reasons = Counter(
        (dead_letter_of(x.text) or {}).get("reason")
        for e in limited.dead_lettered()
        for x in decode_body(e.body)
    )
    assert "release-cap-full" in reasons
    assert "target-unavailable" not in reasons


def test_a_producer_of_another_delay_topic_cannot_spend_a_bound_tenants_quota(
    pipeline: Pipeline,
) -> None:
    bound = {
        "victim": {"ingest_per_second": 3, "topics": ["delay-victim"]},
        "*": {"ingest_per_second": 100},
    }
    settings = pipeline.settings.with_overrides(tenant_limits=json.dumps(bound))
    pipeline.set_watermark(NOW_MS // 1000 - 1)
    p = dataclasses.replace(
        pipeline, settings=settings, shaper=Shaper(pipeline.store, settings.limits)
    )
    forged = [
        kafka_record(
            offset=i, target="reminders", deliver_at=str(DUE_MS), id=f"f-{i}", tenant="victim"
        )
        for i in range(5)
    ]
    honest = [
        kafka_record(
            topic="delay-victim",
            offset=i,
            target="reminders",
            deliver_at=str(DUE_MS),
            id=f"v-{i}",
            tenant="victim",
        )
        for i in range(3)
    ]
    assert p.ingest(kafka_event(*forged)).rejected == []  # counted in the unknown bucket
    assert p.ingest(kafka_event(*honest)).rejected == []  # the victim's quota is whole
    delivered = p.deliver_released()
    tenants = Counter(d.tenant for d in delivered.deliveries)
    assert tenants == {"victim": 3, "*unknown": 5}
