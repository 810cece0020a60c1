"""The stored item of a 1 KB message: its size in bytes and write units, for a JSON event and
for an incompressible value, and what compressing it costs.

Sizes are DynamoDB's (attribute names + values, :func:`testkit.aws.item_size`) of the items
``delayq.store.message_item`` builds; times are ``time.process_time()`` per value, best of 5.
"""

from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Final

from bench.cost import incompressible_value, largest_incompressible_value_in_one_wru
from bench.reference_mix import VALUE_BYTES, VALUE_VARIANTS, delay_request, message_value
from delayq import constants as c
from delayq.store import message_item
from testkit.aws import item_size, write_units
from testkit.clock import NOW_MS

_REPEATS: Final = 5


@dataclass
class ItemFigures:
    """Stored item sizes of 1 KB messages and the cost of compressing their values."""

    value_bytes: int
    json_item_bytes_mean: float
    json_item_bytes_max: int
    json_item_wru_max: int
    json_value_stored_bytes_mean: float
    incompressible_item_bytes: int
    incompressible_item_wru: int
    largest_incompressible_value_in_one_wru: int
    store_zlib_level: int
    compress_us: dict[str, float]
    compressed_bytes: dict[str, float]
    decompress_us: float
    variants: int
    method: str

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return asdict(self)


def _best_us(call: Callable[[bytes], object], values: list[bytes]) -> float:
    runs = []
    for _ in range(_REPEATS):
        start = time.process_time()
        for v in values:
            call(v)
        runs.append(time.process_time() - start)
    return min(runs) / len(values) * 1e6


def measure_items(variants: int = VALUE_VARIANTS) -> ItemFigures:
    """Every distinct workload value (``variants`` of them) through ``message_item``."""
    values = [message_value(i) for i in range(variants)]
    items = [
        message_item(delay_request(i, NOW_MS + 3_600_000, v), 16, 86_400)
        for i, v in enumerate(values)
    ]
    sizes = [item_size(i) for i in items]
    stored = [len(i[c.ATTR_VALUE_Z]["B"]) for i in items if c.ATTR_VALUE_Z in i]
    raw_item = message_item(
        delay_request(123_456_789, NOW_MS + 3_600_000, incompressible_value()), 16, 86_400
    )
    packed = [zlib.compress(v, c.STORE_ZLIB_LEVEL) for v in values]
    zlib_levels = {f"level {level}": partial(zlib.compress, level=level) for level in (1, 6, 9)}
    return ItemFigures(
        value_bytes=VALUE_BYTES,
        json_item_bytes_mean=round(statistics.fmean(sizes), 1),
        json_item_bytes_max=max(sizes),
        json_item_wru_max=write_units(max(sizes)),
        json_value_stored_bytes_mean=round(statistics.fmean(stored), 1) if stored else 0.0,
        incompressible_item_bytes=item_size(raw_item),
        incompressible_item_wru=write_units(item_size(raw_item)),
        largest_incompressible_value_in_one_wru=largest_incompressible_value_in_one_wru(),
        store_zlib_level=c.STORE_ZLIB_LEVEL,
        compress_us={k: round(_best_us(f, values), 1) for k, f in zlib_levels.items()},
        compressed_bytes={
            k: round(statistics.fmean(len(f(v)) for v in values), 1) for k, f in zlib_levels.items()
        },
        decompress_us=round(_best_us(zlib.decompress, packed), 1),
        variants=variants,
        method=f"delayq.store.message_item on {variants} distinct 1 KB messages (16 B key, one "
        f"16 B header, {VALUE_BYTES} B JSON order event from testkit.payload) and on one with a "
        "random-bytes value; DynamoDB item size rules; CPU best of 5 per value",
    )
