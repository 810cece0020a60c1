"""Retries: which errors are retried, back-off bounds, partial batches, deadlines."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from delayq.exceptions import OutOfTimeError, RetriesExhaustedError
from delayq.retry import Backoff, Deadline, is_retryable, retry_call, retry_partial
from testkit.clock import FakeClock, no_sleep_backoff
from testkit.lambda_context import LambdaContext
from tests.factories import client_error


class UpperBound(random.Random):
    """An rng whose uniform() always returns the upper bound, to read the back-off cap."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Flaky:
    """A batch sender that refuses the listed items on the first calls, then takes all."""

    def __init__(self, refusals: Sequence[Sequence[int]]) -> None:
        self.refusals = [list(r) for r in refusals]
        self.calls: list[list[int]] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        if len(self.calls) <= len(self.refusals):
            return [i for i in items if i in self.refusals[len(self.calls) - 1]]
        return []


def ample() -> Deadline:
    return Deadline.after(60)


# --- is_retryable ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "SlowDown",
        "TransactionConflictException",  # a write of an item a transaction holds
    ],
)
def test_throttling_and_server_codes_are_retryable(code: str) -> None:
    assert is_retryable(client_error(code))


def test_any_5xx_status_is_retryable_whatever_the_code() -> None:
    assert is_retryable(client_error("SomethingNew", status=503))


@pytest.mark.parametrize(
    "code", ["ValidationException", "ConditionalCheckFailedException", "AccessDenied"]
)
def test_client_mistakes_are_not_retryable(code: str) -> None:
    assert not is_retryable(client_error(code, status=400))


@pytest.mark.parametrize(
    ("reasons", "retryable"),
    [
        (["None", "TransactionConflict"], True),  # another write of the item was in flight
        (["ThrottlingError", "None"], True),
        (["ConditionalCheckFailed", "None"], False),
        (["ConditionalCheckFailed", "TransactionConflict"], False),  # it fails again anyway
        ([], False),
    ],
)
def test_a_cancelled_transaction_is_retried_only_for_what_another_try_may_fix(
    reasons: list[str], retryable: bool
) -> None:
    error = client_error("TransactionCanceledException")
    error.response["CancellationReasons"] = [{"Code": r} for r in reasons]
    assert is_retryable(error) is retryable


def test_non_aws_errors_are_not_retryable() -> None:
    assert not is_retryable(TimeoutError("socket"))


NETWORK_FAILURES = [
    EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com"),
    ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com"),
    ConnectTimeoutError(endpoint_url="https://s3.amazonaws.com"),
    ConnectionClosedError(endpoint_url="https://sqs.us-east-1.amazonaws.com"),
]


@pytest.mark.parametrize("error", NETWORK_FAILURES, ids=lambda e: type(e).__name__)
def test_network_errors_are_retryable(error: Exception) -> None:
    # They are not ClientError: the request never got an answer from the service.
    assert not isinstance(error, ClientError)
    assert is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [NoCredentialsError(), ParamValidationError(report="bad parameter")],
    ids=lambda e: type(e).__name__,
)
def test_botocore_errors_that_are_not_the_network_are_not_retryable(error: Exception) -> None:
    assert not is_retryable(error)


def test_a_client_error_without_error_or_metadata_is_not_retryable() -> None:
    assert not is_retryable(ClientError({}, "Operation"))


# --- Deadline ----------------------------------------------------------------------------------


def test_deadline_subtracts_the_safety_margin() -> None:
    assert Deadline(lambda: 5000, safety_ms=2000).remaining_seconds() == 3.0


@pytest.mark.parametrize(("remaining_ms", "expired"), [(2001, False), (2000, True), (0, True)])
def test_deadline_expires_when_only_the_safety_margin_is_left(
    remaining_ms: int, expired: bool
) -> None:
    assert Deadline(lambda: remaining_ms, safety_ms=2000).expired() is expired


def test_deadline_from_context_reads_lambdas_remaining_time() -> None:
    context = LambdaContext(remaining_ms=10_000)
    deadline = Deadline.from_context(context, safety_ms=1000)
    context.remaining_ms = 4000
    assert deadline.remaining_seconds() == 3.0


def test_deadline_after_counts_down_from_the_given_budget() -> None:
    remaining = Deadline.after(30).remaining_seconds()
    assert 29 < remaining <= 30


def test_deadline_after_zero_is_already_expired() -> None:
    assert Deadline.after(0).expired()


# --- Backoff -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "cap"), [(0, 0.05), (1, 0.1), (3, 0.4), (5, 1.6), (6, 2.0), (40, 2.0)]
)
def test_backoff_cap_doubles_per_attempt_up_to_cap_seconds(attempt: int, cap: float) -> None:
    assert Backoff(rng=UpperBound()).delay(attempt) == pytest.approx(cap)


def test_backoff_is_full_jitter_between_zero_and_the_cap() -> None:
    backoff = Backoff(rng=random.Random(1))
    delays = [backoff.delay(4) for _ in range(500)]
    assert all(0 <= d <= 0.8 for d in delays)
    assert min(delays) < 0.1
    assert max(delays) > 0.7


# --- retry_partial -----------------------------------------------------------------------------


def test_retry_partial_sends_once_when_everything_is_accepted() -> None:
    clock = FakeClock()
    send = Flaky([])
    retry_partial("op", send, [1, 2, 3], no_sleep_backoff(sleep=clock.sleep), ample())
    assert send.calls == [[1, 2, 3]]
    assert clock.slept == []


