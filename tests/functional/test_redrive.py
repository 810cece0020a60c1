"""Redrive: dead letters back into the pipeline after a fix, paced, with a dry run, and never
deleted from their source before their destination accepted them."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from delayq.emitter import delay_queue_rejection
from delayq.envelope import Envelope, decode_body, encode_bundle
from delayq.exceptions import ConfigurationError
from delayq.ingest import IngestServices
from delayq.queues import DelayQueue, RejectQueue, SqsQueue
from delayq.records import DelayRequest, Reason
from delayq.retry import Backoff, Deadline
from delayq.store import MessageStore, message_item
from delayq_local.redrive import (
    RedriveReport,
    RedriveServices,
    RedriveSource,
    redrive,
    redrive_services,
)
from testkit.aws import as_dynamodb_client, as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from tests.factories import TARGETS, ClientProxy, SentEntry, client_error, delay_request
from tests.functional.conftest import Pipeline

DLQ = RedriveSource.DELAY_DLQ
REJECTS = RedriveSource.REJECTS


def services(p: Pipeline, **overrides: Any) -> RedriveServices:
    ingest = IngestServices(p.store, p.delay_queue, p.rejects, p.payloads)
    return RedriveServices(
        sqs=overrides.pop("sqs", p.sqs),
        s3=p.aws.s3,
        ingest=overrides.pop("ingest", ingest),
        backoff=no_sleep_backoff(),
    )


def run(p: Pipeline, source: RedriveSource, **options: Any) -> RedriveReport:
    """A redrive on the pipeline's clock (the rate limit sleeps on it)."""
    svc = options.pop("services", None) or services(p)
    if source is DLQ:
        options.setdefault("source_url", dlq(p))
    options.setdefault("wait_seconds", 0)
    return redrive(
        source, settings=p.settings, services=svc, clock=p.clock, sleep=p.clock.sleep, **options
    )


def dlq(p: Pipeline) -> str:
    url: str = p.aws.extra["delay_dlq"]
    return url


def dead_letter(p: Pipeline, *requests: DelayRequest) -> None:
    for r in requests:
        p.aws.sqs.send_message(QueueUrl=dlq(p), MessageBody=Envelope(r).encode())


def counts(p: Pipeline, url: str) -> tuple[int, int]:
    """(visible, hidden) messages of a queue."""
    attrs = p.aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def requeued(p: Pipeline) -> list[DelayRequest]:
    """Every delay message sent to the delay queue, single or in a bundle."""
    return [e.request for x in p.delayed() for e in decode_body(x.body) if e.request]


def allow_payments(p: Pipeline) -> None:
    """The fix: the allow-list gains the payments topics."""
    p.settings = p.settings.with_overrides(allowed_targets=(*TARGETS, "payments.*"))


# --- the delay queue's dead-letter queue ------------------------------------------------------


def test_dead_letters_go_back_to_the_delay_queue_delayed_until_due(p: Pipeline) -> None:
    past = delay_request(delay_id="past", due_ms=NOW_MS - 60_000)
    soon = delay_request(delay_id="soon", due_ms=NOW_MS + 30_500)
    later = delay_request(delay_id="later", due_ms=NOW_MS + 7_200_000)
    dead_letter(p, past, soon, later)

    report = run(p, DLQ)

    assert (report.moved, report.failed, report.errors) == (3, 0, [])
    assert counts(p, dlq(p)) == (0, 0)
    assert sorted(requeued(p), key=lambda r: r.due_ms) == [past, soon, later]
    # Whole seconds, rounded down, minus the emitter's lead; at most SQS's 900 s.
    assert sorted(e.delay_seconds for e in p.delayed()) == [0, 29, 900]


