"""The benchmark's 1 KB message, stored item figures and the emitter memory rule."""

from __future__ import annotations

import json

import pytest

from bench.items import measure_items
from bench.memory import HEADROOM, RUNTIME_ALLOWANCE_MB, suggested_memory_mb
from testkit.payload import order_event, random_bytes


@pytest.mark.parametrize("size", [640, 984, 4096])
def test_an_order_event_is_json_of_exactly_the_size(size: int) -> None:
    event = order_event(5, size)
    assert len(event) == size
    assert json.loads(event)["type"] == "order.placed"


def test_payloads_are_deterministic_and_differ_by_index() -> None:
    assert order_event(5, 984) == order_event(5, 984)
    assert order_event(5, 984) != order_event(6, 984)
    assert random_bytes(5, 984) == random_bytes(5, 984)


def test_an_order_event_refuses_a_size_it_cannot_fill() -> None:
    with pytest.raises(ValueError, match="needs more than"):
        order_event(1, 300)


def test_item_figures_show_json_in_one_unit_and_random_bytes_in_two() -> None:
    figures = measure_items(variants=8)
    assert figures.json_item_bytes_max <= 1024
    assert figures.json_item_wru_max == 1
    assert figures.incompressible_item_wru == 2
    assert 0 < figures.largest_incompressible_value_in_one_wru < 984


@pytest.mark.parametrize(
    ("peak_mb", "memory_mb"), [(20.0, 128), (32.0, 128), (32.1, 192), (64.1, 256), (200.0, 512)]
)
def test_the_suggested_memory_has_the_headroom_over_peak_and_runtime(
    peak_mb: float, memory_mb: int
) -> None:
    assert suggested_memory_mb(peak_mb) == memory_mb
    assert memory_mb >= HEADROOM * (peak_mb + RUNTIME_ALLOWANCE_MB)
