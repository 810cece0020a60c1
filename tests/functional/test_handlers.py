"""The five handlers as Lambda invokes them, driven by the shared events/ files, on moto."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from delayq import constants as c
from delayq.envelope import Envelope
from delayq.payloads import parse_ref, payload_key
from delayq.retry import Deadline
from delayq.store import MessageStore
from testkit.clock import NOW_MS, FakeClock
from testkit.kafka import FakeProducer
from testkit.lambda_context import LambdaContext
from tests.factories import AwsResources, load_event, load_handler

SAMPLE_PAYLOAD_BUCKET = "delayq-payloadbucket-1x2y3z4w5v6u"  # events/delay_queue_batch.json


@pytest.fixture
def env(aws: AwsResources, monkeypatch: pytest.MonkeyPatch) -> AwsResources:
    s = aws.settings
    for var, value in {
        c.ENV_TABLE_NAME: s.table_name,
        c.ENV_DELAY_QUEUE_URL: s.delay_queue_url,
        c.ENV_TICK_QUEUE_URL: s.tick_queue_url,
        c.ENV_REJECT_QUEUE_URL: s.reject_queue_url,
        c.ENV_DELAY_DLQ_URL: s.delay_dlq_url,
        c.ENV_PAYLOAD_BUCKET: s.payload_bucket,
        c.ENV_ALLOWED_TARGETS: ",".join(s.allowed_targets),
        c.ENV_SHARDS: str(s.shards),
        c.ENV_KAFKA_BOOTSTRAP: "localhost:9092",
    }.items():
        monkeypatch.setenv(var, value)
    return aws


def handler(name: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_handler(name)
    monkeypatch.setattr(module, "clock", clock)
    return module


def test_ingest_handles_the_msk_sample_batch(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = handler("ingest", clock, monkeypatch)
    summary = app.handler(load_event("msk_batch.json"), lambda_context)
    rejects = env.bodies(env.settings.reject_queue_url)
    assert summary["rejected"] == len(rejects) > 0
    assert {r["reason"] for r in rejects} >= {
        "missing-target",
        "target-not-allowed",
        "delay-too-long",
    }
    assert summary["cancelled"] == 1
    assert summary["queued"] + summary["stored"] + summary["rejected"] + summary[
        "cancelled"
    ] == sum(len(v) for v in load_event("msk_batch.json")["records"].values())


def test_ingest_handles_the_self_managed_sample_batch(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = handler("ingest", clock, monkeypatch)
    summary = app.handler(load_event("self_managed_kafka_batch.json"), lambda_context)
    assert summary["queued"] + summary["stored"] > 0


def test_ingest_fails_loudly_on_an_event_that_is_not_kafka(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = handler("ingest", clock, monkeypatch)
    with pytest.raises(Exception, match="not a Kafka event"):
        app.handler(load_event("schedule.json"), lambda_context)


def test_timer_sends_one_tick_however_often_it_fires(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = handler("timer", clock, monkeypatch)
    first = app.handler(load_event("schedule.json"), lambda_context)
    second = app.handler(load_event("schedule.json"), lambda_context)
    assert first == second
    assert len(env.receive_all(env.settings.tick_queue_url)) == 1


def test_scheduler_runs_on_the_sample_tick_and_sets_the_watermark(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ingest created the watermark when it stored the first message; a tick moves it.
    MessageStore(
        env.dynamodb,
        env.settings.table_name,
        shards=env.settings.shards,
        ttl_grace_seconds=env.settings.ttl_grace_seconds,
        max_delay_seconds=env.settings.max_delay_seconds,
    ).create_watermark(NOW_MS // 1000 - 1, NOW_MS, Deadline.after(10))
    app = handler("scheduler", clock, monkeypatch)
    assert app.handler(load_event("tick.json"), lambda_context) == {"batchItemFailures": []}
    item = env.dynamodb.get_item(
        TableName=env.settings.table_name,
        Key={"pk": {"S": c.WATERMARK_PK}, "sk": {"S": c.WATERMARK_SK}},
    )["Item"]
    assert int(item["second"]["N"]) == NOW_MS // 1000 + env.settings.lookahead_seconds


def test_emitter_delivers_the_sample_batch_and_re_delays_the_early_message(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = FakeProducer(clock=clock)
    monkeypatch.setattr("delayq.runtime.make_producer", lambda *_: producer)
    monkeypatch.setattr("time.sleep", clock.sleep)
    # The sample's offloaded value is in the deployed stack's bucket: make it the emitter's own.
    monkeypatch.setenv(c.ENV_PAYLOAD_BUCKET, SAMPLE_PAYLOAD_BUCKET)
    env.s3.create_bucket(Bucket=SAMPLE_PAYLOAD_BUCKET)
    event = load_event("delay_queue_batch.json")
    for record in event["Records"]:
        request = Envelope.decode(record["body"]).request
        if request.payload_ref:
            bucket, key = parse_ref(request.payload_ref)
            assert (bucket, key) == (SAMPLE_PAYLOAD_BUCKET, payload_key(request))
            env.s3.put_object(Bucket=bucket, Key=key, Body=b"offloaded")
    app = handler("emitter", clock, monkeypatch)
    response = app.handler(event, lambda_context)
    bodies = {r["messageId"]: json.loads(r["body"]) for r in event["Records"]}
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    too_early = {m for m, b in bodies.items() if b["due_ms"] - NOW_MS > env.settings.max_hold_ms}
    assert failed == too_early
    delivered = {o.header("delay-id").decode() for o in producer.produced}  # type: ignore[union-attr]
    assert delivered == {b["id"] for m, b in bodies.items() if m not in too_early}
    for out, at in zip(producer.produced, producer.produced_at, strict=True):
        assert at >= int(out.header("delay-due-ms"))  # type: ignore[arg-type]


def test_cleanup_redrives_a_ttl_removal_and_ignores_a_user_delete(
    env: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = handler("cleanup", clock, monkeypatch)
    event = load_event("stream_ttl_batch.json")
    response = app.handler(event, lambda_context)
    assert response["batchItemFailures"] == []
    queued = env.bodies(env.settings.delay_queue_url)
    ttl_removed = [r for r in event["Records"] if r.get("userIdentity")]
    assert [q["id"] for q in queued] == [r["dynamodb"]["OldImage"]["sk"]["S"] for r in ttl_removed]