def test_a_dead_lettered_bundle_goes_back_whole_and_a_dry_run_counts_its_messages(
    p: Pipeline,
) -> None:
    due = [delay_request(delay_id=f"b-{i}", due_ms=NOW_MS - 1_000) for i in range(3)]
    later = delay_request(delay_id="later", due_ms=NOW_MS + 60_000)
    body = encode_bundle([Envelope(r).encode() for r in [*due, later]])
    p.aws.sqs.send_message(QueueUrl=dlq(p), MessageBody=body)

    assert (run(p, DLQ, dry_run=True).moved, p.sqs.sent) == (4, [])
    report = run(p, DLQ)

    assert (report.moved, report.failed, counts(p, dlq(p))) == (4, 0, (0, 0))
    # Bundled again by DelaySeconds: the due ones together, the later one on its own.
    assert sorted((e.delay_seconds, len(decode_body(e.body))) for e in p.delayed()) == [
        (0, 3),
        (58, 1),
    ]
    assert sorted(requeued(p), key=lambda r: r.delay_id) == sorted(
        [*due, later], key=lambda r: r.delay_id
    )


def test_a_bundle_with_an_entry_that_is_not_ours_stays_whole(p: Pipeline) -> None:
    good = Envelope(delay_request(delay_id="good")).encode()
    body = encode_bundle([good, '{"v":1,"id":"forged"}'])
    p.aws.sqs.send_message(QueueUrl=dlq(p), MessageBody=body)

    report = run(p, DLQ)

    assert (report.moved, report.failed) == (0, 2)
    assert "bundle entry 1" in report.errors[0]
    assert [m["Body"] for m in p.aws.receive_all(dlq(p))] == [body]


def test_redriven_dead_letters_are_delivered_with_their_original_bytes(p: Pipeline) -> None:
    lost = delay_request(delay_id="lost", due_ms=NOW_MS - 5_000, key=b"\x00k", value=b"\xffv")
    dead_letter(p, lost)
    run(p, DLQ)
    p.deliver_released()
    [out] = p.producer.produced
    assert (out.topic, out.key, out.value, out.headers[0]) == (
        "orders.timeout",
        b"\x00k",
        b"\xffv",
        ("trace", b"t-1"),
    )
    assert out.header("delay-id") == b"lost"


def test_a_dry_run_reports_what_would_move_and_changes_nothing(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(3)))
    p.aws.sqs.send_message(QueueUrl=dlq(p), MessageBody="not an envelope")

    report = run(p, DLQ, dry_run=True)

    assert (report.dry_run, report.moved, report.failed) == (True, 3, 1)
    assert p.sqs.sent == []
    assert counts(p, dlq(p)) == (4, 0)  # all visible again at once


def test_a_body_that_is_not_an_envelope_stays_in_the_dead_letter_queue(p: Pipeline) -> None:
    dead_letter(p, delay_request(delay_id="good"))
    p.aws.sqs.send_message(QueueUrl=dlq(p), MessageBody='{"v": 2}')

    report = run(p, DLQ)

    assert (report.moved, report.failed) == (1, 1)
    assert "not a delay-queue bundle" in report.errors[0]
    [left] = p.aws.receive_all(dlq(p))
    assert left["Body"] == '{"v": 2}'


def test_nothing_leaves_the_dead_letter_queue_when_the_delay_queue_refuses(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(3)))

    def refuse(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403, operation="SendMessageBatch")

    refusing = SqsQueue(
        as_sqs_client(ClientProxy(p.aws.sqs, send_message_batch=refuse)),
        p.settings.delay_queue_url,
        no_sleep_backoff(),
    )
    ingest = IngestServices(
        p.store, DelayQueue(refusing, p.settings.emit_lead_ms), p.rejects, p.payloads
    )
    report = run(p, DLQ, services=services(p, ingest=ingest))

    assert (report.moved, report.failed) == (0, 3)
    assert all("AccessDenied" in e for e in report.errors)
    assert counts(p, dlq(p)) == (3, 0)


