"""The embedded stack: endpoints, provisioning, environment, handlers wired to their sources."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from confluent_kafka import Producer

from delayq_local import EmbeddedStack, LocalStackError, MotoServer, StackConfig, reachable
from delayq_local.aws import localstack_endpoint
from delayq_local.doubles import RecordingHandler, wait_until
from delayq_local.faults import FaultPlan
from delayq_local.sandbox import LocalFunction
from delayq_local.sources import (
    KafkaEventSource,
    ScheduleEventSource,
    SqsEventSource,
    StreamEventSource,
)
from tests.integration.support import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FUNCTIONS = (
    "IngestFunction",
    "TimerFunction",
    "SchedulerFunction",
    "EmitterFunction",
    "CleanupFunction",
)

APP = '''
"""A probe handler: records its import environment and its invocations in PROBE_FILE."""
import json
import os

def _write(entry):
    with open(os.environ["PROBE_FILE"], "a") as probe:
        probe.write(json.dumps(entry) + "\\n")

_write({"imported": __name__, "service": os.environ.get("POWERTOOLS_SERVICE_NAME")})

def handler(event, context):
    _write({"invoked": __name__, "function": context.function_name})
    return {"batchItemFailures": []}
'''


def test_the_stack_wires_every_function_to_its_source_and_sets_the_environment(
    stack_name: str,
) -> None:
    handlers = {name: RecordingHandler() for name in FUNCTIONS}
    config = StackConfig(
        template=FIXTURES / "template.yaml",
        stack_name=stack_name,
        handlers=handlers,
        schedule_period_seconds=0.5,
        ttl_sweep_seconds=0.5,
    )
    before = dict(os.environ)

    with EmbeddedStack(config) as stack:
        resources = stack.deployment.resources
        assert os.environ["AWS_ENDPOINT_URL"] == stack.aws_endpoint_url
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
        assert os.environ["DELAYQ_DELAY_QUEUE_URL"] == resources["DelayQueue"].ref
        assert os.environ["DELAYQ_TICK_QUEUE_URL"] == resources["TickQueue"].ref
        assert os.environ["DELAYQ_KAFKA_BOOTSTRAP"] == stack.kafka_bootstrap
        assert os.environ["DELAYQ_KAFKA_SECURITY"] == "PLAINTEXT"
        assert os.environ["DELAYQ_HORIZON_SECONDS"] == "60"
        assert os.environ["DELAYQ_TICK_SECONDS"] == "5"
        assert os.environ["POWERTOOLS_METRICS_DISABLED"] == "true"
        ingest, emitter = stack.source("IngestFunction"), stack.source("EmitterFunction")
        assert isinstance(ingest, KafkaEventSource)
        assert ingest.consumers == 3  # one per partition of the delay topic
        assert isinstance(emitter, SqsEventSource)
        assert emitter.concurrency == 16  # MaximumConcurrency 50, capped locally
        assert isinstance(stack.source("TimerFunction"), ScheduleEventSource)
        assert isinstance(stack.source("SchedulerFunction"), SqsEventSource)
        assert isinstance(stack.source("CleanupFunction"), StreamEventSource)
        assert [t.table_name for t in stack.ttl_emulators] == [resources["MessageTable"].ref]

        producer = Producer({"bootstrap.servers": stack.kafka_bootstrap})
        producer.produce("delay-requests", value=b"request")
        assert producer.flush(10) == 0
        stack.client("sqs").send_message(QueueUrl=resources["DelayQueue"].ref, MessageBody="due")
        stack.client("sqs").send_message(
            QueueUrl=resources["TickQueue"].ref,
            MessageBody="tick",
            MessageGroupId="ticks",
            MessageDeduplicationId="tick-1",
        )
        stack.client("dynamodb").put_item(
            TableName=resources["MessageTable"].ref,
            Item={"pk": {"S": "p"}, "sk": {"S": "s"}, "expires_at": {"N": "1"}},
        )

        assert wait_until(lambda: all(h.calls for h in handlers.values()), 30)
        ingest_event: dict[str, Any] = handlers["IngestFunction"].events[0]
        assert ingest_event["eventSource"] == "SelfManagedKafka"
        assert handlers["EmitterFunction"].events[0]["Records"][0]["body"] == "due"
        assert handlers["CleanupFunction"].events[0]["Records"][0]["userIdentity"]["type"] == (
            "Service"
        )
        assert handlers["TimerFunction"].contexts[0].function_name == (
            f"{stack_name}-TimerFunction"
        )
        assert set(stack.stats()) >= {s.name for s in stack.sources.values()}

    assert dict(os.environ) == before


def test_handlers_load_from_their_files_with_their_own_environment(
    tmp_path: Path, stack_name: str
) -> None:
    shutil.copy(FIXTURES / "template.yaml", tmp_path / "template.yaml")
    for name in ("ingest", "emitter"):
        (tmp_path / "functions" / name).mkdir(parents=True)
        (tmp_path / "functions" / name / "app.py").write_text(APP)
    probe = tmp_path / "probe.jsonl"
    path_before = list(sys.path)
    config = StackConfig(
        project_root=tmp_path,
        stack_name=stack_name,
        functions=frozenset({"IngestFunction", "EmitterFunction"}),
        environment={"PROBE_FILE": str(probe)},
        kafka_consumers=1,
        concurrency={"EmitterFunction": 1},
    )

    with EmbeddedStack(config) as stack:
        queue = stack.deployment.resources["DelayQueue"].ref
        stack.client("sqs").send_message(QueueUrl=queue, MessageBody="due")

        def invoked() -> list[dict[str, Any]]:
            lines = probe.read_text().splitlines() if probe.exists() else []
            return [e for e in map(json.loads, lines) if "invoked" in e]

        assert wait_until(lambda: len(invoked()) == 1, 20)

    entries = [json.loads(line) for line in probe.read_text().splitlines()]
    imports = {e["imported"]: e["service"] for e in entries if "imported" in e}
    assert len(imports) == 2
    assert all(name.startswith(f"delayq_fn_{stack_name}_") for name in imports)
    emitter_module = next(n for n in imports if "EmitterFunction" in n)
    ingest_module = next(n for n in imports if "IngestFunction" in n)
    # Each function's own variables; each environment its own Powertools service (logger).
    number = emitter_module.rsplit("_", 1)[1]
    assert imports[emitter_module] == f"delayq-emitter/EmitterFunction/{number}"
    assert imports[ingest_module].startswith("delayq/IngestFunction/")
    assert invoked()[0] == {
        "invoked": emitter_module,
        "function": f"{stack_name}-EmitterFunction",
    }
    assert sys.path == path_before


def test_powertools_keeps_appended_keys_per_service_name() -> None:
    # Why each local execution environment gets its own service name: loggers of one service
    # share the keys a handler appends (its request id, cold start), loggers of two do not.
    first, same = Logger(service="probe-shared"), Logger(service="probe-shared")
    first.append_keys(request_id="first")
    assert same.get_current_keys().get("request_id") == "first"
    ingest, emitter = (
        Logger(service="probe/IngestFunction/1"),
        Logger(service="probe/EmitterFunction/2"),
    )
    ingest.append_keys(request_id="ingest-1")
    assert "request_id" not in emitter.get_current_keys()


SKEWED_APP = '''
"""A probe handler that takes its clock as every handler does, and records what it reads."""
import json
import os
import time

from delayq.clock import handler_clock

clock = handler_clock(__name__)

def handler(event, context):
    with open(os.environ["PROBE_FILE"], "a") as probe:
        probe.write(json.dumps({"clock": clock(), "true": time.time_ns() // 1_000_000}) + "\\n")
    return {"batchItemFailures": []}
'''


def project(tmp_path: Path, app: str) -> Path:
    """A project folder with the fixture template and `app` as the emitter's handler."""
    shutil.copy(FIXTURES / "template.yaml", tmp_path / "template.yaml")
    (tmp_path / "functions" / "emitter").mkdir(parents=True)
    (tmp_path / "functions" / "emitter" / "app.py").write_text(app)
    return tmp_path


