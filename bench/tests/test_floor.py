"""The CPU floors of bench.cpu do the same amount of work as the handlers they are compared
with: same messages, same requests serialised, same records produced (no timing asserted)."""

from __future__ import annotations

import json
import zlib

import pytest

from bench import cpu, floor, ingest_ratio
from bench.harness import InMemoryPipeline
from bench.reference_mix import delay_request
from bench.results import _floor_rows
from bench.tests.test_run import fake_count
from delayq import constants as c
from delayq.envelope import Envelope, encode_bundle
from testkit.clock import NOW_MS
from testkit.kafka import FakeProducer, ProducedRecord

EMITTER_BATCH_SIZE = 10
TINY = cpu.CpuSettings(
    ingest_batches=2,
    ingest_batch_size=50,
    scheduler_seconds=1,
    scheduler_per_second=20,
    emitter_batches=2,
    emitter_batch_size=EMITTER_BATCH_SIZE,
    repeats=1,
)


def test_ingest_floor_decodes_every_record_and_serialises_what_the_handler_sent() -> None:
    events = cpu.ingest_events(TINY)
    pipeline = InMemoryPipeline.create()
    handled = 0
    for event in events:
        result = pipeline.ingest(event)
        handled += result.queued + result.stored
    calls = pipeline.counter.calls
    sent = calls[("dynamodb", "BatchWriteItem")] + calls[("sqs", "SendMessageBatch")]
    pipeline.close()

    captured = cpu.IngestInputs.build(TINY)
    assert handled == TINY.ingest_batches * TINY.ingest_batch_size
    assert floor.ingest_floor(captured.events, captured.requests, captured.deflate) == handled
    assert captured.writes == sent > 0
    assert {r.operation for r in captured.requests} >= floor.INGEST_WRITES
    # What the floor deflates is every value the handler stored deflated, and deflating it
    # again at the store's level gives the stored bytes.
    stored = [
        put["PutRequest"]["Item"]
        for r in captured.requests
        if r.operation == "batch_write_item"
        for puts in r.params["RequestItems"].values()
        for put in puts
    ]
    packed = [i[c.ATTR_VALUE_Z]["B"] for i in stored if c.ATTR_VALUE_Z in i]
    assert len(packed) == len(stored) > 0
    assert [zlib.compress(b, c.STORE_ZLIB_LEVEL) for b in captured.deflate] == packed


def test_ingest_on_replaying_clients_sends_what_the_fakes_were_sent() -> None:
    captured = cpu.IngestInputs.build(TINY)
    prepare, description = cpu.prepare_ingest(TINY, captured)
    run = prepare()
    replayed: list[floor.CapturedRequest] = []
    assert run.pipeline is not None
    # The replaying methods, recorded once more: same calls, same answers, nothing stored.
    floor.capture_calls(run.pipeline.dynamodb, floor.INGEST_CALLS["dynamodb"], replayed)
    floor.capture_calls(run.pipeline.sqs, floor.INGEST_CALLS["sqs"], replayed)
    assert run.call() == TINY.ingest_batches * TINY.ingest_batch_size
    run.close()  # every captured call was made
    assert description["clients"] == "serialise and replay"
    assert sorted(r.operation for r in replayed) == sorted(r.operation for r in captured.requests)
    writes = [r for r in replayed if r.operation in floor.INGEST_WRITES]
    assert [r.response for r in writes] == [
        r.response for r in captured.requests if r.operation in floor.INGEST_WRITES
    ]
    assert run.pipeline.counter.calls[("dynamodb", "BatchWriteItem")] == 0