def test_the_source_is_deleted_only_after_the_destination_accepted(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(3)))
    calls: list[tuple[str, str]] = []

    def logged(name: str) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            calls.append((name, kwargs["QueueUrl"]))
            return getattr(p.aws.sqs, name)(**kwargs)

        return call

    sqs = ClientProxy(
        p.aws.sqs,
        send_message_batch=logged("send_message_batch"),
        delete_message_batch=logged("delete_message_batch"),
    )
    delay_queue = DelayQueue(
        SqsQueue(as_sqs_client(sqs), p.settings.delay_queue_url, no_sleep_backoff()),
        p.settings.emit_lead_ms,
    )
    ingest = IngestServices(p.store, delay_queue, p.rejects, p.payloads)
    run(p, DLQ, services=services(p, sqs=sqs, ingest=ingest))

    assert calls == [
        ("send_message_batch", p.settings.delay_queue_url),
        ("delete_message_batch", dlq(p)),
    ]


def test_a_crash_between_send_and_delete_duplicates_and_never_loses(p: Pipeline) -> None:
    dead_letter(p, delay_request(delay_id="d-1"))

    def crash(**_: Any) -> Any:
        raise RuntimeError("the redrive process died")

    with pytest.raises(RuntimeError):
        run(p, DLQ, services=services(p, sqs=ClientProxy(p.sqs, delete_message_batch=crash)))
    assert counts(p, dlq(p)) == (1, 0)  # still there, and visible again
    assert [r.delay_id for r in requeued(p)] == ["d-1"]

    run(p, DLQ)  # the next run moves it again: a duplicate with the same delay-id
    assert [r.delay_id for r in requeued(p)] == ["d-1", "d-1"]
    assert counts(p, dlq(p)) == (0, 0)


def test_a_message_that_cannot_be_deleted_is_reported_and_stays(p: Pipeline) -> None:
    dead_letter(p, delay_request(delay_id="d-1"))

    def invalid_handle(**kwargs: Any) -> Any:
        entry = kwargs["Entries"][0]
        failed = {"Id": entry["Id"], "SenderFault": True, "Code": "ReceiptHandleIsInvalid"}
        return {"Successful": [], "Failed": [failed]}

    sqs = ClientProxy(p.sqs, delete_message_batch=invalid_handle)
    report = run(p, DLQ, services=services(p, sqs=sqs))

    assert report.moved == 1  # the delay queue has it
    assert "ReceiptHandleIsInvalid" in report.errors[0]
    assert sum(counts(p, dlq(p))) == 1  # and so does the source: a later run duplicates it


@pytest.mark.parametrize("failure", ["throttled-entry", "access-denied"])
def test_deletes_are_retried_when_sqs_says_so_and_reported_when_not(
    p: Pipeline, failure: str
) -> None:
    dead_letter(p, delay_request(delay_id="d-1"))
    attempts: list[int] = []

    def flaky(**kwargs: Any) -> Any:
        attempts.append(1)
        if failure == "access-denied":
            raise client_error("AccessDenied", status=403, operation="DeleteMessageBatch")
        if len(attempts) == 1:
            ids = [e["Id"] for e in kwargs["Entries"]]
            return {
                "Failed": [{"Id": i, "SenderFault": False, "Code": "InternalError"} for i in ids]
            }
        return p.aws.sqs.delete_message_batch(**kwargs)

    report = run(p, DLQ, services=services(p, sqs=ClientProxy(p.sqs, delete_message_batch=flaky)))

    assert report.moved == 1
    if failure == "throttled-entry":
        assert (len(attempts), report.errors, sum(counts(p, dlq(p)))) == (2, [], 0)
    else:
        assert (len(attempts), sum(counts(p, dlq(p)))) == (1, 1)
        assert "AccessDenied" in report.errors[0]


def test_services_built_from_settings_redrive_the_dead_letter_queue(p: Pipeline) -> None:
    dead_letter(p, delay_request(delay_id="d-1"))
    report = redrive(
        DLQ,
        settings=p.settings,
        services=redrive_services(p.settings),
        source_url=dlq(p),
        wait_seconds=0,
    )
    assert report.moved == 1
    assert [m["Body"] for m in p.aws.receive_all(p.settings.delay_queue_url)] == [
        Envelope(delay_request(delay_id="d-1")).encode()
    ]


