"""Settings: environment parsing, validation, the target allow-list."""

from __future__ import annotations

import dataclasses
import re

import pytest

from delayq import constants as c
from delayq.exceptions import ConfigurationError
from delayq.settings import Settings
from tests.factories import ROOT

# A row of the settings table in docs/internals.md: | `DELAYQ_X` | default | meaning |
DOCUMENTED_DEFAULT = re.compile(r"^\| `(DELAYQ_\w+)` \| `?([\w.]+)`? \|", re.MULTILINE)


def test_defaults_are_the_documented_ones() -> None:
    table = DOCUMENTED_DEFAULT.findall((ROOT / "docs" / "internals.md").read_text())
    documented = {var: value for var, value in table if value != "empty"}
    assert len(documented) == 26  # the numeric defaults and the Kafka security mode
    assert Settings.from_env(documented) == Settings()


def test_from_env_reads_every_variable_with_its_type() -> None:
    env = {
        "DELAYQ_TABLE_NAME": "t",
        "DELAYQ_DELAY_QUEUE_URL": "https://sqs/delay",
        "DELAYQ_TICK_QUEUE_URL": "https://sqs/tick.fifo",
        "DELAYQ_REJECT_QUEUE_URL": "https://sqs/reject",
        "DELAYQ_PAYLOAD_BUCKET": "b",
        "DELAYQ_ALLOWED_TARGETS": "orders.*, reminders",
        "DELAYQ_HORIZON_SECONDS": "60",
        "DELAYQ_LOOKAHEAD_SECONDS": "50",
        "DELAYQ_TICK_SECONDS": "5",
        "DELAYQ_SHARDS": "3",
        "DELAYQ_MAX_DELAY_SECONDS": "3600",
        "DELAYQ_MAX_PAYLOAD_BYTES": "2048",
        "DELAYQ_OFFLOAD_THRESHOLD_BYTES": "1024",
        "DELAYQ_TTL_GRACE_SECONDS": "120",
        "DELAYQ_TTL_CLOCK_MARGIN_SECONDS": "30",
        "DELAYQ_EMIT_LEAD_MS": "500",
        "DELAYQ_MAX_HOLD_MS": "1500",
        "DELAYQ_KAFKA_BOOTSTRAP": "b-1:9098",
        "DELAYQ_KAFKA_SECURITY": "SASL_SCRAM_SHA_512",
        "DELAYQ_KAFKA_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:k",
        "DELAYQ_KAFKA_CA_LOCATION": "/etc/ca.pem",
        "DELAYQ_KAFKA_TIMEOUT_SECONDS": "2.5",
        "DELAYQ_AWS_CONNECT_TIMEOUT_SECONDS": "1",
        "DELAYQ_AWS_READ_TIMEOUT_SECONDS": "4.5",
        "DELAYQ_STATS_FLUSH_MESSAGES": "1",
        "DELAYQ_SCHEDULER_PAGE_ITEMS": "25",
        "DELAYQ_INGEST_TIMEOUT_SECONDS": "10",
        "DELAYQ_DELAY_DLQ_URL": "https://sqs/delay-dlq",
        "DELAYQ_DELIVERY_MAX_ATTEMPTS": "3",
        "DELAYQ_TARGET_OUTAGE_MAX_SECONDS": "600",
        "DELAYQ_DIRECT_WINDOW_MS": "750",
        "DELAYQ_STRICT_CAPS": "0",
        "AWS_REGION": "eu-west-1",
    }
    assert Settings.from_env(env) == Settings(
        table_name="t",
        delay_queue_url="https://sqs/delay",
        tick_queue_url="https://sqs/tick.fifo",
        reject_queue_url="https://sqs/reject",
        payload_bucket="b",
        allowed_targets=("orders.*", "reminders"),
        horizon_seconds=60,
        lookahead_seconds=50,
        tick_seconds=5,
        shards=3,
        max_delay_seconds=3600,
        max_payload_bytes=2048,
        offload_threshold_bytes=1024,
        ttl_grace_seconds=120,
        ttl_clock_margin_seconds=30,
        emit_lead_ms=500,
        max_hold_ms=1500,
        kafka_bootstrap="b-1:9098",
        kafka_security="SASL_SCRAM_SHA_512",
        kafka_secret_arn="arn:aws:secretsmanager:us-east-1:1:secret:k",
        kafka_ca_location="/etc/ca.pem",
        kafka_timeout_seconds=2.5,
        aws_connect_timeout_seconds=1.0,
        aws_read_timeout_seconds=4.5,
        stats_flush_messages=1,
        scheduler_page_items=25,
        ingest_timeout_seconds=10,
        delay_dlq_url="https://sqs/delay-dlq",
        delivery_max_attempts=3,
        target_outage_max_seconds=600,
        direct_window_ms=750,
        strict_caps=0,
        region="eu-west-1",
    )


