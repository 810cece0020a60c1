"""The benchmark's 1 KB message, stored item figures and the emitter memory rule."""

from __future__ import annotations

import json
import zlib

import pytest

from bench.items import _huffman_only, compression_options, measure_items
from bench.memory import HEADROOM, RUNTIME_ALLOWANCE_MB, suggested_memory_mb
from bench.reference_mix import message_value
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


def test_compression_options_price_each_way_to_store_the_json_values() -> None:
    options = {o["option"]: o for o in compression_options([message_value(i) for i in range(16)])}
    store, none = options["zlib level 6 (the store's)"], options["none"]
    assert store["wru_mean"] == 1.0
    assert none["wru_mean"] == 2.0
    assert none["compress_us"] == 0.0
    assert none["usd_per_million"]["writes"] == 2 * store["usd_per_million"]["writes"]
    # Cheaper settings store more bytes, which cost more than the CPU they save.
    for other in ("zlib level 1", "zlib Huffman only"):
        assert options[other]["item_bytes_mean"] > store["item_bytes_mean"]
        assert options[other]["total_usd_per_million"] > store["total_usd_per_million"]
    # Plain, these items take two units: the write-unit rule compresses every one of them.
    rule = options["only when it saves a write unit"]
    assert rule["item_bytes_mean"] == store["item_bytes_mean"]
    assert rule["compress_us"] > 0


def test_the_write_unit_rule_stores_a_value_plain_when_its_item_fits_one_unit() -> None:
    values = [order_event(i, 640) for i in range(4)]
    options = {o["option"]: o for o in compression_options(values)}
    rule, none = options["only when it saves a write unit"], options["none"]
    assert none["wru_mean"] == 1.0
    assert rule["item_bytes_mean"] == none["item_bytes_mean"]
    assert rule["compress_us"] == 0.0


def test_huffman_only_output_is_a_zlib_stream() -> None:
    value = message_value(3)
    assert zlib.decompress(_huffman_only(value)) == value


@pytest.mark.parametrize(
    ("peak_mb", "memory_mb"), [(20.0, 128), (32.0, 128), (32.1, 192), (64.1, 256), (200.0, 512)]
)
def test_the_suggested_memory_has_the_headroom_over_peak_and_runtime(
    peak_mb: float, memory_mb: int
) -> None:
    assert suggested_memory_mb(peak_mb) == memory_mb
    assert memory_mb >= HEADROOM * (peak_mb + RUNTIME_ALLOWANCE_MB)
