"""Test factories: events, records, handler loading, a recording SQS client, client errors.

The doubles tests share with the benchmarks are in :mod:`testkit`."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import Stubber
from hypothesis import settings as hypothesis_settings

from delayq import constants as c
from delayq.records import DelayRequest
from delayq.settings import Settings
from delayq.store import MessageStore
from delayq_local.deploy_init import KafkaClient
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import queue_arn, sqs_record
from testkit.services import message_store

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "events"
REGION = "us-east-1"
TARGETS = ("orders.*", "reminders")
# Property tests: no per-example deadline, since coverage runs are several times slower.
PROPERTY = hypothesis_settings(deadline=None)


@dataclass
class AwsResources:
    """The resources of one moto account, created like the template declares them."""

    settings: Settings
    dynamodb: Any
    sqs: Any
    s3: Any
    stream_arn: str
    extra: dict[str, Any] = field(default_factory=dict)

    def receive_all(self, url: str, wait: int = 0) -> list[dict[str, Any]]:
        """Drain a queue (ignoring delays: moto honours DelaySeconds, so callers may need to
        read attributes instead)."""
        out: list[dict[str, Any]] = []
        while True:
            got = self.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=wait,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                return out
            out.extend(got)
            for m in got:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def bodies(self, url: str) -> list[dict[str, Any]]:
        return [json.loads(m["Body"]) for m in self.receive_all(url)]

    def visible_and_delayed(self, url: str) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(
            attrs["ApproximateNumberOfMessagesDelayed"]
        )


def load_event(name: str) -> dict[str, Any]:
    """One of the shared sample events in events/."""
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def load_handler(name: str) -> ModuleType:
    """functions/<name>/app.py as a fresh module (each handler file is called app.py)."""
    path = ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"delayq_fn_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class SentEntry:
    """One entry an SQS client was asked to send, with the fake time it was sent."""

    queue_url: str
    body: str
    delay_seconds: int
    sent_ms: int

    @property
    def release_ms(self) -> int:
        """When SQS makes it visible (DelaySeconds are whole seconds)."""
        return self.sent_ms + self.delay_seconds * 1000


class RecordingSqs:
    """Wraps a real (moto) SQS client; records every batch entry with the fake clock's time.

    ``fail_ids_once`` makes SendMessageBatch report those entry ids in ``Failed[]`` once;
    ``raise_after`` raises a crash after that many successful batch calls.
    """

    def __init__(self, inner: Any, clock: Any) -> None:
        self._inner = inner
        self._clock = clock
        self.sent: list[SentEntry] = []
        self.fail_ids_once: set[str] = set()
        self.raise_after: int | None = None
        self.calls = 0
        self.visibility_changes: list[tuple[str, str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def change_message_visibility(
        self,
        QueueUrl: str,  # noqa: N803
        ReceiptHandle: str,  # noqa: N803
        VisibilityTimeout: int,  # noqa: N803
    ) -> dict[str, Any]:
        self.visibility_changes.append((QueueUrl, ReceiptHandle, VisibilityTimeout))
        response: dict[str, Any] = self._inner.change_message_visibility(
            QueueUrl=QueueUrl, ReceiptHandle=ReceiptHandle, VisibilityTimeout=VisibilityTimeout
        )
        return response

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        if self.raise_after is not None and self.calls >= self.raise_after:
            raise RuntimeError("simulated crash of the invocation")
        self.calls += 1
        failing = [e for e in Entries if e["Id"] in self.fail_ids_once]
        self.fail_ids_once -= {e["Id"] for e in failing}
        passing = [e for e in Entries if e not in failing]
        response: dict[str, Any] = {"Successful": [], "Failed": []}
        if passing:
            # The real queue keeps no delay: tests replay DelaySeconds on the fake clock.
            response = self._inner.send_message_batch(
                QueueUrl=QueueUrl, Entries=[{**e, "DelaySeconds": 0} for e in passing]
            )
            for e in passing:
                self.sent.append(
                    SentEntry(QueueUrl, e["MessageBody"], e["DelaySeconds"], self._clock())
                )
        response.setdefault("Failed", [])
        response["Failed"] = [
            *response["Failed"],
            *({"Id": e["Id"], "SenderFault": False, "Code": "InternalError"} for e in failing),
        ]
        return response

    def to(self, url: str) -> list[SentEntry]:
        return [e for e in self.sent if e.queue_url == url]


def sqs_event(entries: list[SentEntry], receive_count: int = 1) -> dict[str, Any]:
    """An SQS event (as the Lambda event source delivers it) for recorded entries."""
    return {
        "Records": [
            sqs_record(
                message_id=f"m-{i}-{e.sent_ms}",
                receipt_handle=f"rh-{i}-{e.sent_ms}",
                body=e.body,
                source_arn=queue_arn(e.queue_url),
                receive_count=receive_count,
                sent_ms=e.sent_ms,
                first_receive_ms=e.release_ms,
            )
            for i, e in enumerate(entries)
        ]
    }


def delay_request(
    *,
    delay_id: str = "order-1",
    target: str = "orders.timeout",
    due_ms: int = NOW_MS + 60_000,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: tuple[tuple[str, bytes | None], ...] = (("trace", b"t-1"),),
    src: str = "delay-requests-0-0",
    payload_ref: str | None = None,
) -> DelayRequest:
    """A parsed delay request, for the adapters that take one."""
    return DelayRequest(delay_id, target, due_ms, key, value, headers, src, payload_ref)


def store_of(client: Any, settings: Settings) -> MessageStore:
    """The message table through ``client``, shaped by ``settings``, with no real sleeps."""
    return message_store(client, settings, no_sleep_backoff())


def client_error(code: str, *, status: int = 400, operation: str = "Operation") -> ClientError:
    """A botocore ClientError as a service would raise it."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} (test)"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


