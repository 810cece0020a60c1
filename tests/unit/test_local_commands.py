"""The operator side of `delayq`: where the state file lives, what `delayq local` prints, which
topics `tail` reads, and how arguments are read."""

from __future__ import annotations

import argparse
from pathlib import Path

import confluent_kafka
import pytest

from delayq.pending import PendingCount
from delayq_local import kafka_commands
from delayq_local.cli import demo_options, local_summary, main, parse_args, report_options
from delayq_local.exceptions import LocalStackError
from delayq_local.kafka_commands import epoch_ms, header, msk_iam_config
from delayq_local.pending_view import PendingReport, QueueDepth
from delayq_local.producer import Due
from delayq_local.state import (
    ENV_STATE_FILE,
    allowed_targets,
    export_line,
    read_state,
    state_file,
    write_state,
)
from delayq_local.tail import choose_topics

STATE = {
    "stack_name": "delayq-local",
    "aws_endpoint": "http://127.0.0.1:5000",
    "region": "us-east-1",
    "kafka_bootstrap": "127.0.0.1:9092",
    "delay_topic": "delay-requests",
    "environment": {"DELAYQ_ALLOWED_TARGETS": "demo.*, orders"},
}


def test_the_state_file_has_one_place_whatever_the_working_folder() -> None:
    assert state_file({"HOME": "/home/u"}) == Path("/home/u/.local/state/delayq/local-stack.json")
    assert state_file({"HOME": "/home/u", "XDG_STATE_HOME": "/s"}) == Path(
        "/s/delayq/local-stack.json"
    )
    assert state_file({"DELAYQ_STATE_FILE": "/tmp/x.json", "XDG_STATE_HOME": "/s"}) == Path(
        "/tmp/x.json"
    )


def test_the_state_round_trips_and_is_empty_when_no_stack_runs(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.json"

    assert read_state(path) == {}
    write_state(STATE, path)
    assert read_state(path) == STATE


def test_a_broken_state_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")

    with pytest.raises(Exception, match="not a readable state file"):
        read_state(path)


def test_the_export_line_carries_the_fake_credentials_the_aws_cli_needs() -> None:
    line = export_line(STATE)

    for part in (
        "AWS_ENDPOINT_URL=http://127.0.0.1:5000",
        "AWS_ACCESS_KEY_ID=testing",
        "AWS_SECRET_ACCESS_KEY=testing",
        "AWS_DEFAULT_REGION=us-east-1",
        "DELAYQ_KAFKA_BOOTSTRAP=127.0.0.1:9092",
    ):
        assert part in line


def test_delayq_local_prints_a_short_summary_with_what_to_try(tmp_path: Path) -> None:
    lines = local_summary(STATE, tmp_path / "s.json", 12.34)

    text = "\n".join(lines)
    assert lines[0] == "delayq local: stack delayq-local up in 12.3 s"
    assert "delay topic delay-requests" in text
    assert "targets   demo.*, orders" in text
    assert "delayq send --target demo.orders" in text
    assert "delayq tail" in text
    assert "kcat -b 127.0.0.1:9092" in text
    assert len(lines) < 12


def test_the_allow_list_is_read_from_the_stack_environment() -> None:
    assert allowed_targets(STATE) == ("demo.*", "orders")
    assert allowed_targets({}) == ()


def test_tail_reads_the_named_topics_else_the_allowed_ones() -> None:
    existing = ["__consumer_offsets", "delay-requests", "demo.a", "demo.b", "other"]

    assert choose_topics(existing, explicit=["x"]) == ["x"]
    assert choose_topics(existing, allowed=["demo.*"]) == ["demo.a", "demo.b"]
    assert choose_topics(existing, exclude=["delay-requests"]) == ["demo.a", "demo.b", "other"]


def test_the_report_writes_its_own_folder_and_leaves_requests_pending() -> None:
    demo = demo_options(parse_args(["demo"]))
    report = report_options(parse_args(["report"]))

    assert demo.results == Path("results")
    assert demo.reports is None
    assert demo.pending == 0
    assert report.results == report.reports == Path("results/report")
    assert report.pending > 0
    # The demo writes these files into results/ itself; the report writes nothing there.
    demo_files = {demo.results / name for name in ("demo.json", "lateness.png", "handlers.log")}
    assert not any(report.results in (f, *f.parents) for f in demo_files)
    assert demo.results not in (report.results, report.reports)
    custom = report_options(parse_args(["report", "--results", "out", "--pending", "3"]))
    assert (custom.results, custom.reports, custom.pending) == (Path("out"), Path("out"), 3)


def test_arguments_are_read_strictly() -> None:
    assert header("security.protocol=SASL_SSL") == ("security.protocol", b"SASL_SSL")
    assert epoch_ms("1700000000000") == 1_700_000_000_000
    assert epoch_ms("2026-01-01T00:00:00+00:00") == 1_767_225_600_000
    for bad in ("no-equals", "=value"):
        with pytest.raises(argparse.ArgumentTypeError):
            header(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="time zone"):
        epoch_ms("2026-01-01T00:00:00")


def test_send_says_the_due_time_ingest_computes_from_the_record_timestamp() -> None:
    assert Due(seconds=1.5).due_ms(1_000) == 2_500
    assert Due(ms=20).due_ms(1_000) == 1_020
    assert Due(at_ms=7).due_ms(1_000) == 7


def test_pending_refuses_a_stack_that_keeps_no_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "none.json"))  # no local stack runs
    monkeypatch.setenv("DELAYQ_TABLE_NAME", "messages")
    monkeypatch.setenv("DELAYQ_PENDING_COUNTS", "0")
    assert main(["pending"]) == 2
    assert "keeps no pending counts" in capsys.readouterr().err
    for days in ("0", "15", "x"):
        with pytest.raises(SystemExit) as exit_info:
            main(["pending", "--days", days])
        assert exit_info.value.code == 2


