"""The simulator's world and its AWS models, each knob against AWS's documented behaviour."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from confluent_kafka import KafkaError

from delayq import constants as c
from delayq.payloads import PayloadStore
from delayq.queues import RejectQueue, SqsQueue
from delayq.records import Reason, Rejection
from delayq.retry import Backoff, Deadline
from sim.aws import (
    DAY_MS,
    FOLLOWERS,
    ExpiryRule,
    LifecycleS3,
    ReplicatedDynamoDB,
    SimProducer,
    TargetCluster,
    Ttl,
    lifecycle_expiry_ms,
)
from sim.faults import DriftingClock, Faulty, Knobs, RetryLedger
from sim.functions import Functions
from sim.iam import parameter, roles
from sim.pipeline import Pipeline, sim_settings
from sim.sources import kafka as kafka_source
from sim.sources.stream import StreamSource
from sim.workload import Shape, generate
from sim.world import Crash, Invocation, World
from testkit.aws import FakeSqs, RequestCounter, as_s3_client, as_sqs_client
from testkit.clock import NOW_MS
from testkit.events import kafka_record

CALM = Knobs.calm()
TABLE = "t"


def item(pk: str, sk: str, **extra: Any) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}, **extra}


def world(seed: int = 1) -> World:
    return World(seed, NOW_MS)


# --- the world ---------------------------------------------------------------------------


def test_invocations_interleave_at_each_pause_in_time_order() -> None:
    w = world()
    steps: list[tuple[str, int]] = []

    def body(name: str, pauses: list[int]) -> Any:
        def run(_: Invocation) -> None:
            for ms in pauses:
                w.pause(ms)
                steps.append((name, w.now_ms - NOW_MS))

        return run

    w.at(NOW_MS, lambda: w.invoke("a", 60, body("a", [10, 10])))
    w.at(NOW_MS + 5, lambda: w.invoke("b", 60, body("b", [10])))
    w.run_until(NOW_MS + 1000)
    assert steps == [("a", 10), ("b", 15), ("a", 20)]


def test_a_crash_is_not_an_exception_the_layer_could_catch() -> None:
    assert not issubclass(Crash, Exception)


def test_an_invocation_past_its_timeout_dies_at_its_next_step() -> None:
    w = world()
    outcome: list[str] = []

    def run(_: Invocation) -> None:
        try:
            w.sleep(2.5)
            outcome.append("survived")
        except Crash:
            outcome.append("killed")

    w.at(NOW_MS, lambda: w.invoke("f", 2, run))
    w.run_until(NOW_MS + 10_000)
    assert outcome == ["killed"]
    assert w.faults["lambda-timeout"] == 1


def test_stop_ends_every_waiting_invocation() -> None:
    w = world()
    ended: list[str] = []

    def run(_: Invocation) -> None:
        try:
            w.sleep(100)
        except Crash as e:
            ended.append(str(e))

    w.at(NOW_MS, lambda: w.invoke("f", 600, run))
    w.run_until(NOW_MS + 1000)
    w.stop()
    assert ended == ["the simulation ended"]


@pytest.mark.parametrize(("low", "high"), [(2, 40), (0, 0), (7, 7), (0, 10_000), (-5, 3)])
def test_a_prepared_draw_is_randint_draw_for_draw(low: int, high: int) -> None:
    # Every simulated call draws its latency this way: the seed's history depends on it.
    prepared, plain = world(9), world(9)
    draw = prepared.draw_between(low, high)
    mixed = [draw() if n % 3 else prepared.rng.random() for n in range(2000)]
    expected = [plain.rng.randint(low, high) if n % 3 else plain.rng.random() for n in range(2000)]
    assert mixed == expected
    assert prepared.rng.getstate() == plain.rng.getstate()


def test_a_prepared_draw_of_an_empty_range_fails_as_randint_does() -> None:
    draw = world().draw_between(5, 2)
    with pytest.raises(ValueError, match="empty range"):
        draw()


# --- every call: latency, throttling, network errors, lost responses, crashes --------------


def sqs(w: World, knobs: Knobs) -> tuple[FakeSqs, Any, str]:
    inner = FakeSqs(RequestCounter(), w.clock)
    url = inner.create_queue(QueueName="q")["QueueUrl"]
    return inner, Faulty(inner, w, knobs, "sqs"), url


def test_a_network_error_means_the_request_never_reached_aws() -> None:
    w = world()
    inner, client, url = sqs(w, replace(CALM, network_error=1.0))
    with pytest.raises(EndpointConnectionError):
        client.send_message(QueueUrl=url, MessageBody="x")
    assert inner.depth(url) == 0


def test_a_lost_response_means_the_write_happened() -> None:
    w = world()
    inner, client, url = sqs(w, replace(CALM, response_lost=1.0))
    with pytest.raises(ReadTimeoutError):
        client.send_message(QueueUrl=url, MessageBody="x")
    assert inner.depth(url) == 1


def test_throttling_is_the_services_error_code() -> None:
    w = world()
    _, client, url = sqs(w, replace(CALM, throttle=1.0))
    with pytest.raises(ClientError) as raised:
        client.send_message(QueueUrl=url, MessageBody="x")
    assert raised.value.response["Error"]["Code"] == "RequestThrottled"


def one_call(knobs: Knobs) -> tuple[RetryLedger, list[BaseException]]:
    """One invocation making one SendMessage call and never calling again."""
    w = world()
    inner = FakeSqs(RequestCounter(), w.clock)
    url = inner.create_queue(QueueName="q")["QueueUrl"]
    ledger = RetryLedger()
    client = Faulty(inner, w, knobs, "sqs", ledger=ledger)
    errors: list[BaseException] = []

    def body(invocation: Invocation) -> None:
        try:
            client.send_message(QueueUrl=url, MessageBody="x")
        except (ClientError, EndpointConnectionError, ReadTimeoutError) as e:
            errors.append(e)
        ledger.ended(invocation, killed=False)

    w.invoke("emitter", 30, body)
    w.run_until(NOW_MS + 60_000)
    return ledger, errors


@pytest.mark.parametrize(
    "knobs",
    [
        replace(CALM, network_error=1.0),
        replace(CALM, throttle=1.0),
        replace(CALM, response_lost=1.0),
    ],
    ids=["network-error", "throttle", "response-lost"],
)
def test_a_transient_error_never_called_again_is_unretried(knobs: Knobs) -> None:
    ledger, errors = one_call(knobs)
    assert len(errors) == 1
    [found] = ledger.found
    assert (found.function, found.call) == ("emitter", "sqs.send_message")
    assert found.error == type(errors[0]).__name__


def test_calling_again_is_the_retry() -> None:
    ledger = RetryLedger()
    invocation = Invocation("emitter", NOW_MS, 30_000, 1)
    ledger.failed(invocation, "sqs.send_message", NOW_MS, EndpointConnectionError(endpoint_url="x"))
    ledger.called(invocation, "sqs.send_message")
    ledger.ended(invocation, killed=False)
    assert ledger.found == []


def test_a_call_that_failed_as_often_as_the_layer_tries_may_be_given_up() -> None:
    # The layer retries a call up to Backoff.max_attempts times, then fails the invocation
    # (its event source retries): not a missing retry.
    error = ReadTimeoutError(endpoint_url="x")
    for failures, flagged in ((RetryLedger().attempts, False), (3, True)):
        ledger = RetryLedger()
        invocation = Invocation("scheduler", NOW_MS, 60_000, 1)
        for n in range(failures):
            ledger.called(invocation, "dynamodb.update_item")
            ledger.failed(invocation, "dynamodb.update_item", NOW_MS + n, error)
        ledger.ended(invocation, killed=False)
        assert bool(ledger.found) is flagged
    # A success in between starts the count again.
    ledger = RetryLedger()
    invocation = Invocation("scheduler", NOW_MS, 60_000, 2)
    for n in range(ledger.attempts):
        ledger.called(invocation, "dynamodb.update_item")
        if n == 4:
            ledger.succeeded(invocation, "dynamodb.update_item")
        else:
            ledger.failed(invocation, "dynamodb.update_item", NOW_MS + n, error)
    ledger.ended(invocation, killed=False)
    assert len(ledger.found) == 1


def test_no_retry_is_owed_when_killed_or_out_of_time() -> None:
    error = EndpointConnectionError(endpoint_url="x")
    ledger = RetryLedger()
    killed = Invocation("emitter", NOW_MS, 30_000, 1)
    ledger.failed(killed, "sqs.send_message", NOW_MS, error)
    ledger.ended(killed, killed=True)
    late = Invocation("emitter", NOW_MS, 30_000, 2)
    ledger.failed(late, "sqs.send_message", NOW_MS + 30_000 - ledger.slack_ms, error)
    ledger.ended(late, killed=False)
    # Failed because the layer's own deadline for the call (a reschedule's cutoff) was up.
    cut_short = Invocation("ingest", NOW_MS, 60_000, 3)
    ledger.failed(cut_short, "dynamodb.update_item", NOW_MS, error)
    ledger.ended(cut_short, killed=False, out_of_time=True)
    assert ledger.found == []


def test_a_refusal_is_not_a_transient_error() -> None:
    w = world()
    inner = FakeSqs(RequestCounter(), w.clock)
    ledger = RetryLedger()
    client = Faulty(inner, w, CALM, "sqs", ledger=ledger)

    def body(invocation: Invocation) -> None:
        with pytest.raises(ClientError):
            client.send_message(QueueUrl="https://sqs.invalid/1/missing", MessageBody="x")
        ledger.ended(invocation, killed=False)

    w.invoke("emitter", 30, body)
    w.run_until(NOW_MS + 60_000)
    assert ledger.found == []


def test_each_call_costs_a_latency_from_the_knobs() -> None:
    w = world()
    _, client, url = sqs(w, replace(CALM, latency_ms=(7, 7)))
    client.send_message(QueueUrl=url, MessageBody="x")
    assert w.now_ms == NOW_MS + 7


@pytest.mark.parametrize("knob", ["crash_before_call", "crash_after_call"])
def test_a_crash_kills_the_invocation_before_or_after_the_call_took_effect(knob: str) -> None:
    w = world()
    crash = (
        replace(CALM, crash_before_call=1.0)
        if knob == "crash_before_call"
        else replace(CALM, crash_after_call=1.0)
    )
    inner, client, url = sqs(w, crash)
    died: list[bool] = []

    def run(_: Invocation) -> None:
        try:
            client.send_message(QueueUrl=url, MessageBody="x")
        except Crash:
            died.append(True)

    w.at(NOW_MS, lambda: w.invoke("f", 60, run))
    w.run_until(NOW_MS + 1000)
    assert died == [True]
    assert inner.depth(url) == (1 if knob == "crash_after_call" else 0)


def test_sqs_batch_failed_entries_are_not_sent_and_the_others_are() -> None:
    w = world()
    inner, client, url = sqs(w, replace(CALM, partial_batch=1.0))
    entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    answer = client.send_message_batch(QueueUrl=url, Entries=entries)
    failed = {f["Id"] for f in answer["Failed"]}
    assert 0 < len(failed) < 10
    assert all(not f["SenderFault"] for f in answer["Failed"])
    assert sorted(m.body for m in inner.messages(url)) == sorted(
        f"m{i}" for i in range(10) if str(i) not in failed
    )


def dynamodb(w: World, knobs: Knobs) -> tuple[ReplicatedDynamoDB, Any]:
    table = ReplicatedDynamoDB(w, knobs, RequestCounter())
    table.create_table(TABLE)
    return table, Faulty(table, w, knobs, "dynamodb")


def test_unprocessed_items_are_not_written_and_are_handed_back() -> None:
    w = world(3)
    table, client = dynamodb(w, replace(CALM, partial_batch=1.0))
    puts = [{"PutRequest": {"Item": item("p", f"s{i}")}} for i in range(20)]
    answer = client.batch_write_item(RequestItems={TABLE: puts})
    left = answer["UnprocessedItems"][TABLE]
    assert 0 < len(left) < 20
    written = {i["sk"]["S"] for i in table.items(TABLE)}
    assert written.isdisjoint({r["PutRequest"]["Item"]["sk"]["S"] for r in left})
    assert len(written) + len(left) == 20


def test_a_late_write_times_out_for_its_caller_and_lands_later_under_its_condition() -> None:
    # AWS: "a request must reach AWS within five minutes of the time stamp in the request";
    # the caller stops waiting at its read timeout, not when the write takes effect.
    w = world(7)
    knobs = replace(CALM, late_effect=1.0, late_effect_ms=(60_000, 60_000))  # a minute late
    table, client = dynamodb(w, knobs)
    conditional = {
        "TableName": TABLE,
        "Key": {"pk": {"S": "p"}, "sk": {"S": "s"}},
        "UpdateExpression": "SET v = :v",
        "ConditionExpression": "attribute_not_exists(v)",
        "ExpressionAttributeValues": {":v": {"N": "1"}},
    }
    outcome: list[BaseException] = []

    def body(_: Invocation) -> None:
        try:
            client.update_item(**conditional)
        except ReadTimeoutError as e:
            outcome.append(e)

    w.invoke("ingest", 60, body)
    w.run_until(NOW_MS + 6_000)
    assert len(outcome) == 1  # after the read timeout
    assert table.items(TABLE) == []
    w.run_until(NOW_MS + 61_000)
    assert table.items(TABLE) == [{"pk": {"S": "p"}, "sk": {"S": "s"}, "v": {"N": "1"}}]
    # A second one's condition is judged when it lands: it fails then, and changes nothing.
    w.invoke("ingest", 60, body)
    w.run_until(NOW_MS + 130_000)
    assert len(outcome) == 2
    assert any("landed late and failed" in line for line in w.history)
    # Reads and batch writes are never late; nor is anything without the knob.
    assert dynamodb(world(7), CALM)[1].update_item(**conditional) == {}


def test_unprocessed_keys_are_handed_back() -> None:
    w = world(5)
    table, client = dynamodb(w, replace(CALM, partial_batch=1.0))
    for i in range(5):
        table.put_item(TableName=TABLE, Item=item("p", f"s{i}"))
    keys = [{"pk": {"S": "p"}, "sk": {"S": f"s{i}"}} for i in range(5)]
    answer = client.batch_get_item(RequestItems={TABLE: {"Keys": keys, "ConsistentRead": True}})
    got = answer["Responses"].get(TABLE, [])
    assert len(got) + len(answer["UnprocessedKeys"][TABLE]["Keys"]) == 5
    assert answer["UnprocessedKeys"][TABLE]["Keys"]


# --- DynamoDB: eventual consistency, TTL, the stream -------------------------------------


def test_eventually_consistent_reads_see_writes_late_and_in_order() -> None:
    w = world()
    table = ReplicatedDynamoDB(w, replace(CALM, stale_read_ms=5_000), RequestCounter())
    table.create_table(TABLE)
    key = {"pk": {"S": "p"}, "sk": {"S": "s"}}
    table.put_item(TableName=TABLE, Item=item("p", "s", n={"N": "1"}))
    table.put_item(TableName=TABLE, Item=item("p", "s", n={"N": "2"}))
    assert table.get_item(TableName=TABLE, Key=key, ConsistentRead=True)["Item"]["n"] == {"N": "2"}
    seen = {
        table.get_item(TableName=TABLE, Key=key).get("Item", {}).get("n", {}).get("N")
        for _ in range(50)
    }
    assert None in seen  # a follower has not applied the writes yet
    w.run_until(NOW_MS + 5_000)
    for _ in range(20):
        assert table.get_item(TableName=TABLE, Key=key)["Item"]["n"] == {"N": "2"}


def test_eventually_consistent_reads_may_see_a_newer_state_then_an_older_one() -> None:
    # AWS: "the responses may not reflect the results of a recently completed write operation" (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/HowItWorks.ReadConsistency.html)
    w = world(4)
    table = ReplicatedDynamoDB(w, replace(CALM, stale_read_ms=5_000), RequestCounter())
    table.create_table(TABLE)
    key = {"pk": {"S": "p"}, "sk": {"S": "s"}}
    table.put_item(TableName=TABLE, Item=item("p", "s", n={"N": "1"}))
    w.run_until(NOW_MS + 5_000)
    table.put_item(TableName=TABLE, Item=item("p", "s", n={"N": "2"}))
    seen = [table.get_item(TableName=TABLE, Key=key)["Item"]["n"]["N"] for _ in range(100)]
    # Each read draws its copy: the leader's new state, then a follower's old one.
    assert ("2", "1") in set(itertools.pairwise(seen))


def test_a_partition_key_past_its_write_units_in_a_second_is_throttled() -> None:
    w = world()
    table = ReplicatedDynamoDB(w, replace(CALM, partition_wcu=2), RequestCounter())
    table.create_table(TABLE)
    table.put_item(TableName=TABLE, Item=item("hot", "1"))
    table.put_item(TableName=TABLE, Item=item("hot", "2"))
    with pytest.raises(ClientError) as raised:
        table.put_item(TableName=TABLE, Item=item("hot", "3"))
    assert raised.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    table.put_item(TableName=TABLE, Item=item("cold", "1"))  # other keys have their own budget
    w.now_ms += 1000
    table.put_item(TableName=TABLE, Item=item("hot", "3"))  # a new second, a new budget
    keys = [i["sk"]["S"] for i in table.items(TABLE) if i["pk"]["S"] == "hot"]
    assert sorted(keys) == ["1", "2", "3"]
    assert w.faults["dynamodb-hot-partition"] == 1


def test_a_partition_key_past_its_read_units_in_a_second_is_throttled() -> None:
    w = world()
    table = ReplicatedDynamoDB(w, replace(CALM, partition_rcu=1), RequestCounter())
    table.create_table(TABLE)
    table.put_item(TableName=TABLE, Item=item("hot", "1"))
    query = {
        "TableName": TABLE,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": "hot"}},
        "ConsistentRead": True,
    }
    assert len(table.query(**query)["Items"]) == 1  # one strongly consistent unit
    with pytest.raises(ClientError):
        table.query(**query)
    w.now_ms += 1000
    assert len(table.query(**query)["Items"]) == 1


def ttl_table(w: World, knobs: Knobs) -> tuple[ReplicatedDynamoDB, Ttl]:
    table = ReplicatedDynamoDB(w, knobs, RequestCounter())
    table.create_table(TABLE)
    ttl = Ttl(w, knobs, table, TABLE)
    return table, ttl


def expiring(sk: str, expires_s: int) -> dict[str, Any]:
    return item("p", sk, kind={"S": c.KIND_MESSAGE}, **{c.ATTR_TTL: {"N": str(expires_s)}})


def test_ttl_deletes_within_two_days_and_expired_items_stay_readable_until_then() -> None:
    # AWS: "DynamoDB typically deletes expired items within two days of expiration" (https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_UpdateTimeToLive.html)
    assert Knobs().ttl_lag_s == 48 * 3600
    w = world()
    table, ttl = ttl_table(w, CALM)
    expires_s = NOW_MS // 1000 + 60
    for n in range(50):
        table.put_item(TableName=TABLE, Item=expiring(f"s{n}", expires_s))
    ttl.start()
    w.run_until(expires_s * 1000 + 1)
    assert len(table.items(TABLE)) == 50  # expired, not deleted yet
    w.run_until(expires_s * 1000 + 3_600_000)
    assert 10 < len(table.items(TABLE)) < 40  # about half deleted within the hour
    w.run_until(expires_s * 1000 + 24 * 3_600_000)
    assert 0 < len(table.items(TABLE)) < 25  # the others spread over the two days
    w.run_until(expires_s * 1000 + 48 * 3_600_000)
    assert table.items(TABLE) == []
    assert len(ttl.stream) == 50
    record = ttl.stream[0]
    assert record.raw["eventName"] == "REMOVE"
    assert record.raw["userIdentity"] == {"type": "Service", "principalId": c.TTL_PRINCIPAL}
    assert record.raw["dynamodb"]["OldImage"]["kind"] == {"S": c.KIND_MESSAGE}


def test_a_long_ttl_lag_costs_one_event_per_expiry_not_a_sweep_a_minute() -> None:
    w = world()
    table, ttl = ttl_table(w, CALM)
    ttl.start()
    table.put_item(TableName=TABLE, Item=expiring("s", NOW_MS // 1000 + 60))
    # The world's queue: the write reaching each follower, and the one planned deletion.
    assert len(w._heap) == FOLLOWERS + 1
    w.run_until(NOW_MS + 72 * 3_600_000)
    assert table.items(TABLE) == []


def test_an_item_given_a_later_expiry_is_deleted_only_after_it() -> None:
    w = world(2)
    table, ttl = ttl_table(w, replace(CALM, ttl_lag_s=0, ttl_prompt_lag_s=0))
    ttl.start()
    table.put_item(TableName=TABLE, Item=expiring("s", NOW_MS // 1000 + 60))
    table.put_item(TableName=TABLE, Item=expiring("s", NOW_MS // 1000 + 7200))
    w.run_until(NOW_MS + 3_600_000)
    assert table.items(TABLE)  # its first expiry is no longer its own
    w.run_until(NOW_MS + 7_200_000)
    assert table.items(TABLE) == []
    assert len(ttl.stream) == 1


def test_the_simulation_uses_the_ttl_grace_the_template_deploys() -> None:
    assert sim_settings(roles()).ttl_grace_seconds == int(parameter("TtlGraceSeconds")) == 86_400


def test_stream_records_may_come_twice() -> None:
    w = world()
    knobs = replace(CALM, ttl_lag_s=0, ttl_prompt_lag_s=0, stream_duplicate=1.0)
    table = ReplicatedDynamoDB(w, knobs, RequestCounter())
    table.create_table(TABLE)
    table.put_item(TableName=TABLE, Item=item("p", "s", **{c.ATTR_TTL: {"N": "1"}}))
    ttl = Ttl(w, knobs, table, TABLE)
    ttl.sweep()
    assert [r.raw["dynamodb"]["Keys"]["sk"] for r in ttl.stream] == [{"S": "s"}] * 2


def test_stream_records_older_than_24_hours_are_trimmed_unread_while_cleanup_cannot_run() -> None:
    # AWS: "stores this information in a log for up to 24 hours" (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Streams.html)
    w = world()
    table, ttl = ttl_table(w, replace(CALM, ttl_lag_s=0, ttl_prompt_lag_s=0))
    functions = Functions(w, CALM, RetryLedger(), lambda _f: object())  # type: ignore[arg-type,return-value]
    source = StreamSource(w, ttl, functions)
    source.start()
    source.down = (NOW_MS, NOW_MS + 25 * 3_600_000)  # throttled: retried, never invoked
    table.put_item(TableName=TABLE, Item=expiring("old", NOW_MS // 1000))
    ttl.sweep()
    w.run_until(NOW_MS + 2 * 3_600_000)
    table.put_item(TableName=TABLE, Item=expiring("young", NOW_MS // 1000 + 2 * 3600))
    ttl.sweep()
    w.run_until(NOW_MS + 24 * 3_600_000)
    assert functions.invocations["cleanup"] == 0
    w.run_until(NOW_MS + 26 * 3_600_000)
    assert [r["dynamodb"]["Keys"]["sk"]["S"] for r in source.trimmed] == ["old"]
    assert w.faults["stream-trimmed"] == 1
    assert functions.invocations["cleanup"] >= 1  # the younger record is read


# --- S3: the payload bucket's lifecycle rules ---------------------------------------------


def test_lifecycle_expiry_counts_days_from_the_write_rounded_to_the_next_midnight_utc() -> None:
    # AWS: "Amazon S3 rounds the transition or expiration date of an object to midnight UTC the next day" (https://repost.aws/knowledge-center/s3-lifecycle-rule-delay)  # noqa: E501
    written = 1_577_874_600_000  # 2020-01-01 10:30 UTC
    assert lifecycle_expiry_ms(written, 3) == 1_578_182_400_000  # 2020-01-05 00:00 UTC


def test_the_payload_bucket_expires_payloads_after_the_templates_retention() -> None:
    # AWS: "Amazon S3 queues the object for removal and removes it asynchronously" (https://docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-expire-general-considerations.html)
    w = world()
    pipeline = Pipeline(w, CALM)
    bucket = pipeline.settings.payload_bucket
    rules = {r.prefix: r.days for r in pipeline.s3.rules[bucket]}
    days = rules["payloads/"]
    assert days == 38  # PayloadRetention for the default MaxDelaySeconds (7 days)
    s3 = pipeline.s3
    s3.put_object(Bucket=bucket, Key="payloads/a/v", Body=b"x")
    s3.put_object(Bucket=bucket, Key="other/b", Body=b"x")  # under no rule
    eligible = lifecycle_expiry_ms(w.now_ms, days)
    w.run_until(eligible - 1)
    assert "payloads/a/v" in s3.objects(bucket)
    w.run_until(eligible + CALM.s3_expiry_lag_s * 1000)
    assert sorted(s3.objects(bucket)) == ["other/b"]
    assert s3.expired == [(bucket, "payloads/a/v")]


def test_an_overwritten_object_expires_after_its_last_write() -> None:
    w = world(2)
    s3 = LifecycleS3(w, replace(CALM, s3_expiry_lag_s=0), RequestCounter())
    s3.create_bucket(Bucket="b")
    s3.rules["b"] = [ExpiryRule("payloads/", 1)]
    s3.put_object(Bucket="b", Key="payloads/k", Body=b"1")
    w.run_until(w.now_ms + DAY_MS)
    s3.put_object(Bucket="b", Key="payloads/k", Body=b"2")
    w.run_until(lifecycle_expiry_ms(NOW_MS, 1))
    assert s3.objects("b") == {"payloads/k": b"2"}
    w.run_until(lifecycle_expiry_ms(NOW_MS + DAY_MS, 1))
    assert s3.objects("b") == {}


# --- SQS: a standard queue's message received twice at once --------------------------------


def test_a_standard_queue_message_may_be_received_again_while_the_first_receive_holds_it() -> None:
    # AWS: "When using standard queues, visibility timeout isn't a guarantee against receiving a message twice" (https://docs.aws.amazon.com/sdk-for-java/v1/developer-guide/examples-sqs-visibility-timeout.html)  # noqa: E501
    w = world()
    pipeline = Pipeline(w, replace(CALM, sqs_concurrent_receive=1.0))
    source = pipeline.delay_queues[0]
    settled: list[Callable[[bool], None]] = []
    pipeline.functions.invoke = lambda _f, _body, done: settled.append(done)  # type: ignore[method-assign,assignment]
    pipeline.sqs.send_message(QueueUrl=source.url, MessageBody="m")
    source.poll()
    w.run_until(w.now_ms + 1)  # the next polls, while the first invocation still runs
    # Every receive left it visible (the knob at 1): each concurrent invocation has it.
    assert len(settled) == source.concurrency
    (message,) = pipeline.sqs.messages(source.url)
    assert message.receive_count == source.concurrency
    for done in settled[:-1]:  # an earlier receive's delete is answered and deletes nothing
        done(True)
        assert len(pipeline.sqs.messages(source.url)) == 1
    settled[-1](True)
    assert pipeline.sqs.messages(source.url) == []
    assert w.faults["sqs-stale-handle"] == source.concurrency - 1


# --- the target cluster ------------------------------------------------------------------


def produce(producer: SimProducer) -> list[Any]:
    reports: list[Any] = []
    producer.produce("orders.x", b"v", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush()
    return reports


def test_a_cluster_outage_fails_each_record_with_a_transport_error() -> None:
    w = world()
    cluster = TargetCluster(outages=[(NOW_MS, NOW_MS + 60_000)])
    (error,) = produce(SimProducer(w, CALM, cluster, "emitter"))
    assert error.code() == KafkaError._TRANSPORT
    assert cluster.log == []


def test_a_record_over_the_topics_size_limit_is_refused_by_the_broker() -> None:
    w = world()
    cluster = TargetCluster(max_message_bytes=0)  # one byte of value is too much
    (error,) = produce(SimProducer(w, CALM, cluster, "emitter"))
    assert error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert cluster.log == []
    assert w.faults["kafka-record-too-large"] == 1


def test_the_workload_writes_records_exactly_at_the_payload_limit() -> None:
    workload = generate(random.Random(5), NOW_MS, Shape(messages=400, at_limit=0.05))
    at_limit = [
        i
        for i in workload.intents
        if i.kind == "delay"
        and len(i.key or b"")
        + len(i.value or b"")
        + sum(len(n) + len(v) for n, v in i.headers if not n.startswith("delay-"))
        == c.DEFAULT_MAX_PAYLOAD_BYTES
    ]
    assert len(at_limit) >= 5


def test_a_burst_may_be_written_over_its_second_or_all_at_once() -> None:
    def bursts(spread: float) -> list[list[int]]:
        workload = generate(random.Random(3), NOW_MS, Shape(messages=600, burst_spread=spread))
        by_second: dict[int, list[int]] = {}
        for i in workload.intents:
            if i.kind == "delay":
                by_second.setdefault(i.send_ms // 1000, []).append(i.send_ms)
        return [sends for sends in by_second.values() if len(sends) >= Shape().burst_size]

    together, spread = bursts(0.0), bursts(1.0)
    assert together
    assert spread
    assert all(len(set(sends)) < 5 for sends in together)
    assert all(len(set(sends)) > 10 for sends in spread)


def test_a_batch_whose_offsets_were_not_committed_comes_again_from_its_first_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # AWS: "Lambda event source mappings process each event at least once, and duplicate processing of records can occur" (https://docs.aws.amazon.com/lambda/latest/dg/with-kafka.html)  # noqa: E501
    batches: list[list[int]] = []

    def ingest_batch(event: dict[str, Any], **_: Any) -> None:
        batches.append(sorted(r["offset"] for rs in event["records"].values() for r in rs))

    monkeypatch.setattr(kafka_source, "ingest_batch", ingest_batch)
    w = world()
    pipeline = Pipeline(w, replace(CALM, kafka_redeliver=1.0))
    record = kafka_record(target="reminders", seconds="60")
    for _ in range(2):
        pipeline.kafka.write(0, record)
    for after_ms in (700, 701):
        w.at(w.now_ms + after_ms, partial(pipeline.kafka.write, 0, record))
    w.run_until(w.now_ms + 60_000)
    assert batches[0] == [0, 1]
    assert [0, 1, 2, 3] in batches[1:]  # again, with the records written since
    assert w.faults["kafka-redelivered"] >= 2
    # Acknowledged once each, when first ingested.
    assert sorted(a.record["offset"] for a in pipeline.kafka.acked) == [0, 1, 2, 3]


def test_an_operators_redrive_ingests_the_reject_queue_again_and_notes_what_it_accepted() -> None:
    w = world()
    pipeline = Pipeline(w, CALM)
    s = pipeline.settings
    rejects = RejectQueue(
        SqsQueue(as_sqs_client(pipeline.sqs), s.reject_queue_url, Backoff(sleep=w.sleep)),
        PayloadStore(as_s3_client(pipeline.s3), s.payload_bucket, Backoff(sleep=w.sleep)),
    )
    due = w.now_ms + 60_000
    allowed = kafka_record(offset=7, target="reminders", deliver_at=str(due), id="r-1")
    forbidden = kafka_record(offset=8, target="payments.internal", deliver_at=str(due))
    rejects.send(
        [  # the first refused by an allow-list since widened, the second still refused
            Rejection(Reason.TARGET_NOT_ALLOWED, "old allow-list", allowed, "delay-requests", 0, 7),
            Rejection(Reason.TARGET_NOT_ALLOWED, "no", forbidden, "delay-requests", 0, 8),
        ],
        w.now_ms,
        Deadline.after(30),
    )
    w.at(w.now_ms + 1_000, pipeline.operator._run)
    w.run_until(due + 60_000)
    assert pipeline.operator.redriven == {(0, 7): pytest.approx(w.now_ms - 119_000, abs=5_000)}
    (left,) = pipeline.queue_bodies(s.reject_queue_url)
    assert json.loads(left)["source"]["offset"] == 8
    (delivered,) = pipeline.cluster.log
    assert delivered.record.header(c.HEADER_ID) == b"r-1"


def test_a_lost_delivery_report_comes_after_the_write() -> None:
    w = world()
    cluster = TargetCluster()
    (error,) = produce(SimProducer(w, replace(CALM, report_lost=1.0), cluster, "emitter"))
    assert error.code() == KafkaError._MSG_TIMED_OUT
    assert len(cluster.log) == 1


def test_produce_may_be_refused_locally() -> None:
    w = world()
    producer = SimProducer(w, replace(CALM, produce_refused=1.0), TargetCluster(), "emitter")
    with pytest.raises(BufferError):
        producer.produce("orders.x", b"v")


# --- IAM: each call against the function's role in template.yaml -------------------------


def test_a_call_the_role_does_not_grant_is_refused_as_aws_refuses_it() -> None:
    w = world()
    template_roles = roles()
    names, guard = template_roles.names, template_roles.guard
    inner = FakeSqs(RequestCounter(), w.clock)
    for name in ("DelayQueue", "TickQueue"):
        inner.create_queue(QueueName=names[name].rsplit("/", 1)[-1])
    client = Faulty(inner, w, CALM, "sqs", guard)
    outcomes: list[str] = []

    def timer(_: Invocation) -> None:
        tick = {"MessageGroupId": "t", "MessageDeduplicationId": "1", "MessageBody": "x"}
        client.send_message(QueueUrl=names["TickQueue"], **tick)
        outcomes.append("tick sent")
        try:
            client.send_message(QueueUrl=names["DelayQueue"], MessageBody="x")
        except ClientError as e:
            outcomes.append(e.response["Error"]["Code"])

    w.at(NOW_MS, lambda: w.invoke("timer", 10, timer))
    w.run_until(NOW_MS + 1000)
    assert outcomes == ["tick sent", "AccessDenied"]
    (denial,) = guard.denials
    assert denial.function == "timer"
    assert "sqs:SendMessage" in str(denial)
    assert w.faults["iam-denied"] == 1


def test_an_environments_clock_drifts_within_its_bound_and_is_stepped_back_into_it() -> None:
    w = world(3)
    knobs = replace(CALM, clock_skew_ms=400, clock_drift_ppm=1_000)
    clock = DriftingClock(w, knobs, behind_ms=60_000)
    offsets = []
    for _ in range(5 * 3600):  # five hours, a reading a second
        w.now_ms += 1000
        offsets.append(clock() - w.now_ms + 60_000)
    assert all(-400 <= o <= 400 for o in offsets)
    assert w.faults["clock-step"] >= 3  # 1,000 ppm crosses 800 ms within 15 minutes at most
    # Between steps the offset moves steadily: at most 1 ms a second at 1,000 ppm (+ rounding).
    steady = [abs(b - a) for a, b in itertools.pairwise(offsets) if abs(b - a) <= 2]
    assert len(steady) >= len(offsets) - 1 - w.faults["clock-step"]


def test_without_drift_the_offset_stays_put() -> None:
    w = world(4)
    clock = DriftingClock(w, replace(CALM, clock_skew_ms=400, clock_drift_ppm=0))
    first = clock() - w.now_ms
    w.now_ms += 3_600_000
    assert clock() - w.now_ms == first
    assert -400 <= first <= 400


# --- the stack's age: control clocks -------------------------------------------------------


def clock_floors(pipeline: Pipeline) -> list[int]:
    return sorted(
        int(i["f"]["N"])
        for i in pipeline.dynamodb.primary.items(pipeline.settings.table_name)
        if i["pk"]["S"].startswith("clock#")
    )


def test_a_stack_that_has_run_for_a_day_has_its_control_clocks() -> None:
    # Otherwise every message of a run is written within the first clocks' floor margin and
    # reads its marker: the clocks' skip would never be exercised.
    w = world()
    pipeline = Pipeline(w, replace(CALM, fresh_stack=0.0))
    floor = (w.now_ms - 86_400_000) // 1000 + 3600
    assert clock_floors(pipeline) == [floor] * pipeline.settings.shards
    follower = pipeline.dynamodb.followers[0].items(pipeline.settings.table_name)
    assert len([i for i in follower if i["pk"]["S"].startswith("clock#")]) == len(
        clock_floors(pipeline)
    )


def test_a_fresh_stack_has_no_control_clock_yet() -> None:
    assert clock_floors(Pipeline(world(), replace(CALM, fresh_stack=1.0))) == []
