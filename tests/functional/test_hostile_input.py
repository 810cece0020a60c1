"""Hostile input: a bad record never blocks its batch, nothing is lost, the counts add up.

Property-based (hypothesis) over Kafka event-source records and delay-queue bodies. Each test
reuses one moto account (the ``pipeline`` fixture) and drains it between examples.

Every generated bad record starts as a good one with exactly one defect planted, so its
reason is known; junk of no particular shape may get any documented reason. The inputs that
once failed a whole batch (enormous due times, header names that are not UTF-8 or grow when
escaped, ids too long for the store) are in the generators too, and pinned by the tests at
the end of this file.
"""

from __future__ import annotations

import base64
import json
import string
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from delayq import constants as c
from delayq.envelope import Envelope, decode_body
from delayq.exceptions import MalformedEventError
from delayq.payloads import parse_ref
from delayq.records import DelayRequest, Reason
from delayq.store import request_from_item
from testkit.clock import NOW_MS
from testkit.events import control_headers, kafka_event, kafka_record
from testkit.kafka import FakeProducer
from tests.factories import SentEntry
from tests.functional.conftest import Pipeline

HOSTILE = hypothesis_settings(
    max_examples=20,
    deadline=None,
    # One moto account per test, drained by each example: reusing the fixture is the point.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)

ALLOWED = ("orders.timeout", "orders.paid", "reminders")  # the allow-list is orders.*, reminders
MAX_PAYLOAD = 128 * 1024  # small limits keep oversize examples cheap
OFFLOAD = 16 * 1024
HORIZON_MS = 300_000  # the pipeline fixture's compressed horizon
MAX_DELAY_MS = c.DEFAULT_MAX_DELAY_SECONDS * 1000
INGEST_REASONS = {str(r) for r in Reason} - {str(Reason.BAD_ENVELOPE)}
QUEUED, STORED, CANCELLED, REJECTED = "queued", "stored", "cancelled", "rejected"

Headers = tuple[tuple[str, bytes | None], ...]


@pytest.fixture
def hp(pipeline: Pipeline) -> Pipeline:
    pipeline.settings = pipeline.settings.with_overrides(
        max_payload_bytes=MAX_PAYLOAD, offload_threshold_bytes=OFFLOAD
    )
    return pipeline


def drain(p: Pipeline) -> None:
    """Forget the previous example: queues, table, bucket, recordings, clock, producer."""
    p.clock.now_ms = NOW_MS
    p.sqs.sent.clear()
    p.handed_over.clear()
    p.producer = FakeProducer(clock=p.clock)
    for url in (p.settings.delay_queue_url, p.settings.reject_queue_url):
        p.aws.receive_all(url)
    table = p.settings.table_name
    for page in p.aws.dynamodb.get_paginator("scan").paginate(
        TableName=table, ProjectionExpression="pk, sk"
    ):
        for item in page["Items"]:
            p.aws.dynamodb.delete_item(TableName=table, Key=item)
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket)
    for obj in listed.get("Contents", []):
        p.aws.s3.delete_object(Bucket=p.settings.payload_bucket, Key=obj["Key"])


# --- what a generated record must become ---------------------------------------------------


@dataclass(frozen=True)
class Delivered:
    """What a good delay record must turn into, wherever it waits."""

    delay_id: str
    target: str
    due_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True)
class Case:
    """One record of a batch and its expected fate."""

    record: Any
    outcome: str
    reason: str | None = None  # the planted defect's reason; None: any documented one
    delivered: Delivered | None = None
    cancel_id: str | None = None
    source: dict[str, Any] | None = None  # the coordinates the reject must carry


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def header(name: str, value: bytes | None) -> dict[str, list[int] | None]:
    return {name: None if value is None else list(value)}


def canonical(record: Any) -> str:
    return json.dumps(record, sort_keys=True)


# --- strategies: good records -------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
EMOJI = "\U0001f600"  # one character, four bytes of UTF-8


def within_id_bytes(text: str) -> str:
    """Cut to whole characters within the id's 1,000 bytes (ingest strips the id)."""
    return text.encode()[: c.MAX_ID_BYTES].decode("utf-8", "ignore").strip()


# Printable ids: letters, marks, numbers, punctuation, symbols and inner spaces. Up to 512
# code points and 1,000 bytes of UTF-8 (DynamoDB's sort key, less the version tag), both
# limits reached.
printable = st.characters(codec="utf-8", categories=["L", "M", "N", "P", "S"])
ids = st.one_of(
    st.sampled_from(["dup-1", "dup-2", "order-42"]),  # repeated across a batch
    st.builds(
        lambda a, b: within_id_bytes(f"{a} {b}"),
        st.text(printable, min_size=1, max_size=256),
        st.text(printable, max_size=255),
    ),
    st.text(st.sampled_from(string.ascii_letters + string.digits + "-_.:/"), max_size=512).filter(
        bool
    ),
    st.sampled_from([EMOJI * 250, "\u00e9" * 500, "x" * c.MAX_ID_LENGTH]),
)
user_header_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20).filter(
    lambda n: not n.lower().startswith(c.HEADER_PREFIX)
)
optional_bytes = st.none() | st.binary(max_size=40)  # header values: any bytes, UTF-8 or not
pads = st.sampled_from(["", " ", "\t", "  "])
casings: st.SearchStrategy[Callable[[str], str]] = st.sampled_from(
    [str.lower, str.upper, str.title]
)