def test_a_limit_stops_the_run_after_that_many_messages(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(25)))
    report = run(p, DLQ, limit=12)
    assert report.moved == 12
    assert len(requeued(p)) == 12
    assert counts(p, dlq(p)) == (13, 0)


def test_the_rate_limit_paces_the_moves_in_bursts_of_one_second(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(30)))
    report = run(p, DLQ, rate_per_second=5)
    assert report.moved == 30
    # Each second's five moves (one due time) travel as one bundle.
    sent = [(e.sent_ms - NOW_MS, len(decode_body(e.body))) for e in p.delayed()]
    assert sent == [(1000 * k, 5) for k in range(6)]
    assert report.waited_seconds >= 5.0


def test_a_rate_below_one_per_second_moves_one_at_a_time(p: Pipeline) -> None:
    dead_letter(p, *(delay_request(delay_id=f"d-{i}") for i in range(3)))
    run(p, DLQ, rate_per_second=0.5)
    assert [e.sent_ms - NOW_MS for e in p.delayed()] == [0, 2000, 4000]


def test_the_options_are_checked_before_anything_is_read(p: Pipeline) -> None:
    with pytest.raises(ConfigurationError, match="needs source_url"):
        run(p, DLQ, source_url="")
    with pytest.raises(ConfigurationError, match="rate_per_second must be > 0"):
        run(p, DLQ, rate_per_second=0)
    with pytest.raises(ConfigurationError, match="limit must be >= 0"):
        run(p, REJECTS, limit=-1)
    with pytest.raises(ConfigurationError, match=r"hold_seconds must be 1\.\.43200"):
        run(p, REJECTS, hold_seconds=0)
    with pytest.raises(ConfigurationError, match=r"wait_seconds must be 0\.\.20"):
        run(p, REJECTS, wait_seconds=21)
    with pytest.raises(ConfigurationError, match="unknown redrive source 'tick-dlq'"):
        redrive("tick-dlq", settings=p.settings, services=services(p))
    assert p.sqs.sent == []


# --- the reject queue ----------------------------------------------------------------------


def reject_some(p: Pipeline) -> dict[str, dict[str, Any]]:
    """Ingest a batch where two records target a topic not allowed yet and one has no target."""
    records = {
        "soon": kafka_record(offset=1, target="payments.capture", seconds="5"),
        "later": kafka_record(offset=2, target="payments.refund", seconds="7200"),
        "broken": kafka_record(offset=3, seconds="5"),
        "fine": kafka_record(offset=4, target="reminders", seconds="5"),
    }
    result = p.ingest(kafka_event(*records.values()))
    assert len(result.rejected) == 3
    return records


def stored_ids(p: Pipeline) -> list[str]:
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    return [i["sk"]["S"] for i in items if i["kind"]["S"] == "msg"]


def test_rejects_are_ingested_again_after_the_allow_list_is_fixed(p: Pipeline) -> None:
    records = reject_some(p)
    allow_payments(p)
    p.clock.advance(60_000)

    report = run(p, REJECTS)

    assert (report.moved, report.still_rejected, report.failed) == (2, 1, 0)
    assert report.reasons == {"missing-target": 1}
    json.dumps(report.as_dict())  # printable by the command line
    # The relative delay still counts from the broker timestamp: due already, queued now.
    soon = next(r for r in requeued(p) if r.delay_id == "delay-requests-0-1")
    assert (soon.target, soon.due_ms) == ("payments.capture", NOW_MS + 5_000)
    assert stored_ids(p) == ["delay-requests-0-2"]
    [left] = p.aws.bodies(p.settings.reject_queue_url)
    assert (left["reason"], left["record"]) == ("missing-target", records["broken"])


def test_a_reject_dry_run_classifies_under_the_new_settings_and_writes_nothing(
    p: Pipeline,
) -> None:
    reject_some(p)
    allow_payments(p)
    sent_before = len(p.sqs.sent)

    report = run(p, REJECTS, dry_run=True)

    assert (report.moved, report.still_rejected, report.failed) == (2, 1, 0)
    assert report.reasons == {"missing-target": 1}
    assert len(p.sqs.sent) == sent_before
    assert stored_ids(p) == []
    assert counts(p, p.settings.reject_queue_url) == (3, 0)


