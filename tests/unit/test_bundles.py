"""Delay-queue bundles: packing by DelaySeconds under the size and count caps, the version 2
body, its strict decoding entry by entry, and version 1 bodies still read."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from delayq import constants as c
from delayq.envelope import Envelope, bundle_bytes, decode_body, encode_bundle
from delayq.exceptions import ConfigurationError, EnvelopeError
from delayq.queues import DelayQueue, SqsQueue
from delayq.retry import Deadline
from delayq.settings import Settings
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import delay_request


class AcceptingSqs:
    """Takes every entry, except those listed in ``fail_once`` (by entry id) the first time."""

    def __init__(self, fail_once: set[str] | None = None) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.fail_once = fail_once or set()

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:  # noqa: N803 -- boto3's names
        self.batches.append(Entries)
        failing = [e["Id"] for e in Entries if e["Id"] in self.fail_once]
        self.fail_once -= set(failing)
        return {
            "Successful": [{"Id": e["Id"]} for e in Entries if e["Id"] not in failing],
            "Failed": [{"Id": i, "SenderFault": False, "Code": "InternalError"} for i in failing],
        }

    @property
    def entries(self) -> list[dict[str, Any]]:
        return [e for batch in self.batches for e in batch]


def delay_queue(
    sqs: AcceptingSqs,
    *,
    bundle_max_bytes: int = c.DEFAULT_BUNDLE_MAX_BYTES,
    bundle_max_messages: int = c.DEFAULT_BUNDLE_MAX_MESSAGES,
) -> DelayQueue:
    return DelayQueue(
        SqsQueue(as_sqs_client(sqs), "https://sqs/delay", no_sleep_backoff()),
        1000,
        bundle_max_bytes=bundle_max_bytes,
        bundle_max_messages=bundle_max_messages,
    )


def requests_at(n: int, due_ms: int, prefix: str = "m", value: bytes = b"v") -> list[Any]:
    return [delay_request(delay_id=f"{prefix}-{i}", due_ms=due_ms, value=value) for i in range(n)]


def ids_of(body: str) -> list[str]:
    return [e.request.delay_id for e in decode_body(body) if e.request]


# --- packing -------------------------------------------------------------------------------


def test_requests_with_one_delay_travel_as_one_message() -> None:
    sqs = AcceptingSqs()
    requests = requests_at(30, NOW_MS + 60_000)
    delay_queue(sqs).send(requests, NOW_MS, Deadline.after(60))
    [entry] = sqs.entries
    assert json.loads(entry["MessageBody"])["v"] == 2
    assert ids_of(entry["MessageBody"]) == [r.delay_id for r in requests]
    assert entry["DelaySeconds"] == 59  # 60 s less the 1 s lead


def test_requests_are_grouped_by_their_delay_seconds_never_released_after_due() -> None:
    sqs = AcceptingSqs()
    soon = requests_at(3, NOW_MS + 10_000, "soon")
    later = requests_at(2, NOW_MS + 300_400, "later")
    due = requests_at(1, NOW_MS - 5, "due")
    mixed = [soon[0], later[0], due[0], soon[1], later[1], soon[2]]
    delay_queue(sqs).send(mixed, NOW_MS, Deadline.after(60))
    got = {e["DelaySeconds"]: ids_of(e["MessageBody"]) for e in sqs.entries}
    assert got == {
        9: [r.delay_id for r in soon],
        299: [r.delay_id for r in later],
        0: ["due-0"],
    }
    for entry in sqs.entries:
        for e in decode_body(entry["MessageBody"]):
            assert e.request is not None
            assert NOW_MS + entry["DelaySeconds"] * 1000 <= max(NOW_MS, e.request.due_ms)


def test_a_single_request_is_a_version_1_envelope() -> None:
    sqs = AcceptingSqs()
    request = delay_request()
    delay_queue(sqs).send([request], NOW_MS, Deadline.after(60))
    assert [e["MessageBody"] for e in sqs.entries] == [Envelope(request).encode()]


def test_bundles_stay_within_the_byte_cap() -> None:
    sqs = AcceptingSqs()
    requests = requests_at(200, NOW_MS, value=b"x" * 700)  # about 1 KB an entry
    delay_queue(sqs, bundle_max_bytes=16 * 1024).send(requests, NOW_MS, Deadline.after(60))
    bodies = [e["MessageBody"] for e in sqs.entries]
    assert all(len(b.encode()) <= 16 * 1024 for b in bodies)
    entry = len(Envelope(requests[0]).encode())
    # Full bundles: one more entry would not have fitted.
    assert all(bundle_bytes(len(b) + entry, 2) > 16 * 1024 for b in bodies[:-1])
    assert [i for b in bodies for i in ids_of(b)] == [r.delay_id for r in requests]


def test_the_default_byte_cap_is_one_billing_chunk() -> None:
    sqs = AcceptingSqs()
    requests = requests_at(200, NOW_MS, value=b"x" * 700)
    delay_queue(sqs, bundle_max_messages=1000).send(requests, NOW_MS, Deadline.after(60))
    sizes = [len(e["MessageBody"].encode()) for e in sqs.entries]
    assert max(sizes) <= c.SQS_BILLING_CHUNK_BYTES
    assert max(sizes) > c.SQS_BILLING_CHUNK_BYTES - 1100


def test_bundles_stay_within_the_count_cap() -> None:
    sqs = AcceptingSqs()
    delay_queue(sqs, bundle_max_messages=7).send(
        requests_at(20, NOW_MS), NOW_MS, Deadline.after(60)
    )
    assert [len(decode_body(e["MessageBody"])) for e in sqs.entries] == [7, 7, 6]


def test_a_request_larger_than_a_bundle_goes_alone() -> None:
    sqs = AcceptingSqs()
    small = requests_at(2, NOW_MS, "small")
    big = delay_request(delay_id="big", due_ms=NOW_MS, value=b"x" * 30_000)
    delay_queue(sqs, bundle_max_bytes=8 * 1024).send(
        [small[0], big, small[1]], NOW_MS, Deadline.after(60)
    )
    bodies = [e["MessageBody"] for e in sqs.entries]
    assert [ids_of(b) for b in bodies] == [["small-0"], ["big"], ["small-1"]]
    assert bodies[1] == Envelope(big).encode()


def test_a_send_batch_holds_at_most_the_batch_byte_limit_of_bundles() -> None:
    sqs = AcceptingSqs()
    requests = requests_at(400, NOW_MS, value=b"x" * 700)
    delay_queue(sqs, bundle_max_messages=1000).send(requests, NOW_MS, Deadline.after(60))
    assert all(
        sum(len(e["MessageBody"]) for e in batch) <= c.SQS_MAX_BATCH_BYTES for batch in sqs.batches
    )
    assert len(sqs.batches[0]) == 4  # 64 KiB bundles, 256 KiB a call


def test_a_failed_bundle_is_sent_again_whole() -> None:
    sqs = AcceptingSqs(fail_once={"1"})
    requests = requests_at(5, NOW_MS + 10_000, "a") + requests_at(5, NOW_MS + 20_000, "b")
    delay_queue(sqs).send(requests, NOW_MS, Deadline.after(60))
    first, retry = sqs.batches
    assert len(first) == 2
    assert [(e["Id"], ids_of(e["MessageBody"])) for e in retry] == [
        ("1", [f"b-{i}" for i in range(5)])
    ]


def test_bundle_caps_are_settings_with_limits() -> None:
    assert (Settings().bundle_max_bytes, Settings().bundle_max_messages) == (65_536, 100)
    with pytest.raises(ConfigurationError, match="bundle_max_bytes must be 1024"):
        Settings(bundle_max_bytes=c.SQS_MAX_MESSAGE_BYTES + 1)
    with pytest.raises(ConfigurationError, match="bundle_max_messages must be 1"):
        Settings(bundle_max_messages=0)


# --- decoding ------------------------------------------------------------------------------


def test_a_version_1_body_decodes_as_one_entry_carrying_the_body() -> None:
    body = Envelope(delay_request()).encode()
    [entry] = decode_body(body)
    assert (entry.text, entry.request, entry.error) == (body, delay_request(), "")


def test_a_bundle_decodes_entry_by_entry_with_each_entry_as_a_body_of_its_own() -> None:
    requests = requests_at(3, NOW_MS)
    texts = [Envelope(r).encode() for r in requests]
    entries = decode_body(encode_bundle(texts))
    assert [(e.text, e.request) for e in entries] == list(zip(texts, requests, strict=True))


def test_a_bad_entry_does_not_sink_the_good_ones() -> None:
    good = Envelope(delay_request(delay_id="good")).encode()
    bad_due = json.loads(good) | {"due_ms": "soon"}
    body = encode_bundle([good, json.dumps(bad_due), "17", '{"v":3}', good])
    entries = decode_body(body)
    assert [e.request.delay_id if e.request else None for e in entries] == [
        "good",
        None,
        None,
        None,
        "good",
    ]
    errors = [e.error for e in entries]
    assert errors[1].startswith("bundle entry 1: not a delay-queue envelope: due_ms")
    assert errors[2] == "bundle entry 2: entry 2 is not a version 1 envelope"
    assert errors[3] == "bundle entry 3: entry 3 is not a version 1 envelope"
    assert entries[2].text == "17"


@pytest.mark.parametrize(
    "body",
    [
        '{"v":2}',
        '{"v":2,"messages":[]}',
        '{"v":2,"messages":{}}',
        '{"v":2,"messages":[{}],"extra":1}',
        json.dumps({"v": 2, "messages": [1] * (c.MAX_BUNDLE_ENTRIES + 1)}),
    ],
    ids=["no-messages", "empty", "not-a-list", "extra-key", "too-many"],
)
def test_a_malformed_bundle_is_refused_whole(body: str) -> None:
    with pytest.raises(EnvelopeError, match="not a delay-queue bundle"):
        decode_body(body)


@pytest.mark.parametrize("body", ["{not json", "[1]", '{"v":1}', '{"v":7,"messages":[]}'])
def test_a_body_that_is_neither_is_refused(body: str) -> None:
    with pytest.raises(EnvelopeError):
        decode_body(body)


def test_the_single_envelope_decoder_refuses_a_bundle() -> None:
    with pytest.raises(EnvelopeError, match="unknown envelope version 2"):
        Envelope.decode(encode_bundle([Envelope(delay_request()).encode()] * 2))


def test_bundle_bytes_is_the_encoded_size() -> None:
    texts = [Envelope(replace(delay_request(), delay_id=f"id-{i}")).encode() for i in range(4)]
    assert bundle_bytes(sum(map(len, texts)), 4) == len(encode_bundle(texts))
    assert encode_bundle(texts[:1]) == texts[0]