def test_from_env_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(c.ENV_SHARDS, "7")
    assert Settings.from_env().shards == 7


def test_from_env_trims_numbers() -> None:
    assert Settings.from_env({c.ENV_SHARDS: " 5 "}).shards == 5


def test_empty_variables_keep_the_default() -> None:
    assert Settings.from_env({c.ENV_SHARDS: "", c.ENV_TABLE_NAME: ""}) == Settings()


def test_allowed_targets_skip_empty_entries() -> None:
    s = Settings.from_env({c.ENV_ALLOWED_TARGETS: " a ,, b,"})
    assert s.allowed_targets == ("a", "b")


def test_explicit_overrides_win_over_the_environment() -> None:
    s = Settings.from_env({c.ENV_SHARDS: "5", c.ENV_TABLE_NAME: "env"}, shards=2)
    assert (s.shards, s.table_name) == (2, "env")


@pytest.mark.parametrize(
    ("var", "raw"),
    [(c.ENV_SHARDS, "many"), (c.ENV_HORIZON_SECONDS, "1.5"), (c.ENV_KAFKA_TIMEOUT_SECONDS, "x")],
)
def test_a_variable_that_is_not_a_number_names_itself(var: str, raw: str) -> None:
    with pytest.raises(ConfigurationError, match=var):
        Settings.from_env({var: raw})


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"horizon_seconds": 0, "lookahead_seconds": 1}, "horizon_seconds must be 1..900"),
        ({"horizon_seconds": 901}, "horizon_seconds must be 1..900"),
        ({"lookahead_seconds": 900}, "lookahead_seconds must be > 0 and < horizon_seconds"),
        ({"lookahead_seconds": 0}, "lookahead_seconds must be > 0 and < horizon_seconds"),
        ({"tick_seconds": 0}, "tick_seconds must be > 0"),
        (
            {"ttl_grace_seconds": 60},
            "ttl_clock_margin_seconds must be >= 0 and < ttl_grace_seconds \\(300 vs 60\\)",
        ),
        ({"ttl_clock_margin_seconds": -1}, "ttl_clock_margin_seconds must be >= 0"),
        ({"shards": 0}, "shards must be 1..256"),
        ({"shards": 257}, "shards must be 1..256"),
        (
            {"lookahead_seconds": 841},
            "lookahead_seconds \\+ ingest_timeout_seconds must be <= horizon_seconds",
        ),
        (
            {"horizon_seconds": 60, "lookahead_seconds": 50, "ingest_timeout_seconds": 11},
            "lookahead_seconds \\+ ingest_timeout_seconds must be <= horizon_seconds",
        ),
        ({"ingest_timeout_seconds": 0}, "ingest_timeout_seconds must be >= 1"),
        ({"delivery_max_attempts": 0}, "delivery_max_attempts must be >= 1"),
        ({"target_outage_max_seconds": -1}, "target_outage_max_seconds must be >= 0"),
        ({"direct_window_ms": -1}, "direct_window_ms must be 0..10000"),
        ({"direct_window_ms": 10_001}, "direct_window_ms must be 0..10000"),
        ({"allowed_targets": ("*",)}, "starts with a wildcard"),
        ({"allowed_targets": ("orders", "**")}, "starts with a wildcard"),
        ({"allowed_targets": ("?*",)}, "starts with a wildcard"),
        ({"allowed_targets": ("*?",)}, "starts with a wildcard"),
        ({"allowed_targets": ("[a-z]*",)}, "starts with a wildcard"),
        ({"allowed_targets": ("__consumer_offsets",)}, "names internal topics"),
        ({"allowed_targets": ("__*",)}, "names internal topics"),
        ({"stats_flush_messages": 0}, "stats_flush_messages must be >= 1"),
        ({"scheduler_page_items": 0}, "scheduler_page_items must be >= 1"),
        ({"max_delay_seconds": 0}, "max_delay_seconds must be >= 1"),
        ({"offload_threshold_bytes": 0}, "payload limits must be >= 1"),
        ({"max_payload_bytes": 0}, "payload limits must be >= 1"),
        ({"emit_lead_ms": -1}, "emit_lead_ms must be >= 0 and <= max_hold_ms"),
        ({"emit_lead_ms": 3001}, "emit_lead_ms must be >= 0 and <= max_hold_ms"),
        ({"kafka_security": "SASL_PLAIN"}, "kafka_security must be one of"),
        ({"kafka_security": "SASL_SCRAM_SHA_256"}, "needs kafka_secret_arn"),
        ({"strict_caps": 2}, "strict_caps must be 0 or 1"),
    ],
)
def test_invalid_settings_are_refused(overrides: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        Settings(**overrides)  # type: ignore[arg-type]


def test_boundary_settings_are_accepted() -> None:
    s = Settings(
        horizon_seconds=900,
        lookahead_seconds=840,
        emit_lead_ms=3000,
        max_hold_ms=3000,
        shards=256,
        ingest_timeout_seconds=60,
    )
    assert (s.lookahead_seconds, s.emit_lead_ms, s.shards) == (840, 3000, 256)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(tick_seconds=0, shards=0)
    assert str(caught.value) == "tick_seconds must be > 0; shards must be 1..256"


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().shards = 3  # type: ignore[misc]


def test_with_overrides_copies_and_validates_again() -> None:
    base = Settings(allowed_targets=("a",))
    copy = base.with_overrides(shards=2)
    assert (copy.shards, base.shards, copy.target_allowed("a")) == (2, 16, True)
    with pytest.raises(ConfigurationError):
        base.with_overrides(shards=0)


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("reminders", True),
        ("orders.timeout", True),
        ("orders.a.b", True),
        ("orders", False),
        ("ordersX", False),
        ("Reminders", False),
        ("reminders2", False),
        ("", False),
    ],
)
def test_target_allow_list_matches_names_and_patterns(topic: str, allowed: bool) -> None:
    assert Settings(allowed_targets=("orders.*", "reminders")).target_allowed(topic) is allowed


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state", "__x"])
def test_internal_topics_are_never_targets_whatever_the_allow_list(topic: str) -> None:
    # A pattern that starts with a literal may still match them ('_*'): refused at match time.
    assert not Settings(allowed_targets=("_*",)).target_allowed(topic)


def test_a_remembered_answer_is_one_allow_list_s_not_another_s() -> None:
    # Answers are cached by topic and allow-list: a topic allowed by one configuration stays
    # refused by another, whichever asked first.
    assert Settings(allowed_targets=("orders.*",)).target_allowed("orders.paid")
    assert not Settings(allowed_targets=("reminders",)).target_allowed("orders.paid")
    assert Settings(allowed_targets=("orders.*",)).target_allowed("orders.paid")


def test_nothing_is_allowed_by_default() -> None:
    assert not Settings().target_allowed("anything")


def test_empty_patterns_allow_nothing() -> None:
    assert not Settings(allowed_targets=("",)).target_allowed("")


def test_require_returns_the_settings_when_present() -> None:
    s = Settings(table_name="t", payload_bucket="b")
    assert s.require("table_name", "payload_bucket") is s


def test_require_names_every_missing_setting() -> None:
    with pytest.raises(ConfigurationError, match="missing settings: table_name, tick_queue_url"):
        Settings(payload_bucket="b").require("table_name", "payload_bucket", "tick_queue_url")
