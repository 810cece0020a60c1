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
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Final

from bench import cost
from bench.cost import incompressible_value, largest_incompressible_value_in_one_wru
from bench.reference_mix import (
    REFERENCE_MIX,
    VALUE_BYTES,
    VALUE_VARIANTS,
    Workload,
    delay_request,
    message_value,
)
from bench.template import FunctionConfig, deployed
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
    # Each way to store the values, priced per million messages of the reference mix.
    compression_options: list[dict[str, Any]] = field(default_factory=list)

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


def _huffman_only(raw: bytes) -> bytes:
    """zlib's Huffman-only strategy (no match search): a zlib stream any reader inflates."""
    packer = zlib.compressobj(
        c.STORE_ZLIB_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, 8, zlib.Z_HUFFMAN_ONLY
    )
    return packer.compress(raw) + packer.flush()


# The ways to store a value that were weighed (None: stored as it is). "Only when it saves a
# write unit" compresses at the store's level unless the plain item already fits one unit.
_OPTIONS: Final[dict[str, Callable[[bytes], bytes] | None]] = {
    "zlib level 6 (the store's)": partial(zlib.compress, level=c.STORE_ZLIB_LEVEL),
    "zlib level 1": partial(zlib.compress, level=1),
    "zlib Huffman only": _huffman_only,
    "only when it saves a write unit": partial(zlib.compress, level=c.STORE_ZLIB_LEVEL),
    "none": None,
}
_ONLY_IF_A_UNIT: Final = "only when it saves a write unit"


def _stored_item(index: int, value: bytes, packer: Callable[[bytes], bytes] | None) -> Any:
    """The item of message ``index`` with its value stored by ``packer``."""
    item = message_item(delay_request(index, NOW_MS + 3_600_000, value), 16, 86_400)
    item.pop(c.ATTR_VALUE_Z, None)
    item.pop(c.ATTR_VALUE, None)
    if packer is None:
        item[c.ATTR_VALUE] = {"B": value}
    else:
        item[c.ATTR_VALUE_Z] = {"B": packer(value)}
    return item


def compression_options(
    values: list[bytes],
    workload: Workload = REFERENCE_MIX,
    fc: FunctionConfig | None = None,
    assumptions: cost.Assumptions | None = None,
) -> list[dict[str, Any]]:
    """What each way to store ``values`` costs per million messages of ``workload``: the
    write units of the stored share, its storage (mean days stored, TTL grace included, plus
    DynamoDB's per-item overhead), the scheduler's strongly consistent Query reading it once
    (4 KB read units) and ingest's Lambda time compressing it (the template's memory and
    architecture). Items are the store's own, with the value replaced."""
    fc = fc or deployed()
    a = assumptions or cost.Assumptions()
    stored_share = workload.long_share
    days = cost._storage_days_per_long_message(workload, 86_400, delete=False)
    memory_mb = fc.memory_mb["ingest"]
    out = []
    for name, packer in _OPTIONS.items():
        items = [_stored_item(i, v, None) for i, v in enumerate(values)]
        packed = [] if packer is None else values
        if packer is not None:
            compressed = [_stored_item(i, v, packer) for i, v in enumerate(values)]
            if name == _ONLY_IF_A_UNIT:
                fits = [write_units(item_size(p)) == 1 for p in items]
                items = [p if f else z for p, z, f in zip(items, compressed, fits, strict=True)]
                packed = [v for v, f in zip(values, fits, strict=True) if not f]
            else:
                items = compressed
        # CPU per message of the mix: the values compressed, over all values.
        cpu_us = _best_us(packer, packed) * len(packed) / len(values) if packer and packed else 0.0
        sizes = [item_size(i) for i in items]
        size = statistics.fmean(sizes)
        wru = statistics.fmean(write_units(b) for b in sizes)
        lines = {
            "writes": stored_share * wru * cost.price("dynamodb_wru"),
            "storage": stored_share
            * days
            * (size + a.dynamodb_item_overhead_bytes)
            / 1e9
            * cost.price("dynamodb_storage_gb_month")
            / 30.4,
            "reads": stored_share * size / 4096 * cost.price("dynamodb_rru"),
            "ingest_cpu": stored_share
            * cost.cpu_wall_ms(cpu_us / 1000, memory_mb, a)
            / 1000
            * memory_mb
            / 1024
            * cost.gb_second_price(fc),
        }
        out.append(
            {
                "option": name,
                "item_bytes_mean": round(size, 1),
                "wru_mean": round(wru, 3),
                "compress_us": round(cpu_us, 1),
                "usd_per_million": {k: round(v * 1e6, 5) for k, v in lines.items()},
                "total_usd_per_million": round(sum(lines.values()) * 1e6, 5),
            }
        )
    return out


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
        compression_options=compression_options(values),
        method=f"delayq.store.message_item on {variants} distinct 1 KB messages (16 B key, one "
        f"16 B header, {VALUE_BYTES} B JSON order event from testkit.payload) and on one with a "
        "random-bytes value; DynamoDB item size rules; CPU best of 5 per value",
    )