def test_a_replaying_client_serialises_answers_in_order_and_checks_every_call_was_made() -> None:
    class Client:
        pass

    client = Client()
    refused = RuntimeError("ConditionalCheckFailed")
    captured = [
        floor.CapturedRequest("get_item", {}, {}),
        floor.CapturedRequest("get_item", {}, {"Item": {"n": {"N": "1"}}}),
        floor.CapturedRequest("update_item", {}, error=refused),
        floor.CapturedRequest("update_item", {}, {}),
    ]
    replaying = floor.Replaying()
    floor.replay_calls(client, ["get_item", "update_item", "query"], captured, replaying)
    assert client.get_item(Key={"b": {"B": b"\x00"}}) == {}  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="cannot serialise"):
        client.update_item(Key={"x": object()})  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="ConditionalCheckFailed"):
        client.update_item()  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match=r"not made by the run: \{'get_item': 1, "):
        replaying.check_done()
    assert client.get_item() == {"Item": {"n": {"N": "1"}}}  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="more often"):
        client.get_item()  # type: ignore[attr-defined]
    assert client.update_item() == {}  # type: ignore[attr-defined]
    replaying.check_done()
    with pytest.raises(AssertionError, match="not called"):
        client.query()  # type: ignore[attr-defined]


def test_a_capture_that_retried_a_write_is_not_a_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    answered: dict[str, object] = {"UnprocessedItems": {"t": [{"PutRequest": {"Item": {}}}]}}
    retried = [
        floor.CapturedRequest("batch_write_item", {}, answered),
        floor.CapturedRequest("send_message_batch", {}, {"Failed": [{"Id": "0"}]}),
        floor.CapturedRequest("update_item", {}, error=RuntimeError("throttled")),
        floor.CapturedRequest("batch_write_item", {}, {"UnprocessedItems": {}}),
    ]
    assert [r.split(":")[0] for r in floor.retried_calls(retried)] == [
        "batch_write_item",
        "send_message_batch",
        "update_item",
    ]
    monkeypatch.setattr(cpu, "ingest_requests", lambda _events: retried)
    with pytest.raises(AssertionError, match="retried calls"):
        cpu.IngestInputs.build(TINY)


def test_the_ingest_floor_deflates_each_blob_once_at_the_stores_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured = cpu.IngestInputs.build(TINY)
    calls: list[tuple[int, int]] = []
    compress = zlib.compress

    def counting(data: bytes, level: int = -1) -> bytes:
        calls.append((len(data), level))
        return compress(data, level)

    monkeypatch.setattr(zlib, "compress", counting)
    floor.ingest_floor(captured.events, captured.requests, captured.deflate)
    assert calls == [(len(b), c.STORE_ZLIB_LEVEL) for b in captured.deflate]
    calls.clear()
    floor.ingest_floor(captured.events, captured.requests)
    assert calls == []


def test_ingest_floor_serialises_blobs_and_signed_header_bytes() -> None:
    event = {
        "records": {
            "t-0": [{"key": None, "value": "AAE=", "headers": [{"h": [-1, 0, 127]}, {"n": None}]}]
        }
    }
    request = floor.CapturedRequest("batch_write_item", {"Item": {"v": {"B": b"\x00\xff"}}})
    assert floor.ingest_floor([event], [request]) == 1
    assert floor._header_bytes([-1, 0, 127]) == b"\xff\x00\x7f"
    assert json.loads(json.dumps(request.params, default=floor._blob)) == {
        "Item": {"v": {"B": "AP8="}}
    }


def test_emitter_floor_produces_the_records_the_handler_produces() -> None:
    events = cpu.emitter_inputs(TINY)
    pipeline = InMemoryPipeline.create(keep_records=True)
    services = pipeline.emitter_services()
    delivered = sum(len(pipeline.emit(e, services).deliveries) for e in events)
    pipeline.close()

    producer = FakeProducer(keep=True)
    acknowledged: list[object] = []
    produced = floor.emitter_floor(
        events, producer, lambda: NOW_MS, lambda err, msg: acknowledged.append(msg)
    )
    assert produced == delivered == TINY.emitter_batches * EMITTER_BATCH_SIZE
    assert len(producer.produced) == len(pipeline.producer.produced) == produced
    assert producer.produced == pipeline.producer.produced  # same topic, key, value, headers
    assert len(acknowledged) == produced


