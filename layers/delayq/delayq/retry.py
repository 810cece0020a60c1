"""Retries with exponential back-off and full jitter, bounded by the invocation's deadline.

Batch APIs (DynamoDB ``BatchWriteItem``, SQS ``SendMessageBatch``) fail per item with HTTP 200;
:func:`retry_partial` resends only the items that failed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from delayq.exceptions import OutOfTimeError, RetriesExhaustedError

__all__ = [
    "AWS_ERRORS",
    "NETWORK_ERRORS",
    "RETRYABLE_CANCELLATIONS",
    "RETRYABLE_CODES",
    "Backoff",
    "Deadline",
    "cancellation_codes",
    "error_code",
    "is_retryable",
    "retry_call",
    "retry_partial",
]

T = TypeVar("T")

RETRYABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "RequestThrottled",
        "InternalServerError",
        "InternalFailure",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "TransactionInProgressException",
        # A plain write of an item a transaction is using at that moment (DynamoDB refuses it).
        "TransactionConflictException",
    }
)

# Why DynamoDB cancels a transaction that another try may complete.
RETRYABLE_CANCELLATIONS = frozenset(
    {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
)


# What a call can raise that is not the service's answer: the network failed (connection
# refused or reset, DNS, TLS, read timeout). botocore's own retries (standard mode) have
# already been spent when one of these reaches us.
NETWORK_ERRORS: tuple[type[BotoCoreError], ...] = (BotoConnectionError, HTTPClientError)
# Everything a boto3 call may raise: the service's answer or botocore's own failure.
AWS_ERRORS: tuple[type[Exception], ...] = (ClientError, BotoCoreError)


def is_retryable(error: BaseException) -> bool:
    """Throttling, server-side and network errors are worth another try; client mistakes
    (a bad parameter, a refused condition, missing credentials) are not."""
    if isinstance(error, NETWORK_ERRORS):
        return True
    if not isinstance(error, ClientError):
        return False
    code = error.response.get("Error", {}).get("Code", "")
    if code == "TransactionCanceledException":
        # Cancelled by a conflict with another write or by throttling: worth another try;
        # by a failed condition: not.
        reasons = set(cancellation_codes(error))
        return bool(reasons & RETRYABLE_CANCELLATIONS) and "ConditionalCheckFailed" not in reasons
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in RETRYABLE_CODES or status >= 500


def cancellation_codes(error: ClientError) -> list[str]:
    """Why DynamoDB cancelled a transaction: a code per item in the transaction's order (the
    string ``"None"`` for an item that would have held); empty for any other error."""
    reasons = error.response.get("CancellationReasons", [])
    return [str(r.get("Code", "None")) for r in reasons]


def error_code(error: BaseException) -> str:
    """The service's error code, or the exception's class name for a network error."""
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", "error"))
    return type(error).__name__


class Deadline:
    """Time left in the invocation, from a Lambda context or a fixed budget."""

    def __init__(self, remaining_ms: Callable[[], int], safety_ms: int = 2000) -> None:
        self._remaining_ms = remaining_ms
        self.safety_ms = safety_ms

    @classmethod
    def from_context(cls, context: Any, safety_ms: int = 2000) -> Deadline:
        """Use ``context.get_remaining_time_in_millis`` (Lambda's own clock)."""
        return cls(context.get_remaining_time_in_millis, safety_ms)

    @classmethod
    def after(cls, seconds: float, safety_ms: int = 0) -> Deadline:
        """A deadline ``seconds`` from now (tests, local tools)."""
        end = time.monotonic() + seconds
        return cls(lambda: int((end - time.monotonic()) * 1000), safety_ms)

    def remaining_seconds(self) -> float:
        """Usable seconds left (after the safety margin); may be negative."""
        return (self._remaining_ms() - self.safety_ms) / 1000

    def expired(self) -> bool:
        """True when no usable time is left."""
        return self.remaining_seconds() <= 0


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with full jitter: sleep uniform(0, min(cap, base * 2**attempt))."""

    base_seconds: float = 0.05
    cap_seconds: float = 2.0
    max_attempts: int = 8
    rng: random.Random = field(default_factory=random.Random, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delay(self, attempt: int) -> float:
        """The jittered pause before retry number ``attempt`` (0-based)."""
        return self.rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2**attempt))


def retry_partial(
    operation: str,
    send: Callable[[list[T]], Sequence[T]],
    items: Sequence[T],
    backoff: Backoff,
    deadline: Deadline,
) -> None:
    """Call ``send`` until it accepts every item; ``send`` returns the items it did not take.

    A retryable exception (throttling, 5xx, a network error) retries the whole remaining set;
    any other exception propagates.
    Raises :class:`RetriesExhaustedError` carrying the unsent items when attempts run out
    (:class:`OutOfTimeError` when time does), so the caller can fail the invocation (or
    report those items) and lose nothing.
    """
    pending = list(items)
    last_error = ""
    for attempt in range(backoff.max_attempts):
        if not pending:
            return
        try:
            pending = list(send(pending))
            last_error = f"{len(pending)} item(s) rejected by the service"
        except AWS_ERRORS as e:
            if not is_retryable(e):
                raise
            last_error = f"{error_code(e)}: {e}"
        if not pending:
            return
        pause = backoff.delay(attempt)
        if attempt + 1 == backoff.max_attempts:
            break
        if deadline.remaining_seconds() < pause:
            raise OutOfTimeError(operation, pending, last_error)
        backoff.sleep(pause)
    raise RetriesExhaustedError(operation, pending, last_error)


def retry_call(operation: str, call: Callable[[], T], backoff: Backoff, deadline: Deadline) -> T:
    """Call a single (non-batch) API with the same policy; returns its result."""
    box: list[T] = []

    def attempt(_: list[int]) -> list[int]:
        box.append(call())
        return []

    retry_partial(operation, attempt, [0], backoff, deadline)
    return box[0]
