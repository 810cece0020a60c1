"""The delay-queue envelope: version 1 bodies, what decoding refuses, the dead-letter record,
the size estimate, and headers as stored in DynamoDB. (Bundles: test_bundles.py.)"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import constants as c
from delayq.envelope import (
    Envelope,
    dead_letter_of,
    dead_letter_text,
    headers_from_json,
    headers_json,
)
from delayq.exceptions import EnvelopeError
from delayq.records import DelayRequest, _json_text_len, estimated_body_bytes
from testkit.clock import NOW_MS
from tests.factories import PROPERTY, delay_request


def without(record: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != name}


names = st.text(min_size=1, max_size=40)
optional_bytes = st.none() | st.binary(max_size=300)
requests = st.builds(
    DelayRequest,
    delay_id=st.text(min_size=1, max_size=c.MAX_ID_LENGTH),
    target=names,
    due_ms=st.integers(min_value=-(2**53), max_value=2**53),
    key=optional_bytes,
    value=optional_bytes,
    headers=st.lists(st.tuples(names, optional_bytes), max_size=12).map(tuple),
    src=names,
    payload_ref=st.none() | st.text(max_size=200),
    ts_ms=st.integers(min_value=0, max_value=2**53),
    offloaded_bytes=st.integers(min_value=0, max_value=5 * 2**20),
    attempts=st.integers(min_value=0, max_value=100),
    tenant=st.just("") | st.text(min_size=1, max_size=c.MAX_TENANT_LENGTH),
    priority=st.sampled_from(c.PRIORITIES),
    release_ms=st.integers(min_value=0, max_value=2**53),
    paced_ms=st.integers(min_value=0, max_value=2**53),
)


@PROPERTY
@given(request=requests)
def test_envelope_round_trips_any_request(request: DelayRequest) -> None:
    assert Envelope.decode(Envelope(request).encode()) == Envelope(request)


def test_envelope_encodes_the_documented_version_1_layout() -> None:
    request = delay_request(
        delay_id="order-1",
        due_ms=NOW_MS,
        key=None,
        value=b"v",
        headers=(("a", b"1"), ("n", None)),
        payload_ref=None,
    )
    assert json.loads(Envelope(request).encode()) == {
        "v": 1,
        "id": "order-1",
        "target": "orders.timeout",
        "due_ms": NOW_MS,
        "key": None,
        "value": base64.b64encode(b"v").decode(),
        "headers": [["a", base64.b64encode(b"1").decode()], ["n", None]],
        "payload_ref": None,
        "src": "delay-requests-0-0",
    }


def test_envelope_carries_the_record_time_offloaded_size_and_refusals_when_set() -> None:
    request = replace(delay_request(), ts_ms=NOW_MS - 5, offloaded_bytes=300_000, attempts=2)
    body = json.loads(Envelope(request).encode())
    assert (body["ts"], body["pb"], body["n"]) == (NOW_MS - 5, 300_000, 2)
    assert Envelope.decode(Envelope(request).encode()).request == request


def test_envelope_carries_tenant_priority_and_release_only_when_set() -> None:
    plain = json.loads(Envelope(delay_request()).encode())
    assert not {"tn", "pr", "rl"} & plain.keys()
    request = replace(delay_request(), tenant="acme", priority=c.PRIORITY_LOW, release_ms=NOW_MS)
    body = json.loads(Envelope(request).encode())
    assert (body["tn"], body["pr"], body["rl"]) == ("acme", "low", NOW_MS)
    assert Envelope.decode(Envelope(request).encode()).request == request


def test_envelope_carries_a_catch_up_slot_only_when_set() -> None:
    assert "pc" not in json.loads(Envelope(delay_request()).encode())
    request = replace(delay_request(due_ms=NOW_MS), paced_ms=NOW_MS + 7000)
    assert json.loads(Envelope(request).encode())["pc"] == NOW_MS + 7000
    decoded = Envelope.decode(Envelope(request).encode()).request
    assert decoded == request
    # It moves when the message goes, not the release its lateness counts from.
    assert (decoded.release_at_ms, decoded.release_ms) == (NOW_MS + 7000, 0)


def test_a_moved_copy_survives_the_envelope() -> None:
    request = replace(delay_request(delay_id="r-1"), ts_ms=NOW_MS)
    moved = replace(request, moved_ts_ms=NOW_MS + 5, moved_src="delay-requests-1-7")
    assert Envelope.decode(Envelope(moved).encode()).request == moved
    assert '"mt"' not in Envelope(request).encode()
    assert estimated_body_bytes(moved) >= len(Envelope(moved).encode())


def test_an_envelope_of_an_unknown_priority_is_not_ours() -> None:
    with pytest.raises(EnvelopeError, match="not a delay-queue envelope: priority 'urgent'"):
        Envelope.decode(json.dumps({**VALID_BODY, "pr": "urgent"}))


def test_an_envelope_without_the_newer_numbers_reads_them_as_zero() -> None:
    # Written before they existed (or left out because they are 0).
    request = Envelope.decode(json.dumps(VALID_BODY)).request
    assert (request.ts_ms, request.offloaded_bytes, request.attempts) == (0, 0, 0)


@pytest.mark.parametrize("name", ["ts", "pb", "n"])
@pytest.mark.parametrize("bad", [-1, "3", 1.5, True, None])
def test_an_envelope_number_that_is_not_a_count_is_not_ours(name: str, bad: object) -> None:
    with pytest.raises(EnvelopeError, match=f"not a delay-queue envelope: {name}"):
        Envelope.decode(json.dumps({**VALID_BODY, name: bad}))


def test_a_dead_letter_keeps_the_entry_whole_and_says_why() -> None:
    entry = Envelope(delay_request(value=None, payload_ref="s3://b/payloads/x/1")).encode()
    text = dead_letter_text(entry, "target-refused", "MSG_SIZE_TOO_LARGE", NOW_MS)
    assert dead_letter_of(text) == {
        "reason": "target-refused",
        "detail": "MSG_SIZE_TOO_LARGE",
        "at_ms": NOW_MS,
    }
    # Readers of envelopes ignore the record: a redrive reads it like any other.
    assert Envelope.decode(text) == Envelope.decode(entry)
    assert dead_letter_of(entry) is None
    assert dead_letter_of("not json") is None


def test_envelope_decodes_an_offloaded_value_pointer() -> None:
    request = delay_request(value=None, payload_ref="s3://bucket/payloads/x/1")
    assert Envelope.decode(Envelope(request).encode()).request.payload_ref == (
        "s3://bucket/payloads/x/1"
    )


VALID_BODY = json.loads(Envelope(delay_request()).encode())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "not a delay-queue envelope"),
        ("[1, 2]", "not a delay-queue envelope"),
        ("null", "not a delay-queue envelope"),
        (json.dumps({**VALID_BODY, "v": 2}), "unknown envelope version 2"),
        (json.dumps(without(VALID_BODY, "v")), "unknown envelope version None"),
        (json.dumps(without(VALID_BODY, "id")), "not a delay-queue envelope"),
        (json.dumps(without(VALID_BODY, "headers")), "not a delay-queue envelope"),
        (json.dumps({**VALID_BODY, "due_ms": "soon"}), "not a delay-queue envelope"),
        (Envelope(delay_request()).encode().replace(str(NOW_MS + 60_000), "1e400"), "not a"),
        (json.dumps({**VALID_BODY, "value": "!!"}), "not a delay-queue envelope"),
        (json.dumps({**VALID_BODY, "headers": [["a"]]}), "not a delay-queue envelope"),
        (json.dumps({**VALID_BODY, "headers": 5}), "not a delay-queue envelope"),
    ],
)
def test_envelope_decode_rejects_bodies_that_are_not_ours(body: str, message: str) -> None:
    with pytest.raises(EnvelopeError, match=message):
        Envelope.decode(body)


@PROPERTY
@given(request=requests)
def test_estimated_body_bytes_is_an_upper_bound_of_the_encoded_size(request: DelayRequest) -> None:
    assert len(Envelope(request).encode().encode()) <= estimated_body_bytes(request)


@PROPERTY
@given(text=st.text())
def test_the_json_length_of_a_text_is_exact(text: str) -> None:
    # The fast path (nothing to escape) and json.dumps agree on every text.
    assert _json_text_len(text) == len(json.dumps(text))


def test_estimated_body_bytes_bounds_non_ascii_ids_and_header_names() -> None:
    request = delay_request(delay_id="é" * c.MAX_ID_LENGTH, headers=(("ключ" * 100, None),) * 10)
    assert len(Envelope(request).encode().encode()) <= estimated_body_bytes(request)


def test_estimated_body_bytes_bounds_many_null_headers() -> None:
    request = delay_request(headers=(("h", None),) * 500)
    assert len(Envelope(request).encode().encode()) <= estimated_body_bytes(request)


def test_estimated_body_bytes_grows_with_the_value_like_base64() -> None:
    small = estimated_body_bytes(delay_request(value=b""))
    assert estimated_body_bytes(delay_request(value=b"v" * 3000)) - small == 4000


# --- stored headers ----------------------------------------------------------------------------


def test_headers_json_is_a_list_of_name_and_base64() -> None:
    assert json.loads(headers_json((("a", b"\x00"), ("b", None)))) == [["a", "AA=="], ["b", None]]


@PROPERTY
@given(headers=st.lists(st.tuples(names, optional_bytes), max_size=10).map(tuple))
def test_headers_json_round_trips(headers: tuple[tuple[str, bytes | None], ...]) -> None:
    assert headers_from_json(headers_json(headers)) == headers


def _encoder_text(headers: tuple[tuple[str, bytes | None], ...]) -> str:
    """The stored text as json.dumps writes it (what items of every release hold)."""
    listed = [[n, None if v is None else base64.b64encode(v).decode()] for n, v in headers]
    return json.dumps(listed, separators=(",", ":"))


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("trace-id", b"0123456789abcdef"),),
        (("a", None), ("b", b""), ("c", b"\xff\x00")),
        (('quo"te', b"x"), ("back\\slash", None)),
        (("caf\u00e9", b"x"), ("tab\tname", b"y")),
    ],
)
def test_headers_json_is_the_json_encoders_text(
    headers: tuple[tuple[str, bytes | None], ...],
) -> None:
    assert headers_json(headers) == _encoder_text(headers)


@PROPERTY
@given(headers=st.lists(st.tuples(names, optional_bytes), max_size=10).map(tuple))
def test_headers_json_matches_the_encoder_for_any_names(
    headers: tuple[tuple[str, bytes | None], ...],
) -> None:
    assert headers_json(headers) == _encoder_text(headers)