def test_an_oversize_reject_is_read_back_from_s3_and_delivered_whole(p: Pipeline) -> None:
    big = bytes(range(256)) * 1200  # 300 KiB: the reject body carries a record_ref
    p.ingest(kafka_event(kafka_record(target="payments.capture", seconds="0", value=big)))
    assert (
        p.aws.sqs.get_queue_attributes(
            QueueUrl=p.settings.reject_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "1"
    )
    allow_payments(p)

    report = run(p, REJECTS)

    assert report.moved == 1
    p.deliver_released()
    [out] = p.producer.produced
    assert (out.topic, out.value) == ("payments.capture", big)


def test_emitter_rejects_go_back_to_the_delay_queue_once_their_target_is_allowed(
    p: Pipeline,
) -> None:
    request = delay_request(delay_id="pay-1", target="payments.capture", due_ms=NOW_MS)
    still_off = delay_request(delay_id="hr-1", target="hr.salaries", due_ms=NOW_MS)
    entries = [
        SentEntry(p.settings.delay_queue_url, body, 0, NOW_MS)
        for body in (Envelope(request).encode(), "{garbage", Envelope(still_off).encode())
    ]
    assert p.emit(entries).rejected == 3
    allow_payments(p)

    report = run(p, REJECTS)

    assert (report.moved, report.still_rejected) == (1, 2)
    assert report.reasons == {"bad-envelope": 1, "target-not-allowed": 1}
    assert requeued(p) == [request]
    left = {b["record"]["body"]: b["reason"] for b in p.aws.bodies(p.settings.reject_queue_url)}
    assert left == {"{garbage": "bad-envelope", Envelope(still_off).encode(): "target-not-allowed"}


def test_an_emitter_reject_is_rejected_again_first_for_an_entry_that_is_not_ours(
    p: Pipeline,
) -> None:
    off = Envelope(delay_request(delay_id="hr-1", target="hr.salaries", due_ms=NOW_MS)).encode()
    body = encode_bundle([off, '{"v":1}'])
    reject = delay_queue_rejection(Reason.TARGET_NOT_ALLOWED, "the first time", "m-1", body)
    p.rejects.send([reject], NOW_MS, Deadline.after(10))

    report = run(p, REJECTS)

    assert (report.moved, report.still_rejected) == (0, 1)
    assert report.reasons == {"bad-envelope": 1}
    [left] = p.aws.bodies(p.settings.reject_queue_url)
    assert left["record"] == {"sqs_message_id": "m-1", "body": body}
    assert left["detail"].startswith("bundle entry 1: ")


def test_an_emitter_reject_stays_when_the_reject_queue_refuses_it_again(p: Pipeline) -> None:
    p.emit([SentEntry(p.settings.delay_queue_url, "{garbage", 0, NOW_MS)])

    def refuse(**_: Any) -> Any:
        raise client_error("KMS.AccessDeniedException", operation="SendMessageBatch")

    sqs = ClientProxy(p.aws.sqs, send_message_batch=refuse)
    refusing = RejectQueue(
        SqsQueue(as_sqs_client(sqs), p.settings.reject_queue_url, no_sleep_backoff()), p.payloads
    )
    ingest = IngestServices(p.store, p.delay_queue, refusing, p.payloads)
    report = run(p, REJECTS, services=services(p, ingest=ingest))

    assert (report.still_rejected, report.failed) == (0, 1)
    assert counts(p, p.settings.reject_queue_url) == (1, 0)


def test_a_reject_dry_run_screens_emitter_rejects_too(p: Pipeline) -> None:
    request = delay_request(delay_id="pay-1", target="payments.capture", due_ms=NOW_MS)
    p.emit([SentEntry(p.settings.delay_queue_url, Envelope(request).encode(), 0, NOW_MS)])
    report = run(p, REJECTS, dry_run=True)
    assert (report.moved, report.still_rejected, report.reasons) == (
        0,
        1,
        {"target-not-allowed": 1},
    )
    allow_payments(p)
    assert run(p, REJECTS, dry_run=True).moved == 1
    assert p.delayed() == []


def test_rejects_stay_when_ingest_cannot_keep_them(p: Pipeline) -> None:
    reject_some(p)
    allow_payments(p)

    class AlwaysUnprocessed:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def batch_write_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803
            return {"UnprocessedItems": RequestItems}

    store = MessageStore(
        as_dynamodb_client(AlwaysUnprocessed(p.aws.dynamodb)),
        p.settings.table_name,
        shards=p.settings.shards,
        ttl_grace_seconds=p.settings.ttl_grace_seconds,
        max_delay_seconds=p.settings.max_delay_seconds,
        backoff=no_sleep_backoff(),
    )
    ingest = IngestServices(store, p.delay_queue, p.rejects, p.payloads)
    report = run(p, REJECTS, services=services(p, ingest=ingest))

    assert (report.moved, report.still_rejected, report.failed) == (0, 0, 3)
    assert counts(p, p.settings.reject_queue_url) == (3, 0)


def test_a_run_ends_when_everything_is_still_rejected(p: Pipeline) -> None:
    originals = [kafka_record(offset=i, seconds="5") for i in range(12)]  # no target
    p.ingest(kafka_event(*originals))

    report = run(p, REJECTS)

    assert (report.moved, report.still_rejected) == (0, 12)
    assert report.skipped <= 12  # our own re-rejects, read back and left alone
    left = p.aws.bodies(p.settings.reject_queue_url)
    assert sorted(b["record"]["offset"] for b in left) == list(range(12))


def test_reject_bodies_that_cannot_be_read_stay_where_they_are(p: Pipeline) -> None:
    url = p.settings.reject_queue_url
    missing = f"s3://{p.settings.payload_bucket}/rejected/gone.json"
    for body in (
        "not json",
        '{"reason": "x"}',
        json.dumps({"record": None, "record_ref": missing}),
        json.dumps({"record": None, "record_ref": 5}),
    ):
        p.aws.sqs.send_message(QueueUrl=url, MessageBody=body)

    report = run(p, REJECTS)

    assert (report.moved, report.still_rejected, report.failed) == (0, 0, 4)
    assert counts(p, url) == (4, 0)


# --- the cleanup function's failed stream batches ------------------------------------------------


def failed_batch(p: Pipeline, *requests: DelayRequest, user_delete: bool = False) -> str:
    """A failed stream batch as Lambda writes it to an S3 on-failure destination: the
    invocation's metadata and the batch itself (old images, binaries as base64)."""
    records: list[dict[str, Any]] = []
    for r in requests:
        item = message_item(r, p.settings.shards, 86400)
        image = {
            k: {"B": base64.b64encode(v["B"]).decode()} if "B" in v else v for k, v in item.items()
        }
        records.append(
            {
                "eventName": "REMOVE",
                "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
                "dynamodb": {"OldImage": image},
            }
        )
    if user_delete:  # not a TTL removal: nothing to deliver
        records.append({"eventName": "REMOVE", "dynamodb": {"OldImage": {"kind": {"S": "msg"}}}})
    body = {
        "version": "1.0",
        "requestContext": {"condition": "RetryAttemptsExhausted"},
        "DDBStreamBatchInfo": {"batchSize": len(records)},
        "payload": {"Records": records},
    }
    key = f"aws/lambda/esm-1/shard-1/2026/11/23/2026-11-23T10.00.00-{len(requests)}-{user_delete}"
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=key, Body=json.dumps(body))
    return key


