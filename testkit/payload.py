"""What a "1 KB message" holds: a realistic Kafka value, and an incompressible one.

The cost model counts DynamoDB write units from the stored item's size, and the store keeps a
value zlib-compressed when that is smaller (``delayq.store.message_item``). A value of one
repeated byte would compress to almost nothing and flatter the model, so the benchmark uses
an order event as a shop would publish it: JSON with random ids, timestamps, amounts and
nested line items, padded with free text to the exact size. Random bytes (an encrypted or
already compressed value) are the other end and are reported on their own line.

Both are deterministic: the same index gives the same bytes.
"""

from __future__ import annotations

import json
import random
from typing import Any, Final

_FIRST_EPOCH_S: Final = 1_795_248_000  # 2026-11-21T08:00:00Z, testkit.clock.NOW_MS
_PRODUCTS: Final = (
    ("Espresso beans 1 kg", "24.90"),
    ("Ceramic pour-over dripper", "18.50"),
    ("Paper filters, 100 pack", "4.99"),
    ("Burr grinder", "129.00"),
    ("Milk jug 600 ml", "15.75"),
    ("Travel mug, steel", "22.00"),
    ("Descaling tablets", "9.45"),
    ("Gift card", "50.00"),
)
_CITIES: Final = (
    ("Berlin", "DE", "10115"),
    ("Lyon", "FR", "69002"),
    ("Utrecht", "NL", "3511"),
    ("Porto", "PT", "4050-079"),
    ("Graz", "AT", "8010"),
)
_WORDS: Final = (
    *("please", "leave", "the", "parcel", "with", "the", "neighbour", "if", "nobody"),
    *("answers", "the", "door", "ring", "twice", "gift", "wrap", "requested", "no"),
    *("invoice", "in", "the", "box", "deliver", "after", "five", "pm", "side", "entrance"),
)


def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(digits * 4):0{digits}x}"


def _iso(epoch_s: int, ms: int) -> str:
    days, rest = divmod(epoch_s - _FIRST_EPOCH_S, 86_400)
    hours, rest = divmod(rest + 8 * 3600, 3600)
    return f"2026-11-{21 + days:02d}T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{ms:03d}Z"


def _event(rng: random.Random, index: int, lines: int) -> dict[str, Any]:
    placed = _FIRST_EPOCH_S + rng.randrange(3600)
    city, country, postcode = rng.choice(_CITIES)
    items = []
    total = 0
    for n in range(lines):
        name, price = rng.choice(_PRODUCTS)
        qty = rng.randint(1, 3)
        cents = round(float(price) * 100) * qty
        total += cents
        items.append(
            {
                "line": n + 1,
                "sku": f"SKU-{rng.randrange(10_000, 99_999)}",
                "name": name,
                "quantity": qty,
                "unit_price": price,
                "subtotal": f"{cents / 100:.2f}",
            }
        )
    return {
        "type": "order.placed",
        "schema_version": 3,
        "event_id": "-".join(
            (_hex(rng, 8), _hex(rng, 4), "4" + _hex(rng, 3), "a" + _hex(rng, 3), _hex(rng, 12))
        ),
        "occurred_at": _iso(placed, rng.randrange(1000)),
        "order": {
            "id": f"ord_{index:010d}",
            "customer": {
                "id": f"cus_{_hex(rng, 14)}",
                "email": f"customer.{rng.randrange(10**6):06d}@example.com",
                "tier": rng.choice(("standard", "gold", "platinum")),
            },
            "currency": "EUR",
            "items": items,
            "total": f"{total / 100:.2f}",
            "shipping": {
                "method": rng.choice(("standard", "express")),
                "address": {
                    "street": f"{rng.randrange(1, 200)} Hauptstrasse",
                    "city": city,
                    "postcode": postcode,
                    "country": country,
                },
            },
        },
        "metadata": {"source": "checkout-web", "trace_id": _hex(rng, 32)},
    }


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def order_event(index: int, size: int) -> bytes:
    """An order event of exactly ``size`` bytes of compact JSON (640 B or more): as many
    line items as fit, then a delivery note of free text to fill the rest."""
    lines = 1
    while len(_dumps(_event(random.Random(index), index, lines + 1))) + 10 <= size:
        lines += 1
    rng = random.Random(index)
    event = _event(rng, index, lines)
    room = size - len(_dumps({**event, "note": ""}))
    if room < 0:
        raise ValueError(f"an order event needs more than {size} bytes")
    words: list[str] = []
    while len(" ".join(words)) < room:
        words.append(rng.choice(_WORDS))
    event["note"] = " ".join(words)[:room].rstrip().ljust(room, ".")
    data = _dumps(event).encode()
    assert len(data) == size  # ASCII only: characters are bytes
    return data


def random_bytes(index: int, size: int) -> bytes:
    """``size`` random bytes: an encrypted or already compressed value (incompressible)."""
    return random.Random(index).randbytes(size)
