"""The demo's mixed workload: delays on both paths, a same-second burst, cancels, bad records.

Every planned record is known in advance, so the report can say exactly what was expected:
which ids must arrive (and when), which were cancelled, and which records must be rejected and
for what reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from delayq import constants as c
from delayq_local.producer import DelayProducer, Due, Header

DEFAULT_TARGETS: Final = ("demo.orders", "demo.reminders")


def invalid_records(target: str, other: str) -> dict[str, list[Header]]:
    """One invalid record per reason the ingest function must give (`contract.Reason` values);
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


@dataclass(frozen=True)
class Planned:
    """A valid delay request: its id, target, how its due time is given, and that due time."""

    delay_id: str
    target: str
    due: Due
    due_ms: int
    kind: str


@dataclass(frozen=True)
class PlannedInvalid:
    """A record the ingest function must reject, marked by its value."""

    marker: str
    reason: str
    headers: tuple[Header, ...]


@dataclass(frozen=True)
class Workload:
    """Everything the demo sends. Due times are relative to `start_ms` (the broker timestamps
    of relative requests are a few milliseconds later, which the report tolerates)."""

    start_ms: int
    messages: tuple[Planned, ...]
    invalid: tuple[PlannedInvalid, ...]

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
    ) -> Workload:
        """A reproducible mix of `total` records (at least one of each kind)."""
        rng = random.Random(seed)
        burst = max(1, round(total * burst_fraction))
        cancelled = max(1, round(total * cancel_fraction))
        kinds = invalid_records(targets[0], targets[-1])
        invalid = max(len(kinds), round(total * invalid_fraction))
        regular = max(1, total - burst - cancelled - invalid)
        messages: list[Planned] = []
        for i in range(regular):
            delay_ms = round(rng.uniform(0, max_delay_seconds) * 1000)
            form = i % 3
            due = (
                Due(seconds=delay_ms / 1000)
                if form == 0
                else Due(ms=delay_ms)
                if form == 1
                else Due(at_ms=start_ms + delay_ms)
            )
            messages.append(
                Planned(f"r-{i}", targets[i % len(targets)], due, start_ms + delay_ms, "regular")
            )
        burst_due = start_ms + round(max_delay_seconds * 0.4) * 1000
        messages.extend(
            Planned(f"b-{i}", targets[0], Due(at_ms=burst_due), burst_due, "burst")
            for i in range(burst)
        )
        for i in range(cancelled):
            delay_ms = round(rng.uniform(max_delay_seconds * 0.6, max_delay_seconds) * 1000)
            messages.append(
                Planned(f"c-{i}", targets[-1], Due(ms=delay_ms), start_ms + delay_ms, "cancelled")
            )
        reasons = list(kinds)
        bad = tuple(
            PlannedInvalid(f"invalid-{i}", reason, tuple(kinds[reason]))
            for i, reason in ((i, reasons[i % len(reasons)]) for i in range(invalid))
        )
        rng.shuffle(messages)
        return cls(start_ms, tuple(messages), bad)

    @property
    def expected(self) -> dict[str, Planned]:
        """The requests that must be delivered, by id."""
        return {m.delay_id: m for m in self.messages if m.kind != "cancelled"}

    @property
    def cancelled(self) -> dict[str, Planned]:
        """The requests cancelled after they were sent, by id."""
        return {m.delay_id: m for m in self.messages if m.kind == "cancelled"}

    @property
    def last_due_ms(self) -> int:
        """The latest due time of any planned request."""
        return max(m.due_ms for m in self.messages)

    def send(self, producer: DelayProducer) -> None:
        """Produce every request and every invalid record (not the cancels)."""
        for m in self.messages:
            producer.send(
                m.target,
                m.due,
                value=m.delay_id.encode(),
                key=m.delay_id.encode(),
                delay_id=m.delay_id,
                headers=[("demo-kind", m.kind.encode())],
            )
        for bad in self.invalid:
            producer.send_raw(bad.headers, value=bad.marker.encode())
        producer.flush()

    def send_cancels(self, producer: DelayProducer) -> None:
        """Produce a cancel record for every request planned to be cancelled."""
        for delay_id in self.cancelled:
            producer.cancel(delay_id)
        producer.flush()