def test_retry_partial_resends_only_the_refused_items() -> None:
    send = Flaky([[2, 3], [3]])
    retry_partial("op", send, [1, 2, 3, 4], no_sleep_backoff(), ample())
    assert send.calls == [[1, 2, 3, 4], [2, 3], [3]]


def test_retry_partial_sleeps_the_backoff_between_attempts() -> None:
    clock = FakeClock()
    backoff = Backoff(rng=UpperBound(), sleep=clock.sleep)
    retry_partial("op", Flaky([[1], [1]]), [1], backoff, ample())
    assert clock.slept == pytest.approx([0.05, 0.1])


def test_retry_partial_does_not_call_send_for_no_items() -> None:
    send = Flaky([])
    retry_partial("op", send, [], no_sleep_backoff(), ample())
    assert send.calls == []


def test_retry_partial_gives_up_after_max_attempts_with_the_unsent_items() -> None:
    clock = FakeClock()
    send = Flaky([[2, 3]] * 10)
    with pytest.raises(RetriesExhaustedError) as caught:
        retry_partial("store things", send, [1, 2, 3], no_sleep_backoff(3, clock.sleep), ample())
    assert len(send.calls) == 3
    assert len(clock.slept) == 2
    assert caught.value.operation == "store things"
    assert caught.value.unsent == [2, 3]
    assert "2 item(s) rejected" in caught.value.last_error


def test_retry_partial_retries_a_retryable_error_with_the_same_items() -> None:
    calls: list[list[int]] = []

    def send(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise client_error("ThrottlingException")
        return []

    retry_partial("op", send, [1, 2], no_sleep_backoff(), ample())
    assert calls == [[1, 2], [1, 2]]


@pytest.mark.parametrize("error", NETWORK_FAILURES, ids=lambda e: type(e).__name__)
def test_retry_partial_retries_a_network_error_with_the_same_items(error: Exception) -> None:
    calls: list[list[int]] = []

    def send(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise error
        return []

    retry_partial("op", send, [1, 2], no_sleep_backoff(), ample())
    assert calls == [[1, 2], [1, 2]]


def test_retry_partial_turns_a_lasting_network_error_into_exhausted_retries() -> None:
    def send(items: list[int]) -> list[int]:
        raise EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com")

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_partial("op", send, [1, 2], no_sleep_backoff(3), ample())
    assert caught.value.unsent == [1, 2]
    assert caught.value.last_error.startswith("EndpointConnectionError: ")


def test_retry_partial_reports_the_last_error_code_when_exhausted() -> None:
    def send(items: list[int]) -> list[int]:
        raise client_error("ThrottlingException")

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_partial("op", send, [1], no_sleep_backoff(2), ample())
    assert caught.value.last_error.startswith("ThrottlingException: ")


def test_retry_partial_survives_a_5xx_error_without_an_error_code() -> None:
    def send(items: list[int]) -> list[int]:
        raise ClientError({"ResponseMetadata": {"HTTPStatusCode": 502}}, "Operation")

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_partial("op", send, [1], no_sleep_backoff(2), ample())
    assert caught.value.unsent == [1]


def test_retry_partial_raises_a_non_retryable_error_at_once() -> None:
    calls: list[list[int]] = []

    def send(items: list[int]) -> list[int]:
        calls.append(items)
        raise client_error("ValidationException")

    with pytest.raises(ClientError):
        retry_partial("op", send, [1], no_sleep_backoff(), ample())
    assert len(calls) == 1


def test_retry_partial_stops_when_the_deadline_is_shorter_than_the_next_pause() -> None:
    clock = FakeClock()
    send = Flaky([[1]] * 10)
    backoff = Backoff(rng=UpperBound(), sleep=clock.sleep)
    with pytest.raises(OutOfTimeError):  # a RetriesExhaustedError that says why
        retry_partial("op", send, [1], backoff, Deadline(lambda: 40, safety_ms=0))
    assert len(send.calls) == 1
    assert clock.slept == []


def test_retry_partial_out_of_attempts_is_not_out_of_time() -> None:
    send = Flaky([[1]] * 10)
    backoff = Backoff(rng=UpperBound(), sleep=lambda _: None, max_attempts=3)
    with pytest.raises(RetriesExhaustedError) as caught:
        retry_partial("op", send, [1], backoff, Deadline.after(3600))
    assert not isinstance(caught.value, OutOfTimeError)
    assert len(send.calls) == 3


def test_retry_partial_uses_time_left_for_pauses_that_fit() -> None:
    send = Flaky([[1], [1]])
    backoff = Backoff(rng=UpperBound(), sleep=lambda _: None)
    retry_partial("op", send, [1], backoff, Deadline(lambda: 100, safety_ms=0))
    assert len(send.calls) == 3


# --- retry_call --------------------------------------------------------------------------------


def test_retry_call_returns_the_result() -> None:
    assert retry_call("op", lambda: 42, no_sleep_backoff(), ample()) == 42


def test_retry_call_retries_a_retryable_error() -> None:
    outcomes: list[Exception | str] = [client_error("InternalServerError", status=500), "ok"]

    def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retry_call("op", call, no_sleep_backoff(), ample()) == "ok"
    assert outcomes == []


def test_retry_call_raises_exhausted_when_throttled_throughout() -> None:
    def call() -> str:
        raise client_error("ThrottlingException")

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_call("read watermark", call, no_sleep_backoff(3), ample())
    assert caught.value.operation == "read watermark"


def test_retry_call_propagates_other_exceptions_unchanged() -> None:
    def call() -> str:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        retry_call("op", call, no_sleep_backoff(), ample())
