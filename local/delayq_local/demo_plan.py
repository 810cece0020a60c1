"""The demo's mixed workload: delays on both paths, a same-second burst, cancels, bad records,
and (for `delayq report`) requests due hours to days ahead that stay pending.

Every planned record is known in advance, so the report can say exactly what was expected:
which ids must arrive (and when), which were cancelled, and which records must be rejected and
for what reason. Records are written as a producer writes them: at a steady rate over a send
window, with the burst written all in one moment (its requests are also due in one second);
a window of 0 writes everything at once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from delayq import constants as c
from delayq_local.exceptions import LocalStackError
from delayq_local.producer import Due, Header

DEFAULT_TARGETS: Final = ("demo.orders", "demo.reminders")
# Delays of the requests left pending: an hour to three days, inside the backlog forecast's
# seven days.
PENDING_DELAY_SECONDS: Final = (3600.0, 3 * 86400.0)


def invalid_records(target: str, other: str) -> dict[str, list[Header]]:
    """One invalid record per reason the ingest function must give (`records.Reason` values);
    `target` and `other` are allowed targets."""
    valid = (c.HEADER_TARGET, target.encode())
    return {
        "missing-target": [(c.HEADER_DELAY_SECONDS, b"5")],
        "target-not-allowed": [
            (c.HEADER_TARGET, b"forbidden.topic"),
            (c.HEADER_DELAY_SECONDS, b"5"),
        ],
        "missing-due": [valid],
        "bad-due": [valid, (c.HEADER_DELAY_SECONDS, b"soon")],
        "conflicting-due": [valid, (c.HEADER_DELAY_SECONDS, b"5"), (c.HEADER_DELAY_MS, b"5000")],
        "delay-too-long": [valid, (c.HEADER_DELAY_SECONDS, b"999999999")],
        "bad-id": [valid, (c.HEADER_DELAY_SECONDS, b"5"), (c.HEADER_ID, b"   ")],
        "bad-headers": [valid, (c.HEADER_TARGET, other.encode()), (c.HEADER_DELAY_SECONDS, b"5")],
    }


class Writer(Protocol):
    """What the workload writes through (a `DelayProducer`)."""

    def send(
        self,
        target: str,
        due: Due,
        *,
        value: bytes | None = ...,
        key: bytes | None = ...,
        delay_id: str | None = ...,
        headers: Sequence[Header] = ...,
    ) -> None:
        """Queue one delay request."""

    def cancel(self, delay_id: str) -> None:
        """Queue a cancel record."""

    def send_raw(
        self, headers: Sequence[Header], *, value: bytes | None = ..., key: bytes | None = ...
    ) -> None:
        """Queue a record with exactly these headers."""

    def flush(self, timeout: float = ...) -> None:
        """Wait for every queued record's acknowledgement; raise if any failed."""


@dataclass(frozen=True)
class Planned:
    """A valid delay request: its id, target, how its due time is given, that due time, and
    when it is written (`send_ms` after the workload's start)."""

    delay_id: str
    target: str
    due: Due
    due_ms: int
    kind: str
    send_ms: int
    delay_ms: int  # how long after it is written it is due


@dataclass(frozen=True)
class PlannedInvalid:
    """A record the ingest function must reject, marked by its value."""

    marker: str
    reason: str
    headers: tuple[Header, ...]
    send_ms: int = 0