def failed_keys(p: Pipeline) -> list[str]:
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="aws/lambda/")
    return [o["Key"] for o in listed.get("Contents", [])]


CLEANUP_FAILURES = RedriveSource.CLEANUP_FAILURES


def test_failed_stream_batches_go_to_the_delay_queue_whole(p: Pipeline) -> None:
    due = NOW_MS - 3_600_000
    a = delay_request(delay_id="a", due_ms=due, value=b"\x00a")
    b = delay_request(delay_id="b", due_ms=due, value=b"b")
    failed_batch(p, a, b, user_delete=True)
    report = run(p, CLEANUP_FAILURES)
    assert (report.moved, report.failed) == (2, 0)
    assert sorted((r.delay_id, r.value) for r in requeued(p)) == [("a", b"\x00a"), ("b", b"b")]
    assert failed_keys(p) == []  # deleted once its messages were queued


def test_a_dry_run_of_failed_batches_counts_and_keeps_everything(p: Pipeline) -> None:
    key = failed_batch(p, delay_request(delay_id="a"))
    report = run(p, CLEANUP_FAILURES, dry_run=True)
    assert (report.moved, report.dry_run) == (1, True)
    assert p.delayed() == []
    assert failed_keys(p) == [key]


def test_a_failed_batch_that_cannot_be_queued_stays_in_the_bucket(p: Pipeline) -> None:
    key = failed_batch(p, delay_request(delay_id="a"))

    def refuse(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403)

    refusing = DelayQueue(
        SqsQueue(as_sqs_client(ClientProxy(p.aws.sqs, send_message_batch=refuse)), "q"), 0
    )
    ingest = IngestServices(p.store, refusing, p.rejects, p.payloads)
    report = run(p, CLEANUP_FAILURES, services=services(p, ingest=ingest))
    assert (report.moved, report.failed) == (0, 1)
    assert failed_keys(p) == [key]


