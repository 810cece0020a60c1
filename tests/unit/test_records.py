"""Records of the delay topic: parsing event records, rejection reasons, the records kept
with a rejection, and the headers of a delivered record."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import constants as c
from delayq.exceptions import MalformedEventError
from delayq.limits import UNKNOWN_TENANT
from delayq.records import (
    CancelRequest,
    DelayRequest,
    Reason,
    RejectedRecord,
    RescheduleRequest,
    _header_value,
    delivery_headers,
    estimated_body_bytes,
    iter_event_records,
    parse_record,
    rejection_of,
)
from delayq.settings import Settings
from testkit.clock import NOW_MS
from testkit.events import header, kafka_event, kafka_record
from tests.factories import PROPERTY, delay_request

WEEK_S = 7 * 24 * 3600


def parse(record: Any, settings: Settings, now_ms: int = NOW_MS) -> DelayRequest:
    parsed = parse_record(record, settings, now_ms)
    assert isinstance(parsed, DelayRequest)
    return parsed


def rejected(record: Any, settings: Settings, now_ms: int = NOW_MS) -> RejectedRecord:
    with pytest.raises(RejectedRecord) as caught:
        parse_record(record, settings, now_ms)
    return caught.value


def without(record: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != name}


def replaced(**fields: Any) -> Callable[[], dict[str, Any]]:
    """A valid record with some raw fields replaced."""
    return lambda: {**kafka_record(target="reminders", seconds="30"), **fields}


# --- valid records -----------------------------------------------------------------------------


def test_absolute_due_time_is_taken_as_given(settings: Settings) -> None:
    request = parse(
        kafka_record(target="orders.timeout", deliver_at=str(NOW_MS + 3_600_000)), settings
    )
    assert request.due_ms == NOW_MS + 3_600_000
    assert request.target == "orders.timeout"


def test_key_and_value_are_decoded_to_the_original_bytes(settings: Settings) -> None:
    request = parse(
        kafka_record(key=b"\x00\xffkey", value=b"\x01binary\x80", target="reminders", seconds="1"),
        settings,
    )
    assert (request.key, request.value) == (b"\x00\xffkey", b"\x01binary\x80")


def test_missing_key_and_value_stay_none(settings: Settings) -> None:
    request = parse(kafka_record(key=None, value=None, target="reminders", seconds="1"), settings)
    assert (request.key, request.value) == (None, None)


def test_relative_seconds_count_from_the_record_timestamp_not_now(settings: Settings) -> None:
    record = kafka_record(timestamp=NOW_MS - 5000, target="reminders", seconds="30")
    assert parse(record, settings, now_ms=NOW_MS).due_ms == NOW_MS + 25_000


def test_a_request_and_a_cancel_carry_their_record_timestamp(settings: Settings) -> None:
    # It orders a message against the cancels of its id.
    message = kafka_record(timestamp=NOW_MS - 7, target="reminders", seconds="30", id="r-1")
    cancel = kafka_record(timestamp=NOW_MS - 3, cancel="r-1")
    assert parse(message, settings).ts_ms == NOW_MS - 7
    assert parse_record(cancel, settings, NOW_MS) == CancelRequest(
        "r-1", "delay-requests-0-0", NOW_MS - 3
    )


def test_a_reschedule_carries_old_and_new_due_and_its_record_time(settings: Settings) -> None:
    record = kafka_record(
        offset=9, timestamp=NOW_MS - 3, reschedule=" r-1 ", was_due=str(NOW_MS + 60_000), ms="500"
    )
    record["value"] = "not base64!"  # key, value and other headers of a control record unused
    assert parse_record(record, settings, NOW_MS) == RescheduleRequest(
        "r-1", NOW_MS + 60_000, NOW_MS - 3 + 500, "delay-requests-0-9", NOW_MS - 3
    )


def test_a_reschedule_to_an_absolute_time_in_the_past_is_accepted(settings: Settings) -> None:
    record = kafka_record(reschedule="r-1", was_due=str(NOW_MS + 60_000), deliver_at="1")
    assert parse_record(record, settings, NOW_MS) == RescheduleRequest(
        "r-1", NOW_MS + 60_000, 1, "delay-requests-0-0", NOW_MS
    )


def test_relative_ms_count_from_the_record_timestamp_not_now(settings: Settings) -> None:
    record = kafka_record(timestamp=NOW_MS - 5000, target="reminders", ms="30000")
    assert parse(record, settings, now_ms=NOW_MS + 1234).due_ms == NOW_MS + 25_000


@pytest.mark.parametrize("timestamp", [-1, None])
def test_missing_broker_timestamp_counts_from_now(
    settings: Settings, timestamp: int | None
) -> None:
    record = kafka_record(target="reminders", seconds="30")
    record["timestamp"] = timestamp
    assert parse(record, settings, now_ms=NOW_MS + 777).due_ms == NOW_MS + 777 + 30_000


@pytest.mark.parametrize(
    ("seconds", "delay_ms"), [("1.5", 1500), ("2.25", 2250), ("0.001", 1), (" 10 ", 10_000)]
)
def test_delay_seconds_may_be_fractional(settings: Settings, seconds: str, delay_ms: int) -> None:
    assert parse(kafka_record(target="reminders", seconds=seconds), settings).due_ms == (
        NOW_MS + delay_ms
    )


@pytest.mark.parametrize(
    ("seconds", "delay_ms"),
    [("0.123456789", 124), ("1.999999999", 2000), ("0.0004", 1), ("2.500000000", 2500)],
)
def test_delay_seconds_take_up_to_nine_decimals_rounded_up_to_the_ms(
    settings: Settings, seconds: str, delay_ms: int
) -> None:
    assert parse(kafka_record(target="reminders", seconds=seconds), settings).due_ms == (
        NOW_MS + delay_ms
    )


def test_delay_seconds_are_converted_exactly_not_through_a_float(settings: Settings) -> None:
    # As a float, 2.0035 * 1000 is 2003.4999999999998 (2003 ms); it is exactly 2003.5 ms.
    record = kafka_record(target="reminders", seconds="2.0035")
    assert parse(record, settings).due_ms == NOW_MS + 2004


@pytest.mark.parametrize(
    ("name", "text", "due_ms"),
    [
        (c.HEADER_DELAY_MS, "0" * 20 + "1500", NOW_MS + 1500),
        (c.HEADER_DELAY_SECONDS, "0" * 20 + "1.5", NOW_MS + 1500),
        (c.HEADER_DELIVER_AT, "0" * 20 + str(NOW_MS), NOW_MS),
    ],
)
def test_leading_zeros_are_not_significant_digits(
    settings: Settings, name: str, text: str, due_ms: int
) -> None:
    record = kafka_record(target="reminders", headers=[header(name, text)])
    assert parse(record, settings).due_ms == due_ms


@pytest.mark.parametrize(
    ("name", "number", "due_ms"),
    [(c.HEADER_DELAY_MS, "1500", NOW_MS + 1500), (c.HEADER_DELIVER_AT, str(NOW_MS), NOW_MS)],
)
def test_thousands_of_leading_zeros_are_still_not_significant(
    settings: Settings, name: str, number: str, due_ms: int
) -> None:
    record = kafka_record(target="reminders", headers=[header(name, "0" * 5000 + number)])
    assert parse(record, settings).due_ms == due_ms


def test_due_in_the_past_is_accepted(settings: Settings) -> None:
    record = kafka_record(target="reminders", deliver_at=str(NOW_MS - 60_000))
    assert parse(record, settings).due_ms == NOW_MS - 60_000


def test_default_id_is_topic_partition_offset(settings: Settings) -> None:
    record = kafka_record(topic="delay-in", partition=3, offset=1207, target="reminders", ms="1")
    request = parse(record, settings)
    assert request.delay_id == "delay-in-3-1207"
    assert request.src == "delay-in-3-1207"


def test_explicit_id_is_trimmed_and_kept_with_the_source(settings: Settings) -> None:
    request = parse(kafka_record(offset=9, target="reminders", ms="1", id="  order-42 "), settings)
    assert (request.delay_id, request.src) == ("order-42", "delay-requests-0-9")


def test_control_headers_are_stripped_and_user_headers_kept_in_order(settings: Settings) -> None:
    record = kafka_record(
        target="reminders",
        seconds="5",
        headers=[
            header("trace", "t-1"),
            {"empty": None},
            header("Delay-Custom", "x"),
            header("trace", "t-2"),
            header("delayed-by", "me"),
            header("binary", b"\x00\xff"),
        ],
    )
    assert parse(record, settings).headers == (
        ("trace", b"t-1"),
        ("empty", None),
        ("trace", b"t-2"),
        ("delayed-by", b"me"),
        ("binary", b"\x00\xff"),
    )


def test_control_header_names_are_case_insensitive(settings: Settings) -> None:
    record = kafka_record(
        headers=[
            header("DELAY-TARGET", "reminders"),
            header("Delay-Seconds", "5"),
            header("Delay-Id", "abc"),
        ]
    )
    request = parse(record, settings)
    assert (request.target, request.due_ms, request.delay_id) == ("reminders", NOW_MS + 5000, "abc")
    assert request.headers == ()


def test_a_null_headers_field_is_read_as_no_headers(settings: Settings) -> None:
    record = kafka_record(target="reminders", seconds="1")
    record["headers"] = None
    with pytest.raises(RejectedRecord) as caught:
        parse_record(record, settings, NOW_MS)
    assert caught.value.reason is Reason.MISSING_TARGET


def test_cancel_record_needs_no_target_due_or_valid_value(settings: Settings) -> None:
    record = kafka_record(offset=4, cancel=" order-42 ")
    record["value"] = "not base64!"
    assert parse_record(record, settings, NOW_MS) == CancelRequest(
        "order-42", "delay-requests-0-4", NOW_MS
    )


def test_delay_of_exactly_the_maximum_is_accepted(settings: Settings) -> None:
    assert parse(kafka_record(target="reminders", seconds=str(WEEK_S)), settings).due_ms == (
        NOW_MS + WEEK_S * 1000
    )


def test_id_of_exactly_the_maximum_length_is_accepted(settings: Settings) -> None:
    delay_id = "x" * c.MAX_ID_LENGTH
    assert parse(kafka_record(target="reminders", ms="1", id=delay_id), settings).delay_id == (
        delay_id
    )


@pytest.mark.parametrize(
    "delay_id",
    ["\U0001f600" * 250, "\u00e9" * 500],  # 1,000 bytes of UTF-8 each
    ids=["250-emoji", "500-two-byte"],
)
def test_id_of_exactly_the_maximum_bytes_is_accepted(settings: Settings, delay_id: str) -> None:
    assert parse(kafka_record(target="reminders", ms="1", id=delay_id), settings).delay_id == (
        delay_id
    )


def test_cancel_id_of_exactly_the_maximum_bytes_is_accepted(settings: Settings) -> None:
    cancel_id = "\U0001f600" * 250
    assert parse_record(kafka_record(cancel=cancel_id), settings, NOW_MS) == CancelRequest(
        cancel_id, "delay-requests-0-0", NOW_MS
    )


def test_payload_of_exactly_the_maximum_size_is_accepted(settings: Settings) -> None:
    small = settings.with_overrides(max_payload_bytes=100)
    record = kafka_record(
        key=b"kk", value=b"v" * 90, headers=[header("h", "1234567")], target="reminders", ms="1"
    )
    assert parse(record, small).size == 100


def inline_record(name_length: int) -> dict[str, Any]:
    """No key, no value, one null header whose ASCII name is ``name_length`` long."""
    return kafka_record(
        key=None, value=None, target="reminders", ms="1", headers=[{"h" * name_length: None}]
    )


def name_length_at_the_inline_cap(settings: Settings) -> int:
    """The header name length at which key + headers take exactly the cap, encoded (one
    ASCII character of a name is one byte of the envelope)."""
    one = estimated_body_bytes(replace(parse(inline_record(1), settings), value=None))
    return 1 + c.MAX_INLINE_KEY_AND_HEADERS_BYTES - one


def test_inline_key_and_headers_of_exactly_the_cap_encoded_are_accepted(
    settings: Settings,
) -> None:
    length = name_length_at_the_inline_cap(settings)
    assert len(parse(inline_record(length), settings).headers[0][0]) == length


def test_inline_key_and_headers_one_encoded_byte_over_the_cap_are_rejected(
    settings: Settings,
) -> None:
    error = rejected(inline_record(name_length_at_the_inline_cap(settings) + 1), settings)
    assert (error.reason, error.detail) == (
        Reason.PAYLOAD_TOO_LARGE,
        f"key + headers take {c.MAX_INLINE_KEY_AND_HEADERS_BYTES + 1} bytes encoded; "
        f"maximum is {c.MAX_INLINE_KEY_AND_HEADERS_BYTES}",
    )


def test_the_key_counts_as_base64_toward_the_inline_cap(settings: Settings) -> None:
    # 48 KiB of raw key is 64 KiB of base64: with the envelope around it, over the cap.
    raw = c.MAX_INLINE_KEY_AND_HEADERS_BYTES // 4 * 3
    error = rejected(kafka_record(key=b"k" * raw, target="reminders", ms="1"), settings)
    assert error.reason is Reason.PAYLOAD_TOO_LARGE


def test_the_value_does_not_count_toward_the_inline_cap(settings: Settings) -> None:
    value = b"v" * (2 * c.MAX_INLINE_KEY_AND_HEADERS_BYTES)
    assert parse(kafka_record(value=value, target="reminders", ms="1"), settings).value == value


def test_texts_json_escapes_count_as_escaped_in_a_copy_of_a_measured_request(
    settings: Settings,
) -> None:
    request = parse(kafka_record(target="reminders", ms="1"), settings)
    measured = estimated_body_bytes(request)  # remembered on ``request``, not on its copies
    plain, quoted = replace(request, tenant="t_n"), replace(request, tenant='t"n')
    assert estimated_body_bytes(plain) == measured + len("t_n")  # the empty tenant was ""
    # The quote is written as two characters (\"): one byte more than the plain tenant.
    assert estimated_body_bytes(quoted) == estimated_body_bytes(plain) + 1


def test_header_names_count_as_escaped_json(settings: Settings) -> None:
    # One control byte is six characters of JSON (\u0001): 11,000 of them exceed 64 KiB.
    record = kafka_record(target="reminders", ms="1", headers=[{"\x01" * 11_000: [1]}])
    with pytest.raises(RejectedRecord) as raised:
        parse(record, settings)
    assert raised.value.reason is Reason.PAYLOAD_TOO_LARGE


def test_request_size_counts_key_value_and_user_header_names_and_values() -> None:
    request = delay_request(key=b"12", value=b"345", headers=(("ab", b"cd"), ("e", None)))
    assert request.size == 2 + 3 + 4 + 1


# --- every rejection reason --------------------------------------------------------------------

EMOJI = "\U0001f600"  # one character, four bytes of UTF-8
DUE_HEADERS = {
    "ms": c.HEADER_DELAY_MS,
    "seconds": c.HEADER_DELAY_SECONDS,
    "deliver-at": c.HEADER_DELIVER_AT,
}
# Numbers Python would read (int(), float()) that are not plain ASCII decimals.
NOT_PLAIN = {
    "underscore": "1_000",
    "arabic-indic": "\u0661\u0662\u0663",  # ARABIC-INDIC DIGIT ONE, TWO, THREE
    "fullwidth": "\uff11\uff12",  # FULLWIDTH DIGIT ONE, TWO
    "plus": "+5",
    "e-notation": "1e3",
    "infinity": "Infinity",
    "hex": "0x10",
    "inner-space": "1 000",
    "empty": "",
}


def due_record(name: str, text: str) -> Callable[[], dict[str, Any]]:
    """A record whose only due header is ``name: text``."""
    return lambda: kafka_record(target="reminders", headers=[header(name, text)])


REJECTIONS: list[tuple[str, Callable[[], Any], Reason, str]] = [
    ("record-not-object", lambda: ["x"], Reason.MALFORMED_RECORD, "record is not an object"),
    (
        "topic-missing",
        lambda: without(kafka_record(target="reminders", ms="1"), "topic"),
        Reason.MALFORMED_RECORD,
        "'topic'",
    ),
    ("topic-empty", replaced(topic=""), Reason.MALFORMED_RECORD, "'topic'"),
    ("partition-negative", replaced(partition=-1), Reason.MALFORMED_RECORD, "'partition'"),
    ("partition-text", replaced(partition="0"), Reason.MALFORMED_RECORD, "'partition'"),
    ("offset-bool", replaced(offset=True), Reason.MALFORMED_RECORD, "'offset'"),
    ("timestamp-text", replaced(timestamp="now"), Reason.MALFORMED_RECORD, "'timestamp'"),
    ("timestamp-negative", replaced(timestamp=-2), Reason.MALFORMED_RECORD, "'timestamp'"),
    ("timestamp-bool", replaced(timestamp=True), Reason.MALFORMED_RECORD, "'timestamp'"),
    ("key-bad", replaced(key="@@@"), Reason.BAD_BASE64, "key is not valid base64"),
    ("value-unpadded", replaced(value="dg"), Reason.BAD_BASE64, "value is not valid base64"),
    ("value-non-ascii", replaced(value="é"), Reason.BAD_BASE64, "value is not valid base64"),
    ("value-number", replaced(value=5), Reason.BAD_BASE64, "value is not a base64 string"),
    ("headers-not-list", replaced(headers={"a": [1]}), Reason.BAD_HEADERS, "not a list"),
    ("header-not-object", replaced(headers=["a"]), Reason.BAD_HEADERS, "not an object"),
    ("header-name-empty", replaced(headers=[{"": [1]}]), Reason.BAD_HEADERS, "name is empty"),
    ("header-text", replaced(headers=[{"a": "text"}]), Reason.BAD_HEADERS, "not a byte array"),
    ("header-byte-300", replaced(headers=[{"a": [300]}]), Reason.BAD_HEADERS, "non-byte"),
    ("header-byte-str", replaced(headers=[{"a": ["x"]}]), Reason.BAD_HEADERS, "non-byte"),
    ("header-byte-true", replaced(headers=[{"a": [True]}]), Reason.BAD_HEADERS, "non-byte"),
    ("header-byte-false", replaced(headers=[{"a": [1, False]}]), Reason.BAD_HEADERS, "non-byte"),
    (
        "header-name-surrogate",
        replaced(headers=[{"h\ud800": [1]}]),
        Reason.BAD_HEADERS,
        "a header name is not UTF-8",
    ),
    (
        "control-header-name-surrogate",
        lambda: kafka_record(target="reminders", ms="1", headers=[{"delay-\udcff": [1]}]),
        Reason.BAD_HEADERS,
        "a header name is not UTF-8",
    ),
    (
        "control-twice",
        lambda: kafka_record(
            target="reminders", ms="1", headers=[header("Delay-Target", "orders.a")]
        ),
        Reason.BAD_HEADERS,
        "'delay-target' appears twice",
    ),
    (
        "control-not-utf8",
        lambda: kafka_record(ms="1", headers=[header("delay-target", b"\xff\xfe")]),
        Reason.BAD_HEADERS,
        "'delay-target' is not UTF-8",
    ),
    ("target-missing", lambda: kafka_record(ms="1"), Reason.MISSING_TARGET, "delay-target"),
    (
        "target-blank",
        lambda: kafka_record(target="  ", ms="1"),
        Reason.MISSING_TARGET,
        "delay-target",
    ),
    (
        "target-null",
        lambda: kafka_record(ms="1", headers=[{"delay-target": None}]),
        Reason.MISSING_TARGET,
        "delay-target",
    ),
    (
        "target-other",
        lambda: kafka_record(target="payments", ms="1"),
        Reason.TARGET_NOT_ALLOWED,
        "'payments'",
    ),
    (
        "target-pattern-needs-dot",
        lambda: kafka_record(target="orders", ms="1"),
        Reason.TARGET_NOT_ALLOWED,
        "'orders'",
    ),
    (
        "target-case-sensitive",
        lambda: kafka_record(target="Reminders", ms="1"),
        Reason.TARGET_NOT_ALLOWED,
        "'Reminders'",
    ),
    ("due-missing", lambda: kafka_record(target="reminders"), Reason.MISSING_DUE, "required"),
    (
        "seconds-text",
        lambda: kafka_record(target="reminders", seconds="soon"),
        Reason.BAD_DUE,
        "delay-seconds='soon' is not a plain number",
    ),
    (
        "seconds-nan",
        lambda: kafka_record(target="reminders", seconds="nan"),
        Reason.BAD_DUE,
        "not a plain number",
    ),
    (
        "seconds-inf",
        lambda: kafka_record(target="reminders", seconds="inf"),
        Reason.BAD_DUE,
        "not a plain number",
    ),
    *[
        (
            f"{name}-{variant}",
            due_record(header_name, text),
            Reason.BAD_DUE,
            f"{header_name}={text!r} is not a plain number",
        )
        for name, header_name in DUE_HEADERS.items()
        for variant, text in NOT_PLAIN.items()
    ],
    *[
        (
            f"seconds-{variant}",
            due_record(c.HEADER_DELAY_SECONDS, text),
            Reason.BAD_DUE,
            "not a plain number",
        )
        for variant, text in {
            "huge-exponent": "1e306",
            "ten-decimals": "1.0000000001",
            "bare-point": "1.",
            "no-integer-part": ".5",
        }.items()
    ],
    (
        "seconds-long-text",
        due_record(c.HEADER_DELAY_SECONDS, "x" * 1000),
        Reason.BAD_DUE,
        f"delay-seconds={'x' * 64!r} is not a plain number",
    ),
    *[
        (
            f"{name}-400-digits",
            due_record(header_name, "9" * 400),
            Reason.DELAY_TOO_LONG,
            f"{header_name} has too many digits",
        )
        for name, header_name in DUE_HEADERS.items()
    ],
    *[
        (
            f"{name}-16-digits",
            due_record(header_name, "1" + "0" * 15),
            Reason.DELAY_TOO_LONG,
            "has too many digits",
        )
        for name, header_name in DUE_HEADERS.items()
    ],
    *[
        (
            f"{name}-15-digits",
            due_record(header_name, "9" * 15),
            Reason.DELAY_TOO_LONG,
            f"maximum is {WEEK_S}s",
        )
        for name, header_name in DUE_HEADERS.items()
    ],
    (
        "seconds-16-digits-with-decimals",
        due_record(c.HEADER_DELAY_SECONDS, "1" + "0" * 15 + ".5"),
        Reason.DELAY_TOO_LONG,
        "has too many digits",
    ),
    (
        "seconds-negative",
        lambda: kafka_record(target="reminders", seconds="-0.5"),
        Reason.BAD_DUE,
        "negative",
    ),
    (
        "ms-fractional",
        lambda: kafka_record(target="reminders", ms="1.5"),
        Reason.BAD_DUE,
        "not a plain number",
    ),
    ("ms-negative", lambda: kafka_record(target="reminders", ms="-1"), Reason.BAD_DUE, "negative"),
    (
        "ms-negative-zero",
        lambda: kafka_record(target="reminders", ms="-0"),
        Reason.BAD_DUE,
        "delay-ms='-0' is negative",
    ),
    (
        "ms-negative-huge",
        due_record(c.HEADER_DELAY_MS, "-" + "9" * 400),
        Reason.BAD_DUE,
        "is negative",
    ),
    (
        "deliver-at-negative",
        lambda: kafka_record(target="reminders", deliver_at="-1"),
        Reason.BAD_DUE,
        "delay-deliver-at='-1' is negative",
    ),
    (
        "deliver-at-zero",
        lambda: kafka_record(target="reminders", deliver_at="0"),
        Reason.BAD_DUE,
        "delay-deliver-at='0' is not epoch milliseconds",
    ),
    (
        "deliver-at-zeros",
        lambda: kafka_record(target="reminders", deliver_at="000"),
        Reason.BAD_DUE,
        "not epoch milliseconds",
    ),
    (
        "deliver-at-exponent",
        lambda: kafka_record(target="reminders", deliver_at="1.8e12"),
        Reason.BAD_DUE,
        "not a plain number",
    ),
    (
        "seconds-and-ms",
        lambda: kafka_record(target="reminders", seconds="1", ms="1000"),
        Reason.CONFLICTING_DUE,
        "delay-seconds, delay-ms",
    ),
    (
        "deliver-at-and-seconds",
        lambda: kafka_record(target="reminders", deliver_at=str(NOW_MS), seconds="1"),
        Reason.CONFLICTING_DUE,
        "delay-deliver-at, delay-seconds",
    ),
    (
        "one-ms-beyond-max",
        lambda: kafka_record(target="reminders", ms=str(WEEK_S * 1000 + 1)),
        Reason.DELAY_TOO_LONG,
        f"maximum is {WEEK_S}s",
    ),
    (
        "deliver-at-beyond-max",
        lambda: kafka_record(target="reminders", deliver_at=str(NOW_MS + 8 * 86_400_000)),
        Reason.DELAY_TOO_LONG,
        f"maximum is {WEEK_S}s",
    ),
    (
        "payload-over-max",
        lambda: kafka_record(
            key=None, value=b"v" * (c.DEFAULT_MAX_PAYLOAD_BYTES + 1), target="reminders", ms="1"
        ),
        Reason.PAYLOAD_TOO_LARGE,
        f"{c.DEFAULT_MAX_PAYLOAD_BYTES + 1} bytes",
    ),
    (
        "inline-over-cap",
        lambda: kafka_record(
            key=b"k" * c.MAX_INLINE_KEY_AND_HEADERS_BYTES,
            headers=[header("h", "")],
            target="reminders",
            ms="1",
        ),
        Reason.PAYLOAD_TOO_LARGE,
        f"bytes encoded; maximum is {c.MAX_INLINE_KEY_AND_HEADERS_BYTES}",
    ),
    (
        "id-blank",
        lambda: kafka_record(target="reminders", ms="1", id="   "),
        Reason.BAD_ID,
        "delay-id",
    ),
    (
        "id-too-long",
        lambda: kafka_record(target="reminders", ms="1", id="x" * (c.MAX_ID_LENGTH + 1)),
        Reason.BAD_ID,
        "delay-id",
    ),
    (
        "id-control-char",
        lambda: kafka_record(target="reminders", ms="1", id="a\x00b"),
        Reason.BAD_ID,
        "delay-id",
    ),
    (
        "id-over-1024-bytes",
        lambda: kafka_record(target="reminders", ms="1", id=EMOJI * 300),
        Reason.BAD_ID,
        f"delay-id must be 1..{c.MAX_ID_LENGTH} printable characters "
        f"and at most {c.MAX_ID_BYTES} bytes of UTF-8",
    ),
    (
        "id-one-byte-over",
        lambda: kafka_record(target="reminders", ms="1", id=EMOJI * 256 + "x"),
        Reason.BAD_ID,
        "delay-id",
    ),
    ("cancel-blank", lambda: kafka_record(cancel=""), Reason.BAD_ID, "delay-cancel"),
    (
        "cancel-over-1024-bytes",
        lambda: kafka_record(cancel=EMOJI * 300),
        Reason.BAD_ID,
        f"delay-cancel must be 1..{c.MAX_ID_LENGTH} printable characters "
        f"and at most {c.MAX_ID_BYTES} bytes of UTF-8",
    ),
    (
        "reschedule-without-was-due",
        lambda: kafka_record(reschedule="r-1", ms="1"),
        Reason.MISSING_DUE,
        "delay-reschedule needs delay-was-due",
    ),
    (
        "reschedule-without-new-due",
        lambda: kafka_record(reschedule="r-1", was_due=str(NOW_MS + 60_000)),
        Reason.MISSING_DUE,
        "one of delay-deliver-at, delay-seconds, delay-ms is required",
    ),
    (
        "reschedule-was-due-not-a-number",
        lambda: kafka_record(reschedule="r-1", was_due="soon", ms="1"),
        Reason.BAD_DUE,
        "delay-was-due='soon' is not a plain number",
    ),
    (
        "reschedule-beyond-the-maximum",
        lambda: kafka_record(reschedule="r-1", was_due=str(NOW_MS), seconds=str(WEEK_S + 1)),
        Reason.DELAY_TOO_LONG,
        "maximum is",
    ),
    (
        "reschedule-and-cancel",
        lambda: kafka_record(cancel="r-1", reschedule="r-1", was_due=str(NOW_MS), ms="1"),
        Reason.BAD_HEADERS,
        "delay-cancel and delay-reschedule in one record",
    ),
    (
        "reschedule-blank-id",
        lambda: kafka_record(reschedule=" "),
        Reason.BAD_ID,
        "delay-reschedule",
    ),
    (
        "tenant-blank",
        lambda: kafka_record(target="reminders", ms="1", tenant="  "),
        Reason.BAD_TENANT,
        f"delay-tenant must be 1..{c.MAX_TENANT_LENGTH} printable characters",
    ),
    (
        "tenant-too-long",
        lambda: kafka_record(target="reminders", ms="1", tenant="t" * (c.MAX_TENANT_LENGTH + 1)),
        Reason.BAD_TENANT,
        "delay-tenant",
    ),
    (
        "tenant-control-char",
        lambda: kafka_record(target="reminders", ms="1", tenant="a\tb"),
        Reason.BAD_TENANT,
        "delay-tenant",
    ),
    (
        "tenant-deferred-bucket",  # would share X's deferred counters (rate#X/deferred#...)
        lambda: kafka_record(target="reminders", ms="1", tenant="X/deferred"),
        Reason.BAD_TENANT,
        "none of # / *",
    ),
    (
        "tenant-key-separator",
        lambda: kafka_record(target="reminders", ms="1", tenant="X#1795248000"),
        Reason.BAD_TENANT,
        "none of # / *",
    ),
    (
        "tenant-the-default",
        lambda: kafka_record(target="reminders", ms="1", tenant="*"),
        Reason.BAD_TENANT,
        "none of # / *",
    ),
    (
        "priority-unknown",
        lambda: kafka_record(target="reminders", ms="1", priority="urgent"),
        Reason.BAD_PRIORITY,
        "delay-priority='urgent': one of high, normal, low",
    ),
]


@pytest.mark.parametrize(
    ("build", "reason", "detail"),
    [pytest.param(b, r, d, id=name) for name, b, r, d in REJECTIONS],
)
def test_bad_record_is_rejected_with_a_precise_reason(
    settings: Settings, build: Callable[[], Any], reason: Reason, detail: str
) -> None:
    error = rejected(build(), settings)
    assert error.reason is reason
    assert detail in error.detail


def test_every_input_reason_has_a_rejection_case() -> None:
    covered = {reason for _, _, reason, _ in REJECTIONS}
    # bad-envelope is the emitter's verdict on a queue body, not on an input record;
    # internal-error is ingest's for a record the parser itself failed on (test_ingest);
    # quota-exceeded is ingest's for a tenant over its quota (test_shaping); the reschedule
    # reasons are ingest's verdicts on what the store holds (tests/functional/test_reschedule).
    assert covered == set(Reason) - {
        Reason.BAD_ENVELOPE,
        Reason.INTERNAL_ERROR,
        Reason.QUOTA_EXCEEDED,
        Reason.RESCHEDULE_NOT_FOUND,
        Reason.RESCHEDULE_CANCELLED,
        Reason.RESCHEDULE_TOO_LATE,
    }


def test_reason_codes_are_the_documented_strings() -> None:
    assert sorted(str(r) for r in Reason) == sorted(
        [
            "malformed-record",
            "bad-base64",
            "bad-headers",
            "missing-target",
            "target-not-allowed",
            "missing-due",
            "bad-due",
            "conflicting-due",
            "delay-too-long",
            "payload-too-large",
            "bad-id",
            "bad-envelope",
            "bad-tenant",
            "reschedule-not-found",
            "reschedule-cancelled",
            "reschedule-too-late",
            "bad-priority",
            "quota-exceeded",
            "internal-error",
        ]
    )


def test_delay_limit_is_measured_from_now_not_from_the_timestamp(settings: Settings) -> None:
    # Written a minute ago with a week's delay: due is a minute short of a week from now.
    record = kafka_record(timestamp=NOW_MS - 60_000, target="reminders", seconds=str(WEEK_S))
    assert parse(record, settings).due_ms == NOW_MS + WEEK_S * 1000 - 60_000


def test_rejected_record_message_names_reason_and_detail() -> None:
    assert str(RejectedRecord(Reason.BAD_ID, "too long")) == "bad-id: too long"


# --- rejections keep the original record -------------------------------------------------------


def test_rejection_keeps_the_record_and_its_coordinates(settings: Settings) -> None:
    record = kafka_record(topic="delay-in", partition=2, offset=77, ms="1")
    rejection = rejection_of(record, rejected(record, settings))
    assert rejection.record is record
    assert (rejection.topic, rejection.partition, rejection.offset) == ("delay-in", 2, 77)
    assert rejection.reason is Reason.MISSING_TARGET


def test_rejection_drops_coordinates_of_the_wrong_type() -> None:
    record = {"topic": 5, "partition": True, "offset": "7"}
    rejection = rejection_of(record, RejectedRecord(Reason.MALFORMED_RECORD, "x"))
    assert (rejection.topic, rejection.partition, rejection.offset) == (None, None, None)


def test_rejection_of_a_non_object_record_has_no_coordinates() -> None:
    rejection = rejection_of("junk", RejectedRecord(Reason.MALFORMED_RECORD, "x"))
    assert (rejection.record, rejection.topic, rejection.offset) == ("junk", None, None)


# --- events ------------------------------------------------------------------------------------


def test_event_records_are_yielded_partition_by_partition_in_order() -> None:
    event = kafka_event(
        kafka_record(partition=0, offset=1),
        kafka_record(partition=1, offset=5),
        kafka_record(partition=0, offset=2),
    )
    assert [(r["partition"], r["offset"]) for r in iter_event_records(event)] == [
        (0, 1),
        (0, 2),
        (1, 5),
    ]


@pytest.mark.parametrize(
    "event", [None, [], {"Records": []}, {"records": []}, {"records": {"t-0": {"offset": 1}}}]
)
def test_an_event_that_is_not_a_kafka_event_fails_loudly(event: Any) -> None:
    with pytest.raises(MalformedEventError):
        list(iter_event_records(event))


def test_tenant_and_priority_headers_are_read_and_the_tenant_defaults_to_the_target(
    settings: Settings,
) -> None:
    named = parse(
        kafka_record(target="reminders", ms="1", tenant=" acme ", priority="HIGH"), settings
    )
    assert (named.tenant, named.owner, named.priority) == ("acme", "acme", c.PRIORITY_HIGH)
    plain = parse(kafka_record(target="reminders", ms="1"), settings)
    assert (plain.tenant, plain.owner, plain.priority) == ("", "reminders", c.PRIORITY_NORMAL)
    assert plain.release_at_ms == plain.due_ms


# --- headers -----------------------------------------------------------------------------------


def test_delivery_headers_are_user_headers_then_id_due_emitted_attempt() -> None:
    request = delay_request(delay_id="order-7", due_ms=1000, headers=(("a", b"1"), ("a", None)))
    assert delivery_headers(request, emitted_ms=1234, attempt=2) == [
        ("a", b"1"),
        ("a", None),
        ("delay-id", b"order-7"),
        ("delay-due-ms", b"1000"),
        ("delay-emitted-ms", b"1234"),
        ("delay-attempt", b"2"),
    ]


def test_header_bytes_arrive_signed_from_lambda_and_unsigned_from_other_sources(
    settings: Settings,
) -> None:
    # "é" is 0xC3 0xA9: Java (and so the MSK event source) sends [-61, -87].
    signed = kafka_record(target="reminders", ms="1", headers=[{"name": [-61, -87]}])
    unsigned = kafka_record(target="reminders", ms="1", headers=[{"name": [195, 169]}])
    assert parse(signed, settings).headers == (("name", "é".encode()),)
    assert parse(unsigned, settings).headers == (("name", "é".encode()),)


@pytest.mark.parametrize("bad", [[-129], [256], [1.0], [True], ["a"]])
def test_header_values_outside_a_byte_are_bad_headers(
    settings: Settings, bad: list[object]
) -> None:
    record = kafka_record(target="reminders", ms="1", headers=[{"name": bad}])
    with pytest.raises(RejectedRecord) as raised:
        parse(record, settings)
    assert raised.value.reason is Reason.BAD_HEADERS


@PROPERTY
@given(values=st.lists(st.integers(min_value=-128, max_value=255), max_size=64))
def test_any_byte_notation_mix_reads_as_those_bytes(values: list[int]) -> None:
    assert _header_value("h", values) == bytes(b & 0xFF for b in values)


def test_a_tenant_bound_to_other_delay_topics_is_counted_as_unknown(settings: Settings) -> None:
    bound = settings.with_overrides(
        tenant_limits=json.dumps(
            {"victim": {"ingest_per_second": 5, "topics": ["delay-victim"]}, "*": {}}
        )
    )
    forged = kafka_record(topic="delay-requests", target="reminders", ms="1", tenant="victim")
    honest = kafka_record(topic="delay-victim", target="reminders", ms="1", tenant="victim")
    assert parse(forged, bound).tenant == UNKNOWN_TENANT
    assert parse(honest, bound).tenant == "victim"


def test_a_priority_the_tenant_may_not_use_is_rejected(settings: Settings) -> None:
    bound = settings.with_overrides(tenant_limits=json.dumps({"bulk": {"priorities": ["low"]}}))
    error = rejected(
        kafka_record(target="reminders", ms="1", tenant="bulk", priority="high"), bound
    )
    assert error.reason is Reason.BAD_PRIORITY
    assert error.detail == "tenant 'bulk' may not use priority high"
    assert parse(kafka_record(target="reminders", ms="1", tenant="bulk", priority="low"), bound)