def emitter_only(root: Path, stack_name: str, probe: Path, skew_ms: int) -> StackConfig:
    return StackConfig(
        project_root=root,
        stack_name=stack_name,
        functions=frozenset({"EmitterFunction"}),
        environment={"PROBE_FILE": str(probe)},
        concurrency={"EmitterFunction": 1},
        emulate_ttl=False,
        faults=FaultPlan(clock_skew_ms={"EmitterFunction": skew_ms}),
    )


def test_clock_skew_reaches_the_handler_through_its_clock(tmp_path: Path, stack_name: str) -> None:
    probe = tmp_path / "probe.jsonl"
    config = emitter_only(project(tmp_path, SKEWED_APP), stack_name, probe, 60_000)

    with EmbeddedStack(config) as stack:
        queue = stack.deployment.resources["DelayQueue"].ref
        stack.client("sqs").send_message(QueueUrl=queue, MessageBody="due")
        assert wait_until(lambda: probe.exists() and probe.read_text().strip() != "", 20)

    seen = json.loads(probe.read_text().splitlines()[0])
    assert 59_000 < seen["clock"] - seen["true"] <= 60_000


def test_a_handler_that_does_not_take_its_clock_cannot_be_skewed(
    tmp_path: Path, stack_name: str
) -> None:
    config = emitter_only(project(tmp_path, APP), stack_name, tmp_path / "probe.jsonl", 1_000)

    with pytest.raises(LocalStackError, match="does not take its clock"):
        EmbeddedStack(config).start()