def filled(n: int) -> bytes:
    """``n`` bytes, cheap to build at any size."""
    return bytes([n % 251]) * n


values = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=64),
    st.integers(OFFLOAD + 1, 60_000).map(filled),  # claim-checked through S3
)


@st.composite
def seconds_meaning(draw: st.DrawFn, delay_ms: int) -> str:
    """A ``delay-seconds`` text that means ``delay_ms``: whole seconds, milliseconds, or up
    to nine decimals that round up to it (the contract rounds up: never early)."""
    variant = draw(st.sampled_from(["whole", "ms", "finer"]))
    if variant == "whole" and delay_ms % 1000 == 0:
        return str(delay_ms // 1000)
    if variant != "finer":
        return f"{delay_ms // 1000}.{delay_ms % 1000:03d}"
    decimals = draw(st.integers(4, 9))
    per_ms = 10 ** (decimals - 3)
    units = max(0, delay_ms * per_ms - draw(st.integers(0, per_ms - 1)))
    whole, fraction = divmod(units, 10**decimals)
    return f"{whole}.{fraction:0{decimals}d}"


@st.composite
def good_delays(draw: st.DrawFn) -> Case:
    """A valid delay request, with every freedom the contract allows."""
    partition = draw(st.integers(0, 2))
    offset = draw(st.integers(0, 4) | st.integers(0, 2**62))
    stamp = draw(st.sampled_from(["broker", "broker", "absent", "none", "minus-one"]))
    timestamp = NOW_MS - draw(st.integers(0, 3_600_000)) if stamp == "broker" else NOW_MS
    base = timestamp  # relative delays count from the broker timestamp, else from arrival

    kind = draw(st.sampled_from([c.HEADER_DELAY_MS, c.HEADER_DELAY_SECONDS, c.HEADER_DELIVER_AT]))
    if kind == c.HEADER_DELIVER_AT:
        due = draw(
            st.integers(1, NOW_MS + MAX_DELAY_MS)
            | st.sampled_from(
                [NOW_MS, NOW_MS + HORIZON_MS, NOW_MS + HORIZON_MS + 1, NOW_MS + MAX_DELAY_MS]
            )
        )
        text = str(due)
    else:
        lag = NOW_MS - base
        delay = draw(
            st.integers(0, MAX_DELAY_MS + lag)
            | st.sampled_from([0, HORIZON_MS + lag, HORIZON_MS + lag + 1, MAX_DELAY_MS + lag])
        )
        due = base + delay
        text = str(delay) if kind == c.HEADER_DELAY_MS else draw(seconds_meaning(delay))
    # Leading zeros are not significant (a few thousand of them: see
    # test_thousands_of_leading_zeros_are_still_not_significant in tests/unit/test_records.py).
    text = draw(st.sampled_from(["", "0", "0000000000000000"])) + text

    target = draw(st.sampled_from(ALLOWED))
    delay_id = draw(st.none() | ids)
    key = draw(st.none() | st.binary(max_size=64))
    value = draw(values)
    user = draw(st.lists(st.tuples(user_header_names, optional_bytes), max_size=4))
    if draw(st.integers(0, 9)) == 0:  # a big header: base64 of 44,000 bytes and the rest of
        # the envelope (ids, names escaped) stay within the 64 KiB of key + headers
        user.append(("big", filled(draw(st.integers(1_000, 44_000)))))
    control = [
        (c.HEADER_TARGET, draw(pads) + target + draw(pads)),
        (kind, draw(pads) + text + draw(pads)),
    ]
    if delay_id is not None:
        control.append((c.HEADER_ID, draw(pads) + delay_id))
    headers = [header(n, v) for n, v in user]
    for name, text_value in control:
        at = draw(st.integers(0, len(headers)))
        headers.insert(at, header(draw(casings)(name), text_value.encode()))

    record = kafka_record(
        topic="delay-requests",
        partition=partition,
        offset=offset,
        timestamp=timestamp,
        key=key,
        value=value,
        headers=headers,
    )
    if stamp == "absent":
        del record["timestamp"]
    elif stamp == "none":
        record["timestamp"] = None
    elif stamp == "minus-one":
        record["timestamp"] = -1
    delivered = Delivered(
        delay_id or f"delay-requests-{partition}-{offset}",
        target,
        due,
        key,
        value,
        tuple(user),
    )
    outcome = QUEUED if due - NOW_MS <= HORIZON_MS else STORED
    return Case(record, outcome, delivered=delivered, source=coordinates(record))


@st.composite
def good_cancels(draw: st.DrawFn) -> Case:
    """A cancel request; key and value are not read, so even bad base64 is fine."""
    cancel_id = draw(ids)
    record = kafka_record(
        offset=draw(st.integers(0, 2**40)),
        key=None,
        value=None,
        headers=[header(draw(casings)(c.HEADER_CANCEL), (draw(pads) + cancel_id).encode())],
    )
    if draw(st.booleans()):
        record["value"] = "*** not base64 ***"
    return Case(record, CANCELLED, cancel_id=cancel_id, source=coordinates(record))


def coordinates(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("topic", "partition", "offset")}


# --- strategies: one defect planted in a good record -----------------------------------------


def headers_of(record: dict[str, Any]) -> list[Any]:
    return list(record["headers"])


def control_names(record: dict[str, Any]) -> list[str]:
    return [n for h in record["headers"] for n in h if n.lower().startswith(c.HEADER_PREFIX)]


def without_control(record: dict[str, Any], *names: str) -> list[Any]:
    return [h for h in record["headers"] if not any(n.lower() in names for n in h)]


def with_control(record: dict[str, Any], name: str, value: bytes) -> list[Any]:
    return [*without_control(record, name), header(name, value)]


def corrupt_base64(draw: st.DrawFn) -> Any:
    """Not base64: a wrong type, or a valid encoding with a foreign character or cut short."""
    valid = b64(draw(st.binary(min_size=1, max_size=30)))
    return draw(
        st.one_of(
            st.integers() | st.booleans() | st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
            st.builds(
                lambda at, ch: valid[:at] + ch + valid[at:],
                st.integers(0, len(valid)),
                st.sampled_from(list("!*$ \n.-_~é")),
            ),
            st.just(valid.rstrip("=")[:-1]).filter(lambda s: len(s) % 4),
        )
    )


# Not plain ASCII decimals, though Python's int() or float() reads many of them.
NOT_PLAIN = ["1_000", "\u0661\u0662\u0663", "\uff11\uff12", "+1", "1 0", "0x10", "", "abc"]
BAD_DUE_TEXT = {
    c.HEADER_DELAY_MS: [*NOT_PLAIN, "nan", "inf", "-inf", "Infinity", "1.5", "1e3", "--1", "-0"],
    c.HEADER_DELAY_SECONDS: [
        *NOT_PLAIN,
        *["nan", "NaN", "inf", "-inf", "Infinity", "-Infinity", "1e999", "1e306", "1E3"],
        *["-0.001", "1e-9x", "1.", ".5", "1.0000000001", "\u0661.\u0665"],
    ],
    c.HEADER_DELIVER_AT: [*NOT_PLAIN, "0", "000", "-1", "1.5", "nan", "1e12", "1_795_248_000_000"],
}
Planted = tuple[Any, str | None]  # the record with its defect, and the reason it must get


def due_header(record: dict[str, Any]) -> str:
    return next(n.lower() for n in control_names(record) if n.lower() in BAD_DUE_TEXT)


def plant_not_object(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    return draw(json_values.filter(lambda v: not isinstance(v, dict))), Reason.MALFORMED_RECORD


def plant_junk(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    return draw(st.dictionaries(st.text(max_size=8), json_values, max_size=5)), None


BAD_FIELDS = {
    "topic": st.none() | st.integers() | st.just("") | st.booleans() | st.lists(st.text()),
    "partition": st.none()
    | st.integers(max_value=-1)
    | st.text(max_size=3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans(),
    "timestamp": st.integers(max_value=-2)  # -1 and null mean "no timestamp": not a defect
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.lists(st.integers(), max_size=2),
}
BAD_FIELDS["offset"] = BAD_FIELDS["partition"]


def plant_field(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    name = draw(st.sampled_from(sorted(BAD_FIELDS)))
    if name != "timestamp" and draw(st.booleans()):
        del record[name]  # a missing timestamp means "no timestamp" too
    else:
        record[name] = draw(BAD_FIELDS[name])
    return record, Reason.MALFORMED_RECORD


def bad_header_entry(draw: st.DrawFn, record: dict[str, Any]) -> Any:
    """An entry that breaks the headers: not an object, no name, not a byte array, a control
    header twice, or a control header that is not UTF-8 (which replaces the original)."""
    variant = draw(st.sampled_from(["entry", "name", "value", "twice", "utf8"]))
    if variant == "entry":
        return draw(st.lists(st.integers(), max_size=2) | st.text() | st.integers() | st.none())
    if variant == "name":  # empty, or not UTF-8 (a lone surrogate, as JSON "\ud800" reads)
        surrogate = st.characters(categories=["Cs"])
        bad_names = st.just("") | st.builds("{}{}{}".format, st.text(), surrogate, st.text())
        return {draw(bad_names): [1]}
    if variant == "value":
        # Not a byte in either notation (Lambda sends signed Java bytes: -128..-1 are bytes).
        item = draw(st.sampled_from([256, -129, 2**70, "a", 1.5, None, [1], True, False]))
        value = draw(
            st.text()
            | st.integers()
            | st.booleans()
            | st.dictionaries(st.text(max_size=3), st.integers(), max_size=1)
            | st.lists(st.integers(0, 255), max_size=3).map(lambda v: [*v, item])
        )
        return {draw(user_header_names): value}
    name = draw(st.sampled_from(control_names(record)))
    if variant == "twice":
        return header(draw(casings)(name), b"orders.timeout")
    record["headers"] = without_control(record, name.lower())
    return header(name, draw(st.binary(min_size=1, max_size=8).filter(not_utf8)))


def plant_headers(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    if draw(st.integers(0, 5)) == 0:
        record["headers"] = draw(
            st.text() | st.integers() | st.dictionaries(st.text(), st.integers())
        )
        return record, Reason.BAD_HEADERS
    entry = bad_header_entry(draw, record)
    headers = headers_of(record)
    headers.insert(draw(st.integers(0, len(headers))), entry)
    record["headers"] = headers
    return record, Reason.BAD_HEADERS


def plant_base64(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    record[draw(st.sampled_from(["key", "value"]))] = corrupt_base64(draw)
    return record, Reason.BAD_BASE64


def disallowed_targets() -> st.SearchStrategy[str]:
    """Outside ``orders.*`` and ``reminders`` (ingest strips the value first)."""
    return st.text(st.characters(codec="utf-8"), min_size=1, max_size=30).filter(
        lambda t: (
            bool(t.strip()) and not t.strip().startswith("orders.") and t.strip() != "reminders"
        )
    )


def plant_target(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    variant = draw(st.sampled_from(["missing", "blank", "disallowed"]))
    if variant == "missing":
        record["headers"] = without_control(record, c.HEADER_TARGET)
        return record, Reason.MISSING_TARGET
    if variant == "blank":
        record["headers"] = with_control(record, c.HEADER_TARGET, draw(pads).encode())
        return record, Reason.MISSING_TARGET
    target = draw(disallowed_targets())
    record["headers"] = with_control(record, c.HEADER_TARGET, target.encode())
    return record, Reason.TARGET_NOT_ALLOWED


def plant_due(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    kind = due_header(record)
    variant = draw(st.sampled_from(["missing", "conflicting", "bad"]))
    if variant == "missing":
        record["headers"] = without_control(record, kind)
        return record, Reason.MISSING_DUE
    if variant == "conflicting":
        other = draw(st.sampled_from([k for k in BAD_DUE_TEXT if k != kind]))
        extra = header(other, draw(st.text(max_size=5)).encode())
        record["headers"] = [*headers_of(record), extra]
        return record, Reason.CONFLICTING_DUE
    negative = st.integers(max_value=0 if kind == c.HEADER_DELIVER_AT else -1).map(str)
    text = draw(st.sampled_from(BAD_DUE_TEXT[kind]) | negative)
    record["headers"] = with_control(record, kind, text.encode())
    return record, Reason.BAD_DUE


ENORMOUS = 10**400  # far beyond a float (and beyond 15 significant digits)


def plant_too_long(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    """Delays beyond the maximum, from one millisecond over to hundreds of digits, or a broker
    timestamp beyond the maximum delay."""
    kind = due_header(record)
    stamp = record.get("timestamp")
    lag = 0 if stamp in (None, -1) else NOW_MS - stamp
    variant = draw(st.sampled_from([kind, "future"]))
    if variant == "future":
        record["timestamp"] = NOW_MS + MAX_DELAY_MS + draw(st.integers(1, 10**12))
        text, kind = str(draw(st.integers(0, 10**6))), c.HEADER_DELAY_MS
        record["headers"] = without_control(record, due_header(record))
    elif kind == c.HEADER_DELAY_MS:
        text = str(draw(st.integers(MAX_DELAY_MS + lag + 1, ENORMOUS)))
    elif kind == c.HEADER_DELAY_SECONDS:
        text = draw(seconds_meaning(draw(st.integers(MAX_DELAY_MS + lag + 1, ENORMOUS))))
    else:
        text = str(draw(st.integers(NOW_MS + MAX_DELAY_MS + 1, ENORMOUS)))
    record["headers"] = with_control(record, kind, text.encode())
    return record, Reason.DELAY_TOO_LONG


INLINE_CAP = c.MAX_INLINE_KEY_AND_HEADERS_BYTES


def plant_size(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    """Key + value + headers over the maximum, or key + headers over the 64 KiB they may take
    encoded in the envelope (they stay inline when the value goes to S3): base64 of a big key
    or header, or a header name of control characters (six characters of JSON each)."""
    variant = draw(st.sampled_from(["payload", "key", "header", "escaped-name"]))
    if variant == "payload":
        record["value"] = b64(filled(MAX_PAYLOAD + 1 + draw(st.integers(0, 200_000))))
        return record, Reason.PAYLOAD_TOO_LARGE
    record["value"] = None
    over = INLINE_CAP // 4 * 3 + 1 + draw(st.integers(0, 20_000))  # its base64 alone is over
    if variant == "key":
        record["key"] = b64(filled(over))
    elif variant == "header":
        record["headers"] = [*without_control(record, "big"), header("big", filled(over))]
    else:
        name = draw(st.sampled_from("\x00\x01\x1f\x7f")) * (INLINE_CAP // 6 + 1)
        record["headers"] = [*headers_of(record), header(name, None)]
    return record, Reason.PAYLOAD_TOO_LARGE


bad_ids = st.one_of(
    st.sampled_from(["", "   ", "\t"]),
    st.integers(c.MAX_ID_LENGTH + 1, 2_000).map(lambda n: "i" * n),
    # Few enough characters, too many bytes: 3 or 4 bytes of UTF-8 each.
    st.integers(c.MAX_ID_BYTES // 4 + 1, c.MAX_ID_LENGTH).map(lambda n: EMOJI * n),
    st.text(
        st.characters(codec="utf-8", min_codepoint=0x800, categories=["L", "N", "S"]),
        min_size=c.MAX_ID_BYTES // 3 + 1,
        max_size=c.MAX_ID_LENGTH,
    ),
    st.builds(
        lambda a, ch, b: a + ch + b,
        st.text(printable, min_size=1, max_size=8),
        st.sampled_from(["\n", "\x00", "\x7f", "\x1b", "\u200b", "\u2028", "\r"]),
        st.text(printable, min_size=1, max_size=8),
    ),
)


def plant_id(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    record["headers"] = with_control(record, c.HEADER_ID, draw(bad_ids).encode())
    return record, Reason.BAD_ID


def plant_cancel_id(draw: st.DrawFn, record: dict[str, Any]) -> Planted:
    record["headers"] = [header(c.HEADER_CANCEL, draw(bad_ids).encode())]
    return record, Reason.BAD_ID


PLANTERS: dict[str, Callable[[st.DrawFn, dict[str, Any]], Planted]] = {
    "not-object": plant_not_object,
    "junk": plant_junk,
    "field": plant_field,
    "headers": plant_headers,
    "base64": plant_base64,
    "target": plant_target,
    "due": plant_due,
    "too-long": plant_too_long,
    "size": plant_size,
    "id": plant_id,
    "cancel-id": plant_cancel_id,
}
LOSES_COORDINATES = {"not-object", "junk", "field"}


@st.composite
def hostile(draw: st.DrawFn, defect: str | None = None) -> Case:
    """A good record with one defect planted (or junk), and the reason it must get."""
    good = draw(good_delays())
    defect = defect or draw(st.sampled_from(sorted(PLANTERS)))
    record, reason = PLANTERS[defect](draw, json.loads(json.dumps(good.record)))
    source = None if defect in LOSES_COORDINATES else good.source
    return Case(record, REJECTED, None if reason is None else str(reason), source=source)


def not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, Case]]:
    """Good and bad records mixed, some repeated, spread over partitions: (partition key, case).
    Every batch carries each kind of defect at least once."""
    cases = [draw(hostile(defect)) for defect in PLANTERS]
    cases += draw(st.lists(st.one_of(good_delays(), good_cancels(), hostile()), max_size=8))
    cases += draw(st.lists(st.sampled_from(cases), max_size=2))  # the same record again
    return [(f"delay-requests-{draw(st.integers(0, 2))}", x) for x in draw(st.permutations(cases))]


def event_of(batch: Iterable[tuple[str, Case]]) -> tuple[dict[str, Any], list[Case]]:
    """The Kafka event, and the cases in the order the event source hands them over."""
    grouped: dict[str, list[Case]] = {}
    for key, case in batch:
        grouped.setdefault(key, []).append(case)
    event = kafka_event()
    event["records"] = {
        k: [json.loads(json.dumps(x.record)) for x in v] for k, v in grouped.items()
    }
    return event, [case for cases in grouped.values() for case in cases]


# --- reading back what ingest wrote ---------------------------------------------------------


def s3_bytes(p: Pipeline, ref: str) -> bytes:
    bucket, key = parse_ref(ref)
    body: bytes = p.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def as_delivered(p: Pipeline, request: DelayRequest) -> Delivered:
    value = s3_bytes(p, request.payload_ref) if request.payload_ref else request.value
    return Delivered(
        request.delay_id, request.target, request.due_ms, request.key, value, request.headers
    )


def rejects(p: Pipeline) -> list[tuple[dict[str, Any], Any]]:
    """Reject-queue bodies with the original record (read from S3 when it is there)."""
    out = []
    for body in p.aws.bodies(p.settings.reject_queue_url):
        if body["record_ref"]:
            assert body["record"] is None
            out.append((body, json.loads(s3_bytes(p, body["record_ref"]))))
        else:
            out.append((body, body["record"]))
    return out


def stored_messages(p: Pipeline) -> list[Delivered]:
    """Every stored message."""
    pages = p.aws.dynamodb.get_paginator("scan").paginate(TableName=p.settings.table_name)
    return [
        as_delivered(p, request_from_item(i))
        for page in pages
        for i in page["Items"]
        if i["kind"]["S"] == c.KIND_MESSAGE
    ]


def assert_bodies_fit_sqs(p: Pipeline) -> None:
    # moto takes any size; SQS refuses a body over 256 KiB.
    sizes = [len(e.body.encode()) for e in p.sqs.sent]
    assert all(size <= c.SQS_MAX_MESSAGE_BYTES for size in sizes), max(sizes)


# --- ingest -------------------------------------------------------------------------------


@HOSTILE
@given(batch=batches())
def test_bad_records_are_rejected_whole_and_good_ones_go_on(hp: Pipeline, batch: Any) -> None:
    drain(hp)
    event, cases = event_of(batch)

    result = hp.ingest(event)  # never raises for a bad record

    by_outcome = Counter(case.outcome for case in cases)
    assert (result.queued, result.stored, result.cancelled, len(result.rejected)) == (
        by_outcome[QUEUED],
        by_outcome[STORED],
        by_outcome[CANCELLED],
        by_outcome[REJECTED],
    )
    assert result.queued + result.stored + result.cancelled + len(result.rejected) == len(cases)
    assert result.rescued == 0

    # Every bad record is on the reject queue once, whole, with its documented reason.
    expected = [(canonical(x.record), x.reason, x.source) for x in cases if x.outcome == REJECTED]
    for body, record in rejects(hp):
        assert body["reason"] in INGEST_REASONS
        match = next(
            e for e in expected if e[0] == canonical(record) and e[1] in (None, body["reason"])
        )
        expected.remove(match)
        if match[2] is not None:
            assert body["source"] == match[2]
    assert expected == []

    # Every good record is queued (each one) or stored (one item per id and due-second).
    queued = Counter(
        as_delivered(hp, entry.request)
        for e in hp.delayed()
        for entry in decode_body(e.body)
        if entry.request is not None
    )
    assert queued == Counter(x.delivered for x in cases if x.outcome == QUEUED)
    # Every stored record is an item of its own, whatever ids and due times the batch repeats;
    # two records claiming one offset (impossible in Kafka, drawn here) are one record: the
    # batch's last.
    stored: dict[tuple[str, int, Any, Any], Delivered] = {}
    for x in cases:
        if x.outcome == STORED and x.delivered and x.source:
            where = (x.source["partition"], x.source["offset"])
            stored[(x.delivered.delay_id, x.delivered.due_ms // 1000, *where)] = x.delivered
    assert Counter(stored_messages(hp)) == Counter(stored.values())
    cancel_ids = {x.cancel_id for x in cases if x.cancel_id}
    assert set(hp.store.markers(cancel_ids, hp.deadline())) == cancel_ids
    assert_bodies_fit_sqs(hp)


@st.composite
def malformed_events(draw: st.DrawFn) -> Any:
    """Not a Kafka event: records in front of the flaw must not be written either."""
    shape = draw(st.sampled_from(["not-a-dict", "no-records", "records-not-a-dict", "not-a-list"]))
    if shape == "not-a-dict":
        return draw(json_values.filter(lambda v: not isinstance(v, dict)))
    if shape == "no-records":
        return draw(
            st.dictionaries(st.text(max_size=10).filter(lambda k: k != "records"), json_values)
        )
    event = kafka_event()
    if shape == "records-not-a-dict":
        event["records"] = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return event
    good, _ = event_of(
        [("delay-requests-0", draw(good_delays())), ("delay-requests-1", draw(hostile()))]
    )
    event["records"] = {
        **good["records"],
        "delay-requests-9": draw(json_values.filter(lambda v: not isinstance(v, list))),
    }
    return event


@HOSTILE
@given(event=malformed_events())
def test_a_malformed_event_fails_loudly_and_writes_nothing(hp: Pipeline, event: Any) -> None:
    drain(hp)
    with pytest.raises(MalformedEventError):
        hp.ingest(event)
    assert hp.sqs.sent == []
    assert hp.aws.dynamodb.scan(TableName=hp.settings.table_name)["Count"] == 0
    assert hp.aws.s3.list_objects_v2(Bucket=hp.settings.payload_bucket)["KeyCount"] == 0


def test_an_oversize_rejected_record_is_kept_whole_in_s3(hp: Pipeline) -> None:
    drain(hp)
    big = kafka_record(offset=7, target="payments.capture", seconds="5", value=filled(300_000))
    result = hp.ingest(kafka_event(big, kafka_record(offset=8, target="reminders", seconds="5")))
    assert (result.queued, len(result.rejected)) == (1, 1)
    [(body, record)] = rejects(hp)
    assert body["reason"] == "target-not-allowed"
    assert body["record_ref"].startswith(f"s3://{hp.settings.payload_bucket}/rejected/")
    assert record == big


# --- the emitter ----------------------------------------------------------------------------

envelope_requests = st.builds(
    DelayRequest,
    delay_id=ids,
    target=st.sampled_from(ALLOWED),
    due_ms=st.integers(NOW_MS - 86_400_000, NOW_MS + c.DEFAULT_MAX_HOLD_MS),
    key=optional_bytes,
    value=optional_bytes,
    headers=st.lists(st.tuples(user_header_names, optional_bytes), max_size=3).map(tuple),
    src=st.just("delay-requests-0-1"),
)
ENVELOPE_FIELDS = ["v", "id", "target", "due_ms", "key", "value", "headers", "src"]


WRONG_TYPES = st.none() | st.integers() | st.booleans() | st.lists(st.integers(), max_size=2)
Body = dict[str, Any]


def flaw_not_json(draw: st.DrawFn, body: Body) -> str:
    text = json.dumps(body)
    return text[: draw(st.integers(0, len(text) - 1))]


def flaw_not_object(draw: st.DrawFn, body: Body) -> str:
    return json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict))))


def flaw_version(draw: st.DrawFn, body: Body) -> str:
    body["v"] = draw(
        st.integers().filter(lambda v: v != 1)
        | st.text()
        | st.none()
        | st.just(False)
        | st.lists(st.integers(), max_size=2)
        | st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v != 1)
    )
    return json.dumps(body)


def flaw_missing(draw: st.DrawFn, body: Body) -> str:
    del body[draw(st.sampled_from(ENVELOPE_FIELDS))]
    return json.dumps(body)


def flaw_base64(draw: st.DrawFn, body: Body) -> str:
    field = draw(st.sampled_from(["key", "value", "header"]))
    if field == "header":
        body["headers"] = [*body["headers"], ["h", corrupt_base64(draw)]]
    else:
        body[field] = corrupt_base64(draw)
    return json.dumps(body)


def flaw_due(draw: st.DrawFn, body: Body) -> str:
    body["due_ms"] = draw(
        st.sampled_from(["soon", "1e3", "1.5", "", None, [], {}])
        | st.sampled_from([float("inf"), float("-inf"), float("nan")])  # JSON Infinity, NaN
        | st.booleans()
        | st.floats(allow_nan=False, allow_infinity=False)
    )
    return json.dumps(body)


def flaw_types(draw: st.DrawFn, body: Body) -> str:
    """Strings that are not strings (or are empty where a value is required)."""
    field = draw(st.sampled_from(["id", "target", "src", "payload_ref", "name"]))
    if field == "payload_ref":
        body[field] = draw(WRONG_TYPES.filter(lambda v: v is not None))
    elif field == "name":
        body["headers"] = [*body["headers"], [draw(WRONG_TYPES), None]]
    else:
        body[field] = draw(WRONG_TYPES | st.just(""))
    return json.dumps(body)


def flaw_headers(draw: st.DrawFn, body: Body) -> str:
    body["headers"] = draw(
        st.sampled_from([5, None, "ab", [["a"]], [["a", "b", "c"]], [5], [None], {"a": 1}])
    )
    return json.dumps(body)


def flaw_target(draw: st.DrawFn, body: Body) -> str:
    """Well formed, but the target is off the allow-list (the emitter does not strip it)."""
    body["target"] = draw(
        st.text(min_size=1, max_size=20).filter(
            lambda t: not t.startswith("orders.") and t != "reminders"
        )
    )
    return json.dumps(body)


FLAWS: dict[str, tuple[Callable[[st.DrawFn, Body], str], Reason]] = {
    "not-json": (flaw_not_json, Reason.BAD_ENVELOPE),
    "not-object": (flaw_not_object, Reason.BAD_ENVELOPE),
    "version": (flaw_version, Reason.BAD_ENVELOPE),
    "missing": (flaw_missing, Reason.BAD_ENVELOPE),
    "base64": (flaw_base64, Reason.BAD_ENVELOPE),
    "due": (flaw_due, Reason.BAD_ENVELOPE),
    "types": (flaw_types, Reason.BAD_ENVELOPE),
    "headers": (flaw_headers, Reason.BAD_ENVELOPE),
    "target": (flaw_target, Reason.TARGET_NOT_ALLOWED),
}


@st.composite
def bad_envelopes(draw: st.DrawFn, flaw: str | None = None) -> tuple[str, str]:
    """A delay-queue body that is not ours, and the reason the emitter must give."""
    body = json.loads(Envelope(draw(envelope_requests)).encode())
    spoil, reason = FLAWS[flaw or draw(st.sampled_from(sorted(FLAWS)))]
    return spoil(draw, body), str(reason)


@HOSTILE
@given(
    goods=st.lists(envelope_requests, max_size=6),
    bads=st.tuples(*(bad_envelopes(f) for f in FLAWS), st.lists(bad_envelopes(), max_size=2)).map(
        lambda t: [*t[:-1], *t[-1]]
    ),
    order=st.randoms(use_true_random=False),
)
def test_the_emitter_rejects_bodies_that_are_not_ours_and_delivers_the_rest(
    hp: Pipeline, goods: list[DelayRequest], bads: list[tuple[str, str]], order: Any
) -> None:
    drain(hp)
    bodies = [(Envelope(r).encode(), None) for r in goods] + list(bads)
    order.shuffle(bodies)
    entries = [SentEntry(hp.settings.delay_queue_url, body, 0, NOW_MS) for body, _ in bodies]

    result = hp.emit(entries)

    assert result.failed == []
    assert result.rejected == len(bads)
    produced = Counter(
        (o.topic, o.key, o.value, tuple(o.headers[:-4]), o.header("delay-id"))
        for o in hp.producer.produced
    )
    assert produced == Counter(
        (r.target, r.key, r.value, r.headers, r.delay_id.encode()) for r in goods
    )
    for out, at in zip(hp.producer.produced, hp.producer.produced_at, strict=True):
        assert at >= int(out.header("delay-due-ms") or b"0")  # never early
    got = hp.aws.bodies(hp.settings.reject_queue_url)
    assert Counter((r["reason"], r["record"]["body"]) for r in got) == Counter(
        (reason, body) for body, reason in bads
    )
    for r in got:  # each reject names the SQS message it came from
        index = int(r["record"]["sqs_message_id"].split("-")[1])
        assert bodies[index][0] == r["record"]["body"]


def test_an_infinite_due_time_is_a_bad_envelope_not_a_failed_batch(hp: Pipeline) -> None:
    good = Envelope(replace(envelope_request(), delay_id="good")).encode()
    bad = json.loads(good)
    bad["due_ms"] = float("inf")  # json.dumps writes Infinity, json.loads reads it back
    entries = [
        SentEntry(hp.settings.delay_queue_url, body, 0, NOW_MS) for body in (json.dumps(bad), good)
    ]
    result = hp.emit(entries)
    assert (result.failed, result.rejected, len(hp.producer.produced)) == ([], 1, 1)


def envelope_request() -> DelayRequest:
    return DelayRequest(
        "e-1", "reminders", NOW_MS, b"k", b"v", (("h", b"1"),), "delay-requests-0-1"
    )


# --- inputs that once failed the whole batch: each is now one rejected record -------------


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        (c.HEADER_DELAY_SECONDS, "1e306", "bad-due"),  # not a plain number
        (c.HEADER_DELAY_SECONDS, "9" * 400, "delay-too-long"),
        (c.HEADER_DELAY_MS, "9" * 400, "delay-too-long"),
        (c.HEADER_DELIVER_AT, "9" * 400, "delay-too-long"),
    ],
)
def test_an_enormous_delay_is_rejected_not_raised(
    hp: Pipeline, name: str, text: str, reason: str
) -> None:
    bad = kafka_record(offset=1, target="reminders", headers=[header(name, text.encode())])
    result = hp.ingest(kafka_event(bad, kafka_record(offset=2, target="reminders", seconds="1")))
    assert result.queued == 1
    assert [str(r.reason) for r in result.rejected] == [reason]


def test_a_header_name_that_is_not_utf8_is_bad_headers(hp: Pipeline) -> None:
    bad = kafka_record(offset=1, target="reminders", seconds="1", headers=[{"h\ud800": [1]}])
    result = hp.ingest(kafka_event(bad, kafka_record(offset=2, target="reminders", seconds="1")))
    assert result.queued == 1
    assert [str(r.reason) for r in result.rejected] == ["bad-headers"]


@pytest.mark.parametrize("control", ["id", "cancel"])
def test_an_id_too_long_for_the_store_is_bad_id_and_the_batch_goes_on(
    hp: Pipeline, control: str
) -> None:
    long_id = EMOJI * 300  # 300 characters, 1,200 bytes
    bad = kafka_record(
        offset=1,
        target="reminders",
        seconds="3600",
        headers=control_headers(**{control: long_id}),
    )
    result = hp.ingest(kafka_event(bad, kafka_record(offset=2, target="reminders", seconds="1")))
    assert result.queued == 1
    assert [str(r.reason) for r in result.rejected] == ["bad-id"]


def escaped_names_record() -> dict[str, Any]:
    """1 byte of header name, 6 characters of JSON: 60,000 of them are 360,000 in a body."""
    return kafka_record(
        offset=1, target="reminders", seconds="1", value=None, headers=[{"\x01" * 60_000: [1]}]
    )


def test_header_names_that_grow_in_json_are_payload_too_large(hp: Pipeline) -> None:
    result = hp.ingest(kafka_event(escaped_names_record()))
    assert result.queued == 0
    assert [str(r.reason) for r in result.rejected] == ["payload-too-large"]


def test_header_names_that_grow_in_json_still_fit_an_sqs_body(hp: Pipeline) -> None:
    hp.ingest(kafka_event(escaped_names_record()))
    assert_bodies_fit_sqs(hp)
