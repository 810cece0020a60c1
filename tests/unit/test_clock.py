"""The clocks handlers take: the system clock, unless a harness set one for the module."""

from __future__ import annotations

import time

from delayq.clock import handler_clock, set_handler_clock, system_clock


def test_the_system_clock_is_epoch_milliseconds() -> None:
    before = time.time_ns() // 1_000_000

    now = system_clock()

    assert before <= now <= time.time_ns() // 1_000_000


def test_a_handler_module_gets_the_system_clock_by_default() -> None:
    assert handler_clock("functions.emitter.app") is system_clock


def test_a_clock_set_for_a_module_is_taken_once_by_that_module() -> None:
    def frozen() -> int:
        return 1_000

    set_handler_clock("delayq_fn_test_1", frozen)

    assert handler_clock("delayq_fn_other") is system_clock
    assert handler_clock("delayq_fn_test_1") is frozen
    assert handler_clock("delayq_fn_test_1") is system_clock