def test_a_configured_endpoint_replaces_the_embedded_moto(
    moto_server: MotoServer, stack_name: str
) -> None:
    config = StackConfig(
        template=FIXTURES / "template.yaml",
        stack_name=stack_name,
        aws_endpoint=moto_server.endpoint_url,
        functions=frozenset(),
        emulate_ttl=False,
    )

    with EmbeddedStack(config) as stack:
        assert stack.moto is None
        assert stack.aws_endpoint_url == moto_server.endpoint_url
        assert stack.sources == {}


def test_a_failed_start_stops_what_it_started(stack_name: str) -> None:
    config = StackConfig(
        template=FIXTURES / "template.yaml",
        stack_name=stack_name,
        parameters={"NoSuchParameter": "x"},
    )
    stack = EmbeddedStack(config)

    with pytest.raises(Exception, match="unknown template parameters"):
        stack.start()

    assert stack.mock_kafka is not None
    assert not stack.mock_kafka.running
    assert "AWS_ENDPOINT_URL" not in os.environ


@pytest.mark.localstack
@pytest.mark.skipif(not reachable(localstack_endpoint()), reason="no LocalStack endpoint answers")
def test_the_stack_provisions_on_localstack(stack_name: str) -> None:
    config = StackConfig(
        template=FIXTURES / "template.yaml",
        stack_name=stack_name,
        localstack=True,
        functions=frozenset(),
        emulate_ttl=False,
    )

    with EmbeddedStack(config) as stack:
        assert stack.moto is None
        assert stack.deployment.resources["DelayQueue"].ref


@pytest.mark.realkafka
@pytest.mark.skipif(
    not reachable(os.environ.get("DELAYQ_TEST_KAFKA_BOOTSTRAP", "")),
    reason="DELAYQ_TEST_KAFKA_BOOTSTRAP is not set or does not answer",
)
def test_the_stack_consumes_from_a_real_broker(stack_name: str) -> None:
    ingest = RecordingHandler()
    bootstrap = os.environ["DELAYQ_TEST_KAFKA_BOOTSTRAP"]
    topic = f"delay-requests-{stack_name}"
    config = StackConfig(
        template=FIXTURES / "template.yaml",
        stack_name=stack_name,
        kafka_bootstrap=bootstrap,
        parameters={"DelayTopic": topic},
        handlers={"IngestFunction": ingest},
        functions=frozenset({"IngestFunction"}),
    )
    producer = Producer({"bootstrap.servers": bootstrap})

    with EmbeddedStack(config) as stack:
        assert stack.mock_kafka is None
        producer.produce(topic, value=b"real")
        assert producer.flush(10) == 0
        assert wait_until(lambda: ingest.calls >= 1, 30)


def test_disabled_metrics_are_dropped_after_each_local_invocation(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Powertools prints its shared metric set whenever a metric reaches 100 values, even with
    # metrics disabled; in one process for every function that printed one function's
    # metrics under another's service. Each invocation's disabled metrics are dropped.
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    metrics = Metrics(namespace="probe")

    def handler(_event: Any, _context: Any) -> None:
        for value in range(60):
            metrics.add_metric(name="Probe", unit=MetricUnit.Count, value=value)

    environment = LocalFunction(name="probe", loader=lambda: handler).environment()
    for _ in range(3):  # 180 values in all: printed at the 100th without the drop
        assert environment.invoke({}).error is None
    assert "Probe" not in capsys.readouterr().out
