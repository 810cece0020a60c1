"""The S3 claim-check on moto: offload, restore, oversize rejects, references."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import pytest

from delayq.exceptions import PayloadMissingError, PayloadStoreError
from delayq.payloads import PayloadStore, parse_ref, payload_key
from delayq.records import DelayRequest, Reason, Rejection
from delayq.retry import Deadline
from testkit.aws import as_s3_client
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import AwsResources, ClientProxy, client_error, delay_request

VALUE = bytes(range(256)) * 1024


def deadline() -> Deadline:
    return Deadline.after(60)


@pytest.fixture
def payloads(aws: AwsResources) -> PayloadStore:
    return PayloadStore(aws.s3, aws.settings.payload_bucket, no_sleep_backoff())


def object_body(aws: AwsResources, ref: str) -> bytes:
    bucket, key = parse_ref(ref)
    return aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


def keys(aws: AwsResources) -> list[str]:
    listing = aws.s3.list_objects_v2(Bucket=aws.settings.payload_bucket)
    return [o["Key"] for o in listing.get("Contents", [])]


# --- references --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("s3://bucket/key", ("bucket", "key")),
        ("s3://bucket/payloads/ab/1795248000000", ("bucket", "payloads/ab/1795248000000")),
    ],
)
def test_parse_ref_splits_bucket_and_key(ref: str, parts: tuple[str, str]) -> None:
    assert parse_ref(ref) == parts


@pytest.mark.parametrize(
    "ref", ["", "bucket/key", "https://bucket/key", "s3://bucket", "s3://bucket/", "s3:///key"]
)
def test_parse_ref_refuses_what_is_not_an_s3_object(ref: str) -> None:
    with pytest.raises(PayloadStoreError, match="not an s3:// reference"):
        parse_ref(ref)


def test_payload_key_is_per_record() -> None:
    key = payload_key(delay_request(delay_id="order-1", due_ms=NOW_MS))
    assert re.fullmatch(r"payloads/[0-9a-f]{32}/r[0-9a-f]{32}", key)
    # Two records reusing one id and due time never share an object.
    assert payload_key(delay_request(delay_id="order-1", src="delay-requests-1-5")) != key
    assert payload_key(delay_request(delay_id="order-1", due_ms=NOW_MS + 1)) == key
    assert (
        payload_key(delay_request(delay_id="order-2", due_ms=NOW_MS)).split("/")[1]
        != (key.split("/")[1])
    )


def test_a_copy_has_a_key_of_its_own_and_owns_its_original_object(payloads: PayloadStore) -> None:
    original = replace(OWN, payload_ref=f"s3://{payloads.bucket}/{payload_key(OWN)}")
    copy = replace(original, due_ms=OWN.due_ms + 60_000, moved_ts_ms=NOW_MS, moved_src="t-0-9")
    assert payload_key(copy) != payload_key(original)
    assert payloads.owns(copy)


def test_payload_key_of_an_awkward_id_is_a_plain_object_key() -> None:
    key = payload_key(delay_request(delay_id="../a b/ключ", due_ms=NOW_MS))
    assert re.fullmatch(r"payloads/[0-9a-f]{32}/r[0-9a-f]{32}", key)


def test_an_object_written_before_versions_is_still_its_message_own(
    payloads: PayloadStore,
) -> None:
    legacy = payload_key(OWN).rsplit("/", 1)[0] + f"/{OWN.due_ms}"
    assert payloads.owns(replace(OWN, payload_ref=f"s3://{payloads.bucket}/{legacy}"))


# --- offload and restore -----------------------------------------------------------------------


def test_offload_moves_the_value_to_s3_and_leaves_a_pointer(
    payloads: PayloadStore, aws: AwsResources
) -> None:
    request = delay_request(value=VALUE)
    offloaded = payloads.offload(request, deadline())
    assert offloaded.value is None
    assert offloaded.payload_ref == f"s3://{aws.settings.payload_bucket}/{payload_key(request)}"
    assert object_body(aws, offloaded.payload_ref) == VALUE


def test_offload_keeps_everything_but_the_value(payloads: PayloadStore) -> None:
    request = delay_request(value=VALUE, key=b"\x00k", headers=(("h", None),))
    offloaded = payloads.offload(request, deadline())
    assert (offloaded.delay_id, offloaded.key, offloaded.headers, offloaded.due_ms) == (
        request.delay_id,
        request.key,
        request.headers,
        request.due_ms,
    )


def test_restore_brings_back_the_original_value_and_keeps_the_pointer(
    payloads: PayloadStore,
) -> None:
    offloaded = payloads.offload(delay_request(value=VALUE), deadline())
    restored = payloads.restore(offloaded, deadline())
    assert (restored.value, restored.payload_ref) == (VALUE, offloaded.payload_ref)


def test_restore_passes_a_request_without_pointer_through(payloads: PayloadStore) -> None:
    request = delay_request(value=b"inline")
    assert payloads.restore(request, deadline()) is request


def test_restore_of_a_missing_object_says_it_is_missing(payloads: PayloadStore) -> None:
    # No retry can bring it back: the emitter dead-letters the message at once.
    with pytest.raises(PayloadMissingError, match="does not exist"):
        payloads.restore(pointing_at_its_own_key(payloads), deadline())


def test_restore_that_cannot_reach_s3_is_a_payload_error_not_missing(aws: AwsResources) -> None:
    def get_object(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403)

    store = PayloadStore(
        as_s3_client(ClientProxy(aws.s3, get_object=get_object)),
        aws.settings.payload_bucket,
        no_sleep_backoff(),
    )
    with pytest.raises(PayloadStoreError) as caught:
        store.restore(pointing_at_its_own_key(store), deadline())
    assert not isinstance(caught.value, PayloadMissingError)


def test_offload_records_the_size_of_the_value_it_moved(payloads: PayloadStore) -> None:
    # What a bundle and the emitter's fetch budget count: the value, not the pointer.
    assert payloads.offload(delay_request(value=VALUE), deadline()).offloaded_bytes == len(VALUE)


def test_a_payload_is_never_deleted_by_restoring_it(
    payloads: PayloadStore, aws: AwsResources
) -> None:
    # Every copy of a message (duplicates, retries, dead letters) must find its value:
    # removal is the bucket lifecycle's, after the template's retention.
    offloaded = payloads.offload(delay_request(value=VALUE), deadline())
    payloads.restore(offloaded, deadline())
    assert payloads.restore(offloaded, deadline()).value == VALUE
    assert len(keys(aws)) == 1


def test_restore_of_a_bad_reference_is_a_payload_error(payloads: PayloadStore) -> None:
    with pytest.raises(PayloadStoreError, match="not this message's payload"):
        payloads.restore(delay_request(value=None, payload_ref="/tmp/x"), deadline())


def test_offload_to_a_missing_bucket_is_a_payload_error(aws: AwsResources) -> None:
    store = PayloadStore(aws.s3, "no-such-bucket", no_sleep_backoff())
    with pytest.raises(PayloadStoreError, match="put payload"):
        store.offload(delay_request(value=VALUE), deadline())


def test_a_throttled_offload_is_retried(aws: AwsResources) -> None:
    def put_object(**kwargs: Any) -> Any:
        if len(proxy.calls) == 1:
            raise client_error("SlowDown", status=503)
        return aws.s3.put_object(**kwargs)

    proxy = ClientProxy(aws.s3, put_object=put_object)
    store = PayloadStore(as_s3_client(proxy), aws.settings.payload_bucket, no_sleep_backoff())
    offloaded = store.offload(delay_request(value=VALUE), deadline())
    assert offloaded.payload_ref is not None
    assert object_body(aws, offloaded.payload_ref) == VALUE
    assert len(proxy.calls) == 2


# --- a pointer must be the message's own ------------------------------------------------------
# A body forged onto the delay queue (or an item written into the store) must not make the
# emitter read any other object.

OWN = delay_request(delay_id="order-1", value=None)
OTHER_BUCKET = "someone-elses-bucket"
FORGED: dict[str, tuple[str | None, str]] = {  # (bucket, key); None: the store's own bucket
    "foreign-bucket": (OTHER_BUCKET, payload_key(OWN)),
    "foreign-key": (None, "rejected/t/0/1-0123456789abcdef.json"),
    "another-id": (None, payload_key(replace(OWN, delay_id="order-2"))),
    "another-record": (None, payload_key(replace(OWN, src="delay-requests-1-99"))),
    "another-due": (None, payload_key(OWN).rsplit("/", 1)[0] + f"/{OWN.due_ms + 1}"),
    "own-key-and-more": (None, payload_key(OWN) + "/x"),
}


@dataclass(frozen=True)
class Forged:
    """``order-1`` pointing at an existing object that is not its payload."""

    request: DelayRequest
    bucket: str
    key: str


@pytest.fixture(params=sorted(FORGED))
def forged(request: pytest.FixtureRequest, aws: AwsResources) -> Forged:
    bucket, key = FORGED[request.param]
    bucket = bucket or aws.settings.payload_bucket
    if bucket == OTHER_BUCKET:
        aws.s3.create_bucket(Bucket=bucket)
    aws.s3.put_object(Bucket=bucket, Key=key, Body=b"theirs")
    return Forged(replace(OWN, payload_ref=f"s3://{bucket}/{key}"), bucket, key)


def test_restore_refuses_a_pointer_that_is_not_the_message_own(
    payloads: PayloadStore, forged: Forged
) -> None:
    with pytest.raises(PayloadStoreError, match="is not this message's payload"):
        payloads.restore(forged.request, deadline())


def test_a_foreign_pointer_is_refused_before_any_s3_call(aws: AwsResources, forged: Forged) -> None:
    def refuse(**_: Any) -> Any:
        raise AssertionError("no S3 call expected")

    proxy = ClientProxy(aws.s3, get_object=refuse)
    store = PayloadStore(as_s3_client(proxy), aws.settings.payload_bucket, no_sleep_backoff())
    with pytest.raises(PayloadStoreError):
        store.restore(forged.request, deadline())
    assert proxy.calls == []


def pointing_at_its_own_key(payloads: PayloadStore) -> DelayRequest:
    """A request whose pointer is its own payload key in this store (no object put)."""
    return replace(OWN, payload_ref=f"s3://{payloads.bucket}/{payload_key(OWN)}")


# --- oversize rejects --------------------------------------------------------------------------


def test_put_rejected_keeps_the_original_bytes_under_its_coordinates(
    payloads: PayloadStore, aws: AwsResources
) -> None:
    original = b'{"topic":"t","partition":2,"offset":9}'
    rejection = Rejection(Reason.PAYLOAD_TOO_LARGE, "too big", {}, "t", 2, 9)
    ref = payloads.put_rejected(rejection, original, deadline())
    bucket, key = parse_ref(ref)
    assert bucket == aws.settings.payload_bucket
    assert re.fullmatch(r"rejected/t/2/9-[0-9a-f]{16}\.json", key)
    stored = aws.s3.get_object(Bucket=bucket, Key=key)
    assert (stored["Body"].read(), stored["ContentType"]) == (original, "application/json")


def test_put_rejected_without_coordinates_still_keeps_the_record(
    payloads: PayloadStore, aws: AwsResources
) -> None:
    rejection = Rejection(Reason.MALFORMED_RECORD, "x", "junk", None, None, None)
    ref = payloads.put_rejected(rejection, b'"junk"', deadline())
    assert object_body(aws, ref) == b'"junk"'


def test_two_different_records_at_one_offset_are_both_kept(
    payloads: PayloadStore, aws: AwsResources
) -> None:
    rejection = Rejection(Reason.MALFORMED_RECORD, "x", {}, "t", 0, 1)
    first = payloads.put_rejected(rejection, b"[1]", deadline())
    second = payloads.put_rejected(rejection, b"[2]", deadline())
    assert first != second
    assert (object_body(aws, first), object_body(aws, second)) == (b"[1]", b"[2]")


def test_a_rescheduled_copy_restores_the_payload_of_its_original_due(
    payloads: PayloadStore,
) -> None:
    offloaded = payloads.offload(delay_request(value=VALUE), deadline())
    copy = replace(
        offloaded, due_ms=offloaded.due_ms + 3600_000, moved_ts_ms=1, moved_src="delay-requests-0-9"
    )
    assert payloads.restore(copy, deadline()).value == VALUE


@pytest.mark.parametrize("name", ["another-id", "foreign-key", "own-key-and-more"])
def test_a_rescheduled_copy_still_refuses_what_is_not_its_id_payload(
    payloads: PayloadStore, name: str
) -> None:
    _, key = FORGED[name]
    copy = replace(
        OWN,
        payload_ref=f"s3://{payloads.bucket}/{key}",
        moved_ts_ms=1,
        moved_src="delay-requests-0-9",
    )
    assert not payloads.owns(copy)