@dataclass(frozen=True)
class Workload:
    """Everything the demo sends. Times are epoch milliseconds from `start_ms`: a record is
    written `send_ms` after it (the broker timestamps of relative requests are a few
    milliseconds later, which the report tolerates); a cancel `cancel_after_ms` after the
    request it cancels."""

    start_ms: int
    messages: tuple[Planned, ...]
    invalid: tuple[PlannedInvalid, ...]
    cancel_after_ms: int = 5000

    @classmethod
    def generate(
        cls,
        start_ms: int,
        total: int = 3000,
        *,
        max_delay_seconds: float = 240.0,
        burst_fraction: float = 0.1,
        cancel_fraction: float = 0.05,
        invalid_fraction: float = 0.02,
        targets: tuple[str, ...] = DEFAULT_TARGETS,
        seed: int = 7,
        send_seconds: float = 0.0,
        cancel_after_seconds: float = 5.0,
        pending: int = 0,
    ) -> Workload:
        """A reproducible mix of `total` records (at least one of each kind), written over
        `send_seconds`: each at a uniformly drawn moment of the window, the burst all at its
        middle, the requests to cancel in its first half. `pending` more requests are due
        `PENDING_DELAY_SECONDS` ahead: nobody waits for them (they are not `expected`), they
        stay in the table for the backlog forecast."""
        if send_seconds < 0:
            raise LocalStackError(f"send window must be 0 s or more, not {send_seconds}")
        rng = random.Random(seed)
        window_ms = round(send_seconds * 1000)

        def sent(within_ms: int) -> int:
            return round(rng.uniform(0, within_ms)) if within_ms else 0

        burst = max(1, round(total * burst_fraction))
        cancelled = max(1, round(total * cancel_fraction))
        kinds = invalid_records(targets[0], targets[-1])
        invalid = max(len(kinds), round(total * invalid_fraction))
        regular = max(1, total - burst - cancelled - invalid)
        messages: list[Planned] = []
        for i in range(regular):
            at = sent(window_ms)
            delay_ms = round(rng.uniform(0, max_delay_seconds) * 1000)
            form = i % 3
            due = (
                Due(seconds=delay_ms / 1000)
                if form == 0
                else Due(ms=delay_ms)
                if form == 1
                else Due(at_ms=start_ms + at + delay_ms)
            )
            messages.append(
                Planned(
                    f"r-{i}",
                    targets[i % len(targets)],
                    due,
                    start_ms + at + delay_ms,
                    "regular",
                    at,
                    delay_ms,
                )
            )
        burst_at = window_ms // 2
        burst_delay = round(max_delay_seconds * 0.4) * 1000
        burst_due = start_ms + burst_at + burst_delay
        messages.extend(
            Planned(
                f"b-{i}",
                targets[0],
                Due(at_ms=burst_due),
                burst_due,
                "burst",
                burst_at,
                burst_delay,
            )
            for i in range(burst)
        )
        for i in range(cancelled):
            at = sent(window_ms // 2)
            delay_ms = round(rng.uniform(max_delay_seconds * 0.6, max_delay_seconds) * 1000)
            messages.append(
                Planned(
                    f"c-{i}",
                    targets[-1],
                    Due(ms=delay_ms),
                    start_ms + at + delay_ms,
                    "cancelled",
                    at,
                    delay_ms,
                )
            )
        reasons = list(kinds)
        bad = tuple(
            PlannedInvalid(f"invalid-{i}", reason, tuple(kinds[reason]), sent(window_ms))
            for i, reason in ((i, reasons[i % len(reasons)]) for i in range(invalid))
        )
        for i in range(pending):
            at = sent(window_ms)
            delay_ms = round(rng.uniform(*PENDING_DELAY_SECONDS) * 1000)
            messages.append(
                Planned(
                    f"p-{i}",
                    targets[i % len(targets)],
                    Due(ms=delay_ms),
                    start_ms + at + delay_ms,
                    "pending",
                    at,
                    delay_ms,
                )
            )
        rng.shuffle(messages)
        return cls(start_ms, tuple(messages), bad, round(cancel_after_seconds * 1000))

    @property
    def expected(self) -> dict[str, Planned]:
        """The requests that must be delivered during the run, by id."""
        return {m.delay_id: m for m in self.messages if m.kind not in {"cancelled", "pending"}}

    @property
    def pending(self) -> dict[str, Planned]:
        """The requests due hours to days ahead, left pending, by id."""
        return {m.delay_id: m for m in self.messages if m.kind == "pending"}

    @property
    def cancelled(self) -> dict[str, Planned]:
        """The requests cancelled after they were sent, by id."""
        return {m.delay_id: m for m in self.messages if m.kind == "cancelled"}

    @property
    def last_due_ms(self) -> int:
        """The latest due time of any planned request but the pending ones."""
        return max(m.due_ms for m in self.messages if m.kind != "pending")

    @property
    def last_send_ms(self) -> int:
        """When the last record is written (a cancel included), after `start_ms`."""
        cancels = (m.send_ms + self.cancel_after_ms for m in self.cancelled.values())
        return max(
            (*(m.send_ms for m in self.messages), *(b.send_ms for b in self.invalid), *cancels)
        )

    def schedule(self, producer: Writer) -> list[tuple[int, Callable[[], None]]]:
        """Every write in the order of its moment: `(ms after start, write)`."""
        writes: list[tuple[int, Callable[[], None]]] = []
        for m in self.messages:
            writes.append((m.send_ms, _request(producer, m)))
            if m.kind == "cancelled":
                writes.append((m.send_ms + self.cancel_after_ms, _cancel(producer, m.delay_id)))
        writes.extend((b.send_ms, _invalid(producer, b)) for b in self.invalid)
        writes.sort(key=lambda write: write[0])
        return writes


class Sender:
    """Writes a workload in a thread, each record at its moment; `done` once the broker has
    acknowledged them all, `error` if it did not."""

    def __init__(self, workload: Workload, producer: Writer) -> None:
        self._writes = workload.schedule(producer)
        self._producer = producer
        self._start = workload.start_ms / 1000
        self.done = threading.Event()
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="demo-sender", daemon=True)

    def start(self) -> Sender:
        """Start writing."""
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread; re-raise what stopped it."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            for at_ms, write in self._writes:
                wait = self._start + at_ms / 1000 - time.time()
                if wait > 0:
                    time.sleep(wait)
                write()
            self._producer.flush()
        except Exception as error:  # noqa: BLE001 -- handed to the waiting thread by join()
            self.error = error
        finally:
            self.done.set()


def _request(producer: Writer, m: Planned) -> Callable[[], None]:
    def write() -> None:
        producer.send(
            m.target,
            m.due,
            value=m.delay_id.encode(),
            key=m.delay_id.encode(),
            delay_id=m.delay_id,
            headers=[("demo-kind", m.kind.encode())],
        )

    return write


def _cancel(producer: Writer, delay_id: str) -> Callable[[], None]:
    return lambda: producer.cancel(delay_id)


def _invalid(producer: Writer, bad: PlannedInvalid) -> Callable[[], None]:
    return lambda: producer.send_raw(bad.headers, value=bad.marker.encode())
