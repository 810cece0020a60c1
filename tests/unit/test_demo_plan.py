"""The demo's workload: written like a producer writes (a steady rate over a window, the burst at
one moment, each cancel after its request), and the sender that writes it at those moments."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import pytest

from delayq_local.demo_plan import DEFAULT_TARGETS, PENDING_DELAY_SECONDS, Sender, Workload
from delayq_local.exceptions import LocalStackError
from delayq_local.producer import Due, Header

START_MS = 1_700_000_000_000


def test_records_are_spread_over_the_window_the_burst_written_at_one_moment() -> None:
    w = Workload.generate(START_MS, 600, max_delay_seconds=60, send_seconds=30)

    regular = [m.send_ms for m in w.messages if m.kind == "regular"]
    assert 0 <= min(regular) < 3_000
    assert 27_000 < max(regular) <= 30_000
    # Steady: every tenth of the window holds some of them.
    assert len({at // 3_000 for at in regular}) == 10
    burst = {(m.send_ms, m.due_ms) for m in w.messages if m.kind == "burst"}
    assert burst == {(15_000, START_MS + 15_000 + 24_000)}
    assert all(0 <= b.send_ms <= 30_000 for b in w.invalid)


def test_each_due_time_counts_from_the_moment_its_request_is_written() -> None:
    w = Workload.generate(START_MS, 300, max_delay_seconds=60, send_seconds=20)

    for m in w.messages:
        assert 0 <= m.delay_ms <= 60_000
        assert m.due_ms == START_MS + m.send_ms + m.delay_ms
        if m.due.at_ms is not None:
            assert m.due.at_ms == m.due_ms
        else:
            assert (m.due.ms or round((m.due.seconds or 0) * 1000)) == m.delay_ms


def test_a_cancel_is_written_after_its_request_and_before_its_due_time() -> None:
    w = Workload.generate(START_MS, 300, max_delay_seconds=60, send_seconds=20)
    order = w.schedule(_Recorder())

    assert w.cancelled
    for m in w.cancelled.values():
        assert m.send_ms <= 10_000  # the first half of the window
        assert m.send_ms + w.cancel_after_ms < m.delay_ms
    assert [at for at, _ in order] == sorted(at for at, _ in order)
    assert w.last_send_ms == max(at for at, _ in order)


def test_no_window_writes_everything_at_once_and_cancels_after_the_wait() -> None:
    w = Workload.generate(START_MS, 200, cancel_after_seconds=3)

    assert {m.send_ms for m in w.messages} == {0}
    assert Counter(at for at, _ in w.schedule(_Recorder())) == {
        0: len(w.messages) + len(w.invalid),
        3_000: len(w.cancelled),
    }


def test_pending_requests_are_due_hours_to_days_ahead_and_nobody_waits_for_them() -> None:
    plain = Workload.generate(START_MS, 300, max_delay_seconds=60, send_seconds=20)
    w = Workload.generate(START_MS, 300, max_delay_seconds=60, send_seconds=20, pending=12)

    assert len(w.pending) == 12
    assert all(m.kind == "pending" and m.delay_id.startswith("p-") for m in w.pending.values())
    low, high = PENDING_DELAY_SECONDS
    for m in w.pending.values():
        assert low * 1000 <= m.delay_ms <= high * 1000
        assert m.due_ms == START_MS + m.send_ms + m.delay_ms
        assert 0 <= m.send_ms <= 20_000
    assert not set(w.pending) & set(w.expected)
    assert w.expected == plain.expected  # the rest of the workload is as without them
    assert w.last_due_ms == plain.last_due_ms <= START_MS + 80_000
    assert {m.target for m in w.pending.values()} == set(DEFAULT_TARGETS)
    sent = [write for at, write in w.schedule(_Recorder())]
    assert len(sent) == len(plain.schedule(_Recorder())) + 12


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(LocalStackError, match="send window must be 0 s or more"):
        Workload.generate(START_MS, 100, send_seconds=-1)


def test_the_sender_writes_each_record_at_its_moment_never_before() -> None:
    start_ms = int(time.time() * 1000) + 100
    w = Workload.generate(start_ms, 60, max_delay_seconds=60, send_seconds=0.4)
    w = Workload(start_ms, w.messages, w.invalid, cancel_after_ms=200)
    producer = _Recorder()

    sender = Sender(w, producer).start()
    sender.join(10)

    assert sender.done.is_set()
    planned = {m.delay_id: m.send_ms for m in w.messages}
    sent = [(at, delay_id) for at, kind, delay_id in producer.writes if kind == "send"]
    assert sorted(delay_id for _, delay_id in sent) == sorted(planned)
    for at, delay_id in sent:
        assert at >= start_ms + planned[delay_id]
    cancels = [(at, delay_id) for at, kind, delay_id in producer.writes if kind == "cancel"]
    assert sorted(d for _, d in cancels) == sorted(w.cancelled)
    for at, delay_id in cancels:
        assert at >= start_ms + planned[delay_id] + 200
    assert len([k for _, k, _ in producer.writes if k == "raw"]) == len(w.invalid)
    assert producer.flushed


def test_a_failure_to_write_reaches_the_caller() -> None:
    producer = _Recorder(fail=True)
    sender = Sender(Workload.generate(int(time.time() * 1000), 20), producer).start()

    with pytest.raises(LocalStackError, match="broker said no"):
        sender.join(10)
    assert sender.done.is_set()


class _Recorder:
    """A Writer (as DelayProducer is), recording when each write happened (epoch ms)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.writes: list[tuple[int, str, str]] = []
        self.flushed = False
        self._fail = fail

    def send(
        self,
        target: str,
        due: Due,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        delay_id: str | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        self._write("send", delay_id or "")

    def cancel(self, delay_id: str) -> None:
        self._write("cancel", delay_id)

    def send_raw(
        self, headers: Sequence[Header], *, value: bytes | None = None, key: bytes | None = None
    ) -> None:
        self._write("raw", (value or b"").decode())

    def flush(self, timeout: float = 30.0) -> None:
        self.flushed = True

    def _write(self, kind: str, delay_id: str) -> None:
        if self._fail:
            raise LocalStackError("broker said no")
        self.writes.append((int(time.time() * 1000), kind, delay_id))
