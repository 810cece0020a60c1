"""What becomes of an undelivered message: retried with which back-off, or dead-lettered why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from delayq.envelope import Envelope
from delayq.kafka import Failure, Undelivered
from delayq.settings import Settings
from delayq.settlement import (
    DeadLetter,
    Retry,
    after_failure,
    outage_backoff_seconds,
    refusal_backoff_seconds,
    when_due,
)
from testkit.clock import NOW_MS
from tests.factories import delay_request

SETTINGS = Settings(delivery_max_attempts=3, target_outage_max_seconds=3600)
DUE = NOW_MS - 1000
REQUEST = delay_request(due_ms=DUE)
TEXT = Envelope(REQUEST).encode()
UNAVAILABLE = Undelivered(Failure.UNAVAILABLE, "KafkaError{code=_MSG_TIMED_OUT}")
REFUSED = Undelivered(Failure.REFUSED, "KafkaError{code=MSG_SIZE_TOO_LARGE}")


def step(
    failure: Undelivered, *, now_ms: int = NOW_MS, attempts: int = 0, failing_since_ms: int = 0
) -> Retry | DeadLetter:
    request = replace(REQUEST, attempts=attempts, failing_since_ms=failing_since_ms)
    return after_failure(
        request, Envelope(request).encode(), failure, now_ms=now_ms, settings=SETTINGS
    )


@pytest.mark.parametrize(
    ("late_ms", "seconds"),
    [(0, 2), (15_999, 2), (24_000, 3), (80_000, 10), (480_000, 60), (3_600_000, 60)],
)
def test_an_outage_backs_off_with_lateness_up_to_a_minute(late_ms: int, seconds: int) -> None:
    assert outage_backoff_seconds(REQUEST, DUE + late_ms) == seconds


def test_an_unreachable_target_does_not_use_up_attempts() -> None:
    retry = step(UNAVAILABLE, attempts=2)
    assert isinstance(retry, Retry)
    assert Envelope.decode(retry.entry.text).request.attempts == 2
    assert retry.entry.delay_seconds == 2


def test_an_hour_long_outage_is_still_retried_within_the_limit() -> None:
    retry = step(UNAVAILABLE, now_ms=DUE + 3_600_000, failing_since_ms=DUE)
    assert isinstance(retry, Retry)
    assert retry.entry.delay_seconds == 60


def test_an_outage_longer_than_the_limit_is_dead_lettered_with_the_reason() -> None:
    dead = step(UNAVAILABLE, now_ms=DUE + 3_600_001, failing_since_ms=DUE)
    assert isinstance(dead, DeadLetter)
    assert dead.reason == "target-unavailable"
    assert "after its first failed delivery" in dead.detail
    assert "_MSG_TIMED_OUT" in dead.detail


def test_a_message_that_comes_late_gets_the_whole_limit_from_its_first_failure() -> None:
    # Delivered a day after due (a scheduler outage, a redrive), it meets one failure.
    first = NOW_MS + 86_400_000
    retry = step(UNAVAILABLE, now_ms=first)
    assert isinstance(retry, Retry)
    retried = Envelope.decode(retry.entry.text).request
    assert retried.failing_since_ms == first
    assert retried.attempts == 0
    # The envelope keeps the first failure: later failures neither move it nor get more time.
    again = after_failure(
        retried, retry.entry.text, UNAVAILABLE, now_ms=first + 3_600_000, settings=SETTINGS
    )
    assert isinstance(again, Retry)
    assert Envelope.decode(again.entry.text).request.failing_since_ms == first
    dead = after_failure(
        retried, retry.entry.text, UNAVAILABLE, now_ms=first + 3_600_001, settings=SETTINGS
    )
    assert isinstance(dead, DeadLetter)


def test_a_message_its_cap_had_no_room_for_is_dead_lettered_from_its_last_slot_as_such() -> None:
    full = Undelivered(Failure.CAP_FULL, "release cap: no room within 900 s")
    paced = replace(REQUEST, paced_ms=DUE + 600_000)  # a catch-up's slot, 10 minutes on
    retry = after_failure(
        paced, Envelope(paced).encode(), full, now_ms=DUE + 3_600_001, settings=SETTINGS
    )
    assert isinstance(retry, Retry)  # an hour after due, but not after its last slot
    dead = after_failure(
        paced, Envelope(paced).encode(), full, now_ms=DUE + 4_200_001, settings=SETTINGS
    )
    assert isinstance(dead, DeadLetter)
    assert dead.reason == "release-cap-full"
    assert "after its last release slot" in dead.detail


@pytest.mark.parametrize(("attempts", "seconds"), [(1, 2), (2, 4), (5, 32), (6, 60), (20, 60)])
def test_refusals_back_off_exponentially(attempts: int, seconds: int) -> None:
    assert refusal_backoff_seconds(attempts) == seconds


def test_a_refusal_counts_an_attempt_and_retries_below_the_limit() -> None:
    retry = step(REFUSED, attempts=1)
    assert isinstance(retry, Retry)
    assert Envelope.decode(retry.entry.text).request.attempts == 2
    assert retry.entry.delay_seconds == 4


def test_the_last_allowed_refusal_is_dead_lettered_with_the_reason() -> None:
    dead = step(REFUSED, attempts=2)
    assert dead == DeadLetter(
        "target-refused", "refused 3 time(s); last: KafkaError{code=MSG_SIZE_TOO_LARGE}"
    )


def test_a_missing_payload_is_dead_lettered_at_once() -> None:
    dead = step(Undelivered(Failure.PAYLOAD_MISSING, "s3://b/payloads/x/1 does not exist"))
    assert dead == DeadLetter("payload-missing", "s3://b/payloads/x/1 does not exist")


def test_a_retry_keeps_a_pointer_a_pointer_and_counts_the_offloaded_bytes() -> None:
    offloaded = replace(REQUEST, value=None, payload_ref="s3://b/payloads/x/1", offloaded_bytes=9)
    for failure in (UNAVAILABLE, REFUSED):
        retry = after_failure(
            offloaded, Envelope(offloaded).encode(), failure, now_ms=NOW_MS, settings=SETTINGS
        )
        assert isinstance(retry, Retry)
        assert retry.entry.offloaded_bytes == 9
        again = Envelope.decode(retry.entry.text).request
        assert (again.value, again.payload_ref) == (None, "s3://b/payloads/x/1")


def test_a_message_not_due_yet_waits_until_its_due_less_the_lead() -> None:
    early = replace(REQUEST, due_ms=NOW_MS + 10_500)
    retry = when_due(early, TEXT, now_ms=NOW_MS, lead_ms=1500)
    assert (retry.entry.delay_seconds, retry.entry.text) == (9, TEXT)