def test_pending_prints_periods_totals_the_scheduler_and_the_queues() -> None:
    minute = 29_000_000  # 2025-02-19T21:20Z
    report = PendingReport(
        by="hour",
        target=None,
        first_minute=minute,
        last_minute=minute + 7 * 1440 - 1,
        rows=[
            PendingCount(minute - 20, 60, "orders", 1_200, 3),
            PendingCount(minute + 40, 60, "mails", 0, 7),
            PendingCount(minute - 1280, 1440, "mails", 4, 0),
        ],
        watermark_second=minute * 60 - 4,
        now_ms=minute * 60_000,
        queues=[QueueDepth("https://sqs/1/delay-queue", 2, 1, 5)],
    )
    text = "\n".join(report.lines())
    assert "2025-02-19 21:00        orders      1,200          3      1,203" in text
    assert "2025-02-19 (whole day)  mails" in text
    assert "1,214" in text
    assert "(4 s behind now)" in text
    assert "delay queue delay-queue: about 5 bundles delayed, 2 ready, 1 being delivered" in text
    answer = report.as_json()
    assert (answer["stored"], answer["queued"], answer["total"]) == (1_204, 10, 1_214)
    assert answer["rows"][1] == {
        "start": "2025-02-19T22:00:00+00:00",
        "minutes": 60,
        "target": "mails",
        "stored": 0,
        "queued": 7,
        "total": 7,
    }
    empty = PendingReport("day", "x", minute, minute, [], None, minute * 60_000)
    assert "nothing waits" in "\n".join(empty.lines())
    assert "scheduler: no run yet" in "\n".join(empty.lines())


def test_msk_iam_gives_librdkafka_tokens_signed_for_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def provider(region: str) -> tuple[str, int]:
        asked.append(region)
        return "signed-token", 1_800_000_000_000

    config = msk_iam_config("eu-west-1", provider)
    assert (config["security.protocol"], config["sasl.mechanisms"]) == ("SASL_SSL", "OAUTHBEARER")
    # librdkafka asks for the first token when the client is created (nothing listens there).
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": 0, **config}
    )
    assert asked == ["eu-west-1"]
    assert config["oauth_cb"](None) == ("signed-token", 1_800_000_000.0)
    producer.flush(0)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(LocalStackError, match="needs a region"):
        msk_iam_config(None, provider)


def test_the_kafka_commands_take_msk_iam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYQ_KAFKA_BOOTSTRAP", "b-1.example:9098")
    monkeypatch.setenv(ENV_STATE_FILE, "/nonexistent/state.json")
    seen: list[dict[str, object]] = []

    def config(region: str | None) -> dict[str, object]:
        seen.append({"region": region})
        return {}

    monkeypatch.setattr(kafka_commands, "msk_iam_config", config)
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    kafka_commands.register(commands)
    for argv in (["send", "--target", "t", "--delay", "1"], ["tail"], ["cancel", "x"]):
        args = parser.parse_args([*argv, "--msk-iam", "--region", "eu-west-1"])
        kafka_commands._cluster(args)
    assert seen == [{"region": "eu-west-1"}] * 3