def test_emitter_floor_reads_bundles() -> None:
    requests = [delay_request(i, NOW_MS) for i in range(3)]
    body = encode_bundle([Envelope(r).encode() for r in requests])
    event = {"Records": [{"body": body, "attributes": {"ApproximateReceiveCount": "1"}}]}
    producer = FakeProducer(keep=True)
    assert floor.emitter_floor([event], producer, lambda: NOW_MS) == 3
    ids = [r.delay_id.encode() for r in requests]
    assert [r.header("delay-id") for r in producer.produced] == ids
    assert all(isinstance(r, ProducedRecord) for r in producer.produced)


def test_ratio() -> None:
    assert floor.ratio(3.0, 1.5) == 2.0
    assert floor.ratio(1.0, 0.0) is None


def test_measure_with_floor_reports_ratios_and_keys() -> None:
    pytest.importorskip("confluent_kafka")
    figures, comparison = cpu.measure_with_floor(TINY, profile="never")
    assert set(figures) == {"ingest", "scheduler", "emitter"}
    # The per-core rate is timed on the in-memory fakes, and says so.
    assert figures["ingest"].inputs["clients"] == "in-memory fakes"
    doc = comparison.as_dict()
    for key in ("ingest", "emitter", "method", "floor_messages_per_second", "goal", "met"):
        assert key in doc, key
    assert doc["goal"] == 3.0
    assert set(doc["met"]) == {"ingest", "emitter"}
    assert doc["ingest"] > 0
    assert doc["emitter"] > 0
    assert set(doc["floor_messages_per_second"]) == {"ingest", "emitter"}
    runs = doc["messages_per_run"]
    assert runs["ingest"] == runs["ingest_floor"] == figures["ingest"].messages_per_run
    assert runs["emitter"] == runs["emitter_floor"] == figures["emitter"].messages_per_run
    assert doc["produce_calls_per_run"] == runs["emitter"]
    assert doc["requests_serialised_per_run"] > 0
    assert doc["ingest_vs_floor_without_deflate"] > doc["ingest"]
    assert doc["ingest_in_memory_store"] > 0
    floor_rows = _floor_rows(doc)
    assert [r[0] for r in floor_rows] == [
        "ingest CPU vs its floor (machine-independent)",
        "emitter CPU vs its floor (machine-independent)",
        "ingest CPU vs its floor without deflating",
    ]
    assert [r[2] for r in floor_rows] == ["<= 3x floor", "<= 3x floor", ""]


def test_python_m_bench_ingest_ratio_prints_ingest_against_its_floor(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bench.instructions.count", fake_count)
    monkeypatch.setattr("bench.instructions.callgrind", lambda: "valgrind")
    monkeypatch.setattr("bench.instructions._version", lambda _valgrind: "valgrind (fake)")
    ingest_ratio.main(["--repeats", "2", "--batches", "1", "--instructions"])
    out = json.loads(capsys.readouterr().out)
    assert out["messages_per_run"] == cpu.CpuSettings().ingest_batch_size
    assert len(out["handler_cpu_seconds_per_run"]) == len(out["floor_cpu_seconds_per_run"]) == 2
    assert out["requests_serialised_per_run"] > 0
    assert out["ingest"] > 1  # the handler does more than its floor
    # ... and more above the floor without deflating than above the whole floor
    assert out["ingest_vs_floor_without_deflate"] > out["ingest"]
    assert out["ingest_in_memory_store"] > 1
    assert out["instructions"]["ingest"] == 3.0  # 600 vs 200 instructions a message
    assert out["instructions"]["ingest_vs_floor_without_deflate"] == 3.0
    assert out["instructions"]["per_message"]["ingest"] == {
        "handler": 600,
        "floor": 200,
        "floor_without_deflate": 200,
    }
