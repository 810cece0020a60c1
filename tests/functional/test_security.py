"""Security: the target allow-list holds at ingest and again at the emitter, whatever path a
message took; Kafka credentials come from Secrets Manager, never from the environment; every
secured Kafka mode encrypts in transit."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import boto3
import confluent_kafka
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import constants as c
from delayq.emitter import emit_batch, messages_from_event
from delayq.envelope import Envelope
from delayq.exceptions import ConfigurationError
from delayq.kafka import producer_config
from delayq.settings import Settings
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from testkit.kafka import CapturedProducer
from testkit.lambda_context import LambdaContext
from tests.factories import PROPERTY, REGION, ROOT, AwsResources, delay_request, load_handler
from tests.functional.conftest import Pipeline

ENV_PASSWORD = "password-from-the-environment"
ENV_USERNAME = "user-from-the-environment"
SECRET = {"username": "delayq-emitter", "password": "password-from-secrets-manager"}


# --- the allow-list at ingest --------------------------------------------------------------

# The pipeline allows "orders.*" and "reminders": exact names and fnmatch patterns, case-sensitive.
NEAR_MISSES = [
    "payments.capture",
    "orders",  # the pattern needs the dot
    "ordersX.timeout",
    "Orders.timeout",  # topic names are case-sensitive
    "ORDERS.TIMEOUT",
    "reminders.extra",
    "reminder",
    "xreminders",
    "remindersx",
    "?eminders",  # a pattern in the target is a plain name, not a wildcard
    "*",
    "[r]eminders",
    "__consumer_offsets",
    "delay-requests",  # not even the delay topic itself
]


@pytest.mark.parametrize("target", NEAR_MISSES)
def test_ingest_rejects_a_target_off_the_allow_list(p: Pipeline, target: str) -> None:
    result = p.ingest(kafka_event(kafka_record(target=target, seconds="5")))
    assert [str(r.reason) for r in result.rejected] == ["target-not-allowed"]
    assert (result.queued, result.stored, p.delayed()) == (0, 0, [])


@PROPERTY
@given(target=st.text(min_size=1, max_size=40))
def test_an_empty_allow_list_allows_nothing(target: str) -> None:
    assert not Settings().target_allowed(target)


def test_the_default_allow_list_is_empty_and_every_record_is_rejected(p: Pipeline) -> None:
    p.settings = p.settings.with_overrides(allowed_targets=())
    result = p.ingest(
        kafka_event(
            kafka_record(offset=1, target="orders.timeout", seconds="5"),
            kafka_record(offset=2, target="reminders", seconds="7200"),
        )
    )
    assert [str(r.reason) for r in result.rejected] == ["target-not-allowed"] * 2
    assert (result.queued, result.stored) == (0, 0)


# --- the allow-list again at the emitter ---------------------------------------------------


def test_a_message_put_straight_on_the_delay_queue_is_not_produced_off_the_allow_list(
    p: Pipeline,
) -> None:
    url = p.settings.delay_queue_url
    for request in (
        delay_request(delay_id="forged", target="payments.capture", due_ms=NOW_MS),
        delay_request(delay_id="honest", target="orders.timeout", due_ms=NOW_MS),
    ):
        p.aws.sqs.send_message(QueueUrl=url, MessageBody=Envelope(request).encode())
    received = p.aws.sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]
    )["Messages"]
    event = {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m["Attributes"],
                "eventSource": "aws:sqs",
            }
            for m in received
        ]
    }

    result = emit_batch(
        messages_from_event(event),
        settings=p.settings,
        services=p.emitter_services(),
        clock=p.clock,
        sleep=p.clock.sleep,
        deadline=p.deadline(),
    )

    assert [o.topic for o in p.producer.produced] == ["orders.timeout"]
    assert (result.rejected, result.failed) == (1, [])
    [reject] = p.aws.bodies(p.settings.reject_queue_url)
    assert reject["reason"] == "target-not-allowed"
    assert json.loads(reject["record"]["body"])["id"] == "forged"


def test_a_message_written_straight_into_the_store_is_not_produced_off_the_allow_list(
    p: Pipeline,
) -> None:
    forged = delay_request(delay_id="forged", target="payments.capture", due_ms=NOW_MS + 100_000)
    p.store.put_messages([forged], NOW_MS, p.deadline())
    p.set_watermark(NOW_MS // 1000)
    assert p.schedule().sent == 1

    result = p.deliver_released()

    assert p.producer.produced == []
    assert result.rejected == 1


def test_narrowing_the_allow_list_stops_messages_already_waiting(p: Pipeline) -> None:
    p.ingest(kafka_event(kafka_record(target="orders.timeout", seconds="10")))
    p.settings = p.settings.with_overrides(allowed_targets=("reminders",))

    result = p.deliver_released()

    assert p.producer.produced == []
    assert result.rejected == 1


# --- Kafka credentials: Secrets Manager, never the environment -------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setattr(confluent_kafka, "Producer", CapturedProducer)
    monkeypatch.setattr(CapturedProducer, "configs", [])
    return CapturedProducer.configs


@pytest.fixture
def emitter_env(aws: AwsResources, monkeypatch: pytest.MonkeyPatch) -> AwsResources:
    """What the template gives the emitter, plus credentials someone put in the environment."""
    s = aws.settings
    for var, value in {
        c.ENV_TABLE_NAME: s.table_name,
        c.ENV_DELAY_QUEUE_URL: s.delay_queue_url,
        c.ENV_REJECT_QUEUE_URL: s.reject_queue_url,
        c.ENV_DELAY_DLQ_URL: s.delay_dlq_url,
        c.ENV_PAYLOAD_BUCKET: s.payload_bucket,
        c.ENV_ALLOWED_TARGETS: ",".join(s.allowed_targets),
        c.ENV_KAFKA_BOOTSTRAP: "b-1.delayq:9096,b-2.delayq:9096",
        # None of these may ever be read.
        "DELAYQ_KAFKA_PASSWORD": ENV_PASSWORD,
        "DELAYQ_KAFKA_USERNAME": ENV_USERNAME,
        "KAFKA_PASSWORD": ENV_PASSWORD,
        "KAFKA_USERNAME": ENV_USERNAME,
        "SASL_PASSWORD": ENV_PASSWORD,
        "SASL_USERNAME": ENV_USERNAME,
    }.items():
        monkeypatch.setenv(var, value)
    return aws


def secret_arn(secret: dict[str, str]) -> str:
    client = boto3.client("secretsmanager", region_name=REGION)
    arn: str = client.create_secret(Name="delayq-kafka", SecretString=json.dumps(secret))["ARN"]
    return arn


def cold_start() -> dict[str, Any]:
    """Load the emitter handler and invoke it once: its producer is built at cold start."""
    app = load_handler("emitter")
    assert app.handler({"Records": []}, LambdaContext()) is not None
    [config] = CapturedProducer.configs[-1:]
    return config


@pytest.mark.parametrize(
    ("security", "mechanism"),
    [("SASL_SCRAM_SHA_512", "SCRAM-SHA-512"), ("SASL_SCRAM_SHA_256", "SCRAM-SHA-256")],
)
def test_scram_credentials_come_from_secrets_manager_not_the_environment(
    emitter_env: AwsResources,
    captured: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    security: str,
    mechanism: str,
) -> None:
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, security)
    monkeypatch.setenv(c.ENV_KAFKA_SECRET_ARN, secret_arn(SECRET))

    config = cold_start()

    assert {k: v for k, v in config.items() if k.startswith(("sasl.", "security."))} == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": SECRET["username"],
        "sasl.password": SECRET["password"],
    }
    assert not {ENV_PASSWORD, ENV_USERNAME} & {v for v in config.values() if isinstance(v, str)}


def test_a_rotated_secret_is_read_by_the_next_cold_start(
    emitter_env: AwsResources,
    captured: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arn = secret_arn(SECRET)
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, "SASL_SCRAM_SHA_512")
    monkeypatch.setenv(c.ENV_KAFKA_SECRET_ARN, arn)
    assert cold_start()["sasl.password"] == SECRET["password"]

    boto3.client("secretsmanager", region_name=REGION).put_secret_value(
        SecretId=arn, SecretString=json.dumps({**SECRET, "password": "rotated"})
    )

    assert cold_start()["sasl.password"] == "rotated"


def test_scram_without_a_secret_fails_at_cold_start_even_with_a_password_in_the_environment(
    emitter_env: AwsResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, "SASL_SCRAM_SHA_512")
    with pytest.raises(ConfigurationError, match="Secrets Manager secret"):
        Settings.from_env()


def test_settings_hold_no_credential(
    emitter_env: AwsResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, "SASL_SCRAM_SHA_512")
    monkeypatch.setenv(c.ENV_KAFKA_SECRET_ARN, "arn:aws:secretsmanager:us-east-1:1:secret:k")
    settings = Settings.from_env()
    assert ENV_PASSWORD not in repr(settings)
    assert ENV_USERNAME not in repr(settings)


def environment_reads(path: Path) -> list[str]:
    """Where a module touches ``os.environ`` or ``os.getenv``."""
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in {"environ", "getenv", "environb"}
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    ]


def test_only_the_settings_module_reads_the_environment() -> None:
    files = sorted((ROOT / "layers/delayq/delayq").glob("*.py")) + sorted(
        (ROOT / "functions").glob("*/app.py")
    )
    reads = [where for f in files for where in environment_reads(f)]
    assert [r.split(":")[0] for r in reads] == ["layers/delayq/delayq/settings.py"]


def test_no_setting_is_named_like_a_secret() -> None:
    names = [v for k, v in vars(c).items() if k.startswith("ENV_") and isinstance(v, str)]
    suspicious = [
        n
        for n in names
        if any(w in n for w in ("PASSWORD", "TOKEN", "SECRET", "CREDENTIAL", "KEY"))
        and n != c.ENV_KAFKA_SECRET_ARN  # a pointer to the secret, not the secret
    ]
    assert suspicious == []


# --- TLS and MSK IAM ---------------------------------------------------------------------------


def test_ssl_uses_tls_with_the_ca_bundle_and_no_sasl(
    emitter_env: AwsResources,
    captured: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, "SSL")
    monkeypatch.setenv(c.ENV_KAFKA_CA_LOCATION, "/opt/ca/msk.pem")

    config = cold_start()

    assert (config["security.protocol"], config["ssl.ca.location"]) == ("SSL", "/opt/ca/msk.pem")
    assert [k for k in config if k.startswith("sasl.")] == []


def test_msk_iam_signs_tokens_on_demand_with_no_static_credential() -> None:
    asked: list[str] = []

    def provider(region: str) -> tuple[str, int]:
        asked.append(region)
        return f"token-{len(asked)}", NOW_MS + 900_000

    settings = Settings(kafka_bootstrap="b-1:9098", kafka_security="MSK_IAM", region="eu-west-1")
    config = producer_config(settings, token_provider=provider)

    assert (config["security.protocol"], config["sasl.mechanisms"]) == ("SASL_SSL", "OAUTHBEARER")
    assert not [k for k in config if k in {"sasl.username", "sasl.password"}]
    assert asked == []  # nothing is signed until librdkafka asks
    assert config["oauth_cb"]("") == ("token-1", (NOW_MS + 900_000) / 1000)
    assert config["oauth_cb"]("") == ("token-2", (NOW_MS + 900_000) / 1000)  # refreshed, not cached
    assert asked == ["eu-west-1", "eu-west-1"]


def test_msk_iam_reads_no_secret(
    emitter_env: AwsResources,
    captured: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(c.ENV_KAFKA_SECURITY, "MSK_IAM")

    def no_secrets(*_: Any, **__: Any) -> Any:
        raise AssertionError("MSK IAM must not read Secrets Manager")

    monkeypatch.setattr("delayq.kafka.scram_credentials", no_secrets)
    config = cold_start()
    assert (config["sasl.mechanisms"], callable(config["oauth_cb"])) == ("OAUTHBEARER", True)


@pytest.mark.parametrize("security", ["SSL", "SASL_SCRAM_SHA_512", "SASL_SCRAM_SHA_256", "MSK_IAM"])
def test_every_secured_mode_encrypts_in_transit(security: str) -> None:
    settings = Settings(
        kafka_bootstrap="b-1:9096",
        kafka_security=security,
        kafka_secret_arn="arn:aws:secretsmanager:us-east-1:1:secret:k",
    )
    config = producer_config(
        settings, credentials={"username": "u", "password": "p"}, token_provider=lambda _: ("t", 0)
    )
    assert config["security.protocol"] in {"SSL", "SASL_SSL"}
