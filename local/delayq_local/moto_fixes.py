"""Changes to moto's SQS, applied once in the process hosting the embedded server.

They replace moto internals, so they are tied to one moto version (`WRITTEN_FOR`): `apply()`
refuses any other, and tests/integration/test_moto_fixes.py says, for each change, whether the
installed moto still needs it. After a moto upgrade: run that test, drop what moto now does
itself, check that the rest still holds, then set `WRITTEN_FOR`.

Speed, same behaviour: moto computes "now" through datetime arithmetic, and checks each received
message's retention by building all of the queue's attributes, three of which count the whole
queue. A receive of 10 messages from a queue holding 1,000 thus took close to a second, and the
emitter's latency and throughput followed. The replacements compute the same values directly.

Fidelity: moto drops a FIFO message as a duplicate only while the first message with that
de-duplication id is still in the queue; SQS drops it for 5 minutes after the first was sent,
deleted or not. The wrapper keeps the ids for those 5 minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import version
from typing import Any, Final

from moto.core import utils as moto_utils
from moto.sqs import models as sqs_models

from delayq_local.exceptions import LocalStackError

WRITTEN_FOR: Final = "5.2.5"
DEDUPLICATION_WINDOW_MS: Final = 5 * 60 * 1000
_PRUNE_ABOVE: Final = 1000
_lock = threading.Lock()
_applied = False


def _unix_time(dt: datetime | None = None) -> float:
    return time.time() if dt is None else moto_utils.unix_time(dt)


def _unix_time_millis(dt: datetime | None = None) -> float:
    return _unix_time(dt) * 1000.0


def _retained(backend: Any, queue_name: str, message: Any) -> bool:
    queue = backend.get_queue(queue_name)
    retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000
    return bool(retain_until > time.time())


def _deduplicating(add_message: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def add(queue: Any, message: Any) -> None:
        if queue.fifo_queue and message.deduplication_id:
            scope = message.group_id if queue.deduplication_scope == "messageGroup" else None
            key = (scope, message.deduplication_id)
            now = int(message.sent_timestamp)
            with _lock:
                seen: dict[tuple[str | None, str], int] = queue.__dict__.setdefault(
                    "_delayq_deduplication", {}
                )
                first = seen.get(key)
                if first is not None and now - first < DEDUPLICATION_WINDOW_MS:
                    return
                seen[key] = now
                if len(seen) > _PRUNE_ABOVE:
                    for old in [k for k, t in seen.items() if now - t >= DEDUPLICATION_WINDOW_MS]:
                        del seen[old]
        add_message(queue, message)

    return add


def applied() -> bool:
    """Whether `apply()` has run in this process."""
    return _applied


def apply() -> None:
    """Install the changes (idempotent); fail loudly on another moto than `WRITTEN_FOR`, or if
    moto no longer has the originals."""
    global _applied  # noqa: PLW0603 (one process-wide switch)
    installed = version("moto")
    if installed != WRITTEN_FOR:
        raise LocalStackError(
            f"moto {installed} is installed; delayq_local.moto_fixes replaces SQS internals of "
            f"moto {WRITTEN_FOR}. Run tests/integration/test_moto_fixes.py to see which changes "
            "the new moto still needs, then update moto_fixes and its WRITTEN_FOR."
        )
    with _lock:
        if _applied:
            return
        backend, queue = sqs_models.SQSBackend, sqs_models.Queue
        for owner, name in (
            (sqs_models, "unix_time"),
            (sqs_models, "unix_time_millis"),
            (backend, "is_message_valid_based_on_retention_period"),
            (queue, "add_message"),
        ):
            if not callable(getattr(owner, name, None)):
                raise LocalStackError(f"moto changed: {owner.__name__}.{name} is gone")
        sqs_models.unix_time = _unix_time  # type: ignore[attr-defined]
        sqs_models.unix_time_millis = _unix_time_millis  # type: ignore[attr-defined]
        backend.is_message_valid_based_on_retention_period = _retained  # type: ignore[method-assign,assignment]
        queue.add_message = _deduplicating(queue.add_message)  # type: ignore[method-assign,assignment]
        _applied = True