class ClientProxy:
    """A boto3 client with some operations replaced; everything else goes to the real one.

    ``ClientProxy(real, batch_write_item=fn)`` calls ``fn(**kwargs)`` for that operation, and
    records every replaced call in ``calls`` as ``(name, kwargs)``.
    """

    def __init__(self, real: Any, **overrides: Callable[..., Any]) -> None:
        self.real = real
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        override = self._overrides.get(name)
        if override is None:
            return getattr(self.real, name)

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return override(**kwargs)

        return call


class LateWrites:
    """A DynamoDB client whose reschedule-marker writes time out for the caller and take
    effect later, when the test lands them (AWS accepts a signed request up to five minutes
    after its timestamp; the layer's read timeout is seconds)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.held: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def _marker(self, kwargs: dict[str, Any]) -> bool:
        return str(kwargs["Key"]["pk"]["S"]).startswith(c.CANCEL_PK_PREFIX) and (
            c.ATTR_RESCHEDULE_ORDER in kwargs.get("ExpressionAttributeNames", {}).values()
        )

    def update_item(self, **kwargs: Any) -> Any:
        if not self._marker(kwargs):
            return self.real.update_item(**kwargs)
        self.held.append(("update_item", kwargs))
        raise ReadTimeoutError(endpoint_url="https://dynamodb.eu-west-1.amazonaws.com")

    def transact_write_items(self, **kwargs: Any) -> Any:
        if not any("Update" in i and self._marker(i["Update"]) for i in kwargs["TransactItems"]):
            return self.real.transact_write_items(**kwargs)
        self.held.append(("transact_write_items", kwargs))
        raise ReadTimeoutError(endpoint_url="https://dynamodb.eu-west-1.amazonaws.com")

    def land(self) -> None:
        """Every held write takes effect now (its conditions judged now)."""
        for name, kwargs in self.held:
            with contextlib.suppress(ClientError):
                getattr(self.real, name)(**kwargs)
        self.held.clear()


# An MSK cluster as the kafka API describes it (moto has no GetBootstrapBrokers).
MSK_ARN = (
    "arn:aws:kafka:eu-west-1:123456789012:cluster/orders/0a1b2c3d-4e5f-6789-abcd-ef0123456789-2"
)
MSK_SUBNETS = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
MSK_GROUPS = ["sg-0123456789abcdef0"]
MSK_IAM_BROKERS = "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098"
MSK_SCRAM_BROKERS = "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9096"
SCRAM_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:AmazonMSK_delayq-AbCdEf"
SCRAM_KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def msk_provisioned(iam: bool = True, scram: bool = True) -> dict[str, Any]:
    """DescribeClusterV2's response for a provisioned cluster, as the API reference shapes it."""
    return {
        "ClusterInfo": {
            "ClusterArn": MSK_ARN,
            "ClusterName": "orders",
            "ClusterType": "PROVISIONED",
            "State": "ACTIVE",
            "Provisioned": {
                "BrokerNodeGroupInfo": {
                    "ClientSubnets": MSK_SUBNETS,
                    "InstanceType": "kafka.m5.large",
                    "SecurityGroups": MSK_GROUPS,
                },
                "ClientAuthentication": {
                    "Sasl": {"Iam": {"Enabled": iam}, "Scram": {"Enabled": scram}},
                    "Unauthenticated": {"Enabled": False},
                },
                "NumberOfBrokerNodes": 3,
            },
        }
    }


MSK_BROKERS = {
    "BootstrapBrokerStringTls": "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9094",
    "BootstrapBrokerStringSaslIam": MSK_IAM_BROKERS,
    "BootstrapBrokerStringSaslScram": MSK_SCRAM_BROKERS,
}


class StubbedKafka:
    """A real boto3 `kafka` client answered by a Stubber; records the regions asked for."""

    def __init__(self, description: dict[str, Any], brokers: dict[str, str]) -> None:
        self.client = boto3.client("kafka", region_name="eu-west-1")
        self.stubber = Stubber(self.client)
        self.stubber.add_response("describe_cluster_v2", description, {"ClusterArn": MSK_ARN})
        self.stubber.add_response("get_bootstrap_brokers", brokers, {"ClusterArn": MSK_ARN})
        self.stubber.activate()
        self.regions: list[str] = []

    def __call__(self, region: str) -> KafkaClient:
        self.regions.append(region)
        client: KafkaClient = self.client
        return client
