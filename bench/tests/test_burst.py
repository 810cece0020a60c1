"""bench.burst's scheduler probe: the latencies it is given are what the scheduler pays."""

from __future__ import annotations

from bench.burst import scheduler_probe


def test_the_probe_completes_a_burst_when_calls_are_fast() -> None:
    result = scheduler_probe(3000, send_latency_ms=5)
    assert result.completed
    assert result.sent_total == 3000
    assert not result.ticks[0].stopped_by_timeout


def test_slow_sends_stop_the_scheduler_at_its_timeout() -> None:
    # The burst needs a few SendMessageBatch calls (messages travel in bundles); at 30 s each
    # they cannot all fit in one 60 s invocation.
    result = scheduler_probe(3000, send_latency_ms=30_000, ticks=1)
    assert result.ticks[0].stopped_by_timeout
    assert 0 < result.sent_total < 3000
    assert not result.completed