def test_an_object_that_is_not_a_failed_batch_is_reported_and_kept(p: Pipeline) -> None:
    key = "aws/lambda/esm-1/shard-1/2026/11/23/not-ours"
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=key, Body=b"{}")
    report = run(p, CLEANUP_FAILURES)
    assert (report.moved, report.failed) == (0, 1)
    assert "no payload.Records" in report.errors[0]
    assert failed_keys(p) == [key]


def test_the_limit_counts_failed_batches(p: Pipeline) -> None:
    failed_batch(p, delay_request(delay_id="a"))
    failed_batch(p, delay_request(delay_id="b"), delay_request(delay_id="c"))
    report = run(p, CLEANUP_FAILURES, limit=1)
    assert report.moved == 1
    assert len(failed_keys(p)) == 1


def test_a_redrive_gives_up_on_a_batch_before_its_hold_ends(p: Pipeline) -> None:
    # A send throttled without end: its retries stop one call's longest time before the hold
    # ends, so no delete runs with a receipt handle another reader may have replaced (that
    # message would stay and be moved again by a later run). It stays, not moved, for later.
    attempts_ms: list[int] = []

    def throttled(**_: Any) -> Any:
        attempts_ms.append(p.clock())
        raise client_error("ThrottlingException", status=400, operation="SendMessageBatch")

    backoff = Backoff(max_attempts=200, sleep=p.clock.sleep, rng=random.Random(7))
    delay_queue = DelayQueue(
        SqsQueue(
            as_sqs_client(ClientProxy(p.sqs, send_message_batch=throttled)),
            p.settings.delay_queue_url,
            backoff,
        ),
        p.settings.emit_lead_ms,
    )
    ingest = IngestServices(p.store, delay_queue, p.rejects, p.payloads)
    dead_letter(p, delay_request(delay_id="slow"))
    started_ms = p.clock()

    report = run(p, DLQ, services=services(p, ingest=ingest), hold_seconds=30)

    call_ms = int(
        (p.settings.aws_connect_timeout_seconds + p.settings.aws_read_timeout_seconds) * 1000
    )
    assert attempts_ms
    assert max(attempts_ms) <= started_ms + 30_000 - call_ms
    assert (report.moved, report.failed) == (0, 1)
    assert counts(p, dlq(p)) == (1, 0)  # released, to be moved by a later run
