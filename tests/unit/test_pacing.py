"""Pacing (delayq_local.pacing): a token pacer keeps to its rate plus one burst, on an injected
clock and sleep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.exceptions import ConfigurationError
from delayq_local.pacing import Pacer
from testkit.clock import NOW_MS, FakeClock
from tests.factories import PROPERTY


@PROPERTY
@given(
    rate=st.floats(0.1, 500),
    takes=st.lists(st.tuples(st.integers(1, 10), st.integers(0, 5_000)), max_size=40),
)
def test_a_pacer_never_exceeds_its_rate_plus_one_burst(
    rate: float, takes: list[tuple[int, int]]
) -> None:
    clock = FakeClock()
    pacer = Pacer(rate, clock=clock, sleep=clock.sleep)
    taken = 0
    for wanted, idle_ms in takes:
        clock.advance(idle_ms)
        n = min(wanted, int(pacer.capacity))
        pacer.take(n)
        taken += n
        elapsed_s = (clock() - NOW_MS) / 1000
        assert taken <= pacer.capacity + rate * elapsed_s + 1e-6


def test_a_pacer_refuses_a_rate_or_a_take_it_cannot_serve() -> None:
    clock = FakeClock()
    with pytest.raises(ConfigurationError, match="capacity must be > 0"):
        Pacer(5, capacity=0, clock=clock, sleep=clock.sleep)
    with pytest.raises(ConfigurationError, match="rate_per_second must be > 0"):
        Pacer(float("nan"), clock=clock, sleep=clock.sleep)
    with pytest.raises(ValueError, match="cannot take 3 tokens"):
        Pacer(2, clock=clock, sleep=clock.sleep).take(3)
