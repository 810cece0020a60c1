"""`delayq redrive`: dead letters back into the pipeline from the command line, against the
DELAYQ_* environment, a deployed stack (CloudFormation outputs) or the running `delayq local`."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from delayq import constants as c
from delayq import runtime
from delayq.envelope import Envelope, decode_body
from delayq.ingest import ingest_batch
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq_local import AwsEndpoint, EmbeddedStack, MotoServer, StackConfig
from delayq_local.cli import _describe, main
from delayq_local.doubles import RecordingHandler
from delayq_local.state import ENV_STATE_FILE, write_state
from testkit.clock import NOW_MS, FakeClock
from testkit.events import kafka_event, kafka_record
from tests.factories import REGION, TARGETS, AwsResources, delay_request
from tests.integration.support import PROJECT_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No state file of a real `delayq local`, no DELAYQ_* variables of the shell."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("DELAYQ_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "state" / "local-stack.json"))


def ingest_environ(s: Settings) -> dict[str, str]:
    """The variables the template gives the ingest function."""
    return {
        c.ENV_TABLE_NAME: s.table_name,
        c.ENV_DELAY_QUEUE_URL: s.delay_queue_url,
        c.ENV_REJECT_QUEUE_URL: s.reject_queue_url,
        c.ENV_PAYLOAD_BUCKET: s.payload_bucket,
        c.ENV_ALLOWED_TARGETS: ",".join(s.allowed_targets),
        c.ENV_SHARDS: str(s.shards),
    }


@pytest.fixture
def env(aws: AwsResources, monkeypatch: pytest.MonkeyPatch) -> AwsResources:
    for name, value in ingest_environ(aws.settings).items():
        monkeypatch.setenv(name, value)
    return aws


def delayq(
    capsys: pytest.CaptureFixture[str], clock: FakeClock, *argv: str
) -> tuple[int, str, str]:
    """Run `delayq redrive ...` (no long polling) on the fake clock: (status, stdout, stderr)."""
    status = main(["redrive", *argv, "--wait", "0"], clock=clock, sleep=clock.sleep)
    out, err = capsys.readouterr()
    return status, out, err


def dlq(aws: AwsResources) -> str:
    url: str = aws.extra["delay_dlq"]
    return url


def dead_letter(sqs: Any, url: str, *ids: str) -> None:
    for delay_id in ids:
        request = delay_request(delay_id=delay_id, due_ms=NOW_MS - 60_000)
        sqs.send_message(QueueUrl=url, MessageBody=Envelope(request).encode())


def counts(sqs: Any, url: str) -> tuple[int, int]:
    """(visible, hidden) messages of a queue."""
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def delay_ids(aws: AwsResources) -> list[str]:
    return sorted(
        entry.request.delay_id if entry.request else ""
        for m in aws.receive_all(aws.settings.delay_queue_url)
        for entry in decode_body(m["Body"])
    )


# --- usage and configuration: exit status 2 --------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: source"),
        (["tick-dlq"], "invalid choice: 'tick-dlq'"),
        (["rejects", "--limit", "ten"], "invalid int value: 'ten'"),
        (["rejects", "--rate", "fast"], "invalid float value: 'fast'"),
    ],
)
def test_bad_arguments_exit_2_with_argparse_usage(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["redrive", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_options_the_layer_refuses_exit_2_before_anything_is_read(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), "d-1")
    for option, message in (("--limit=-1", "limit must be >= 0"), ("--rate=0", "must be > 0")):
        status, out, err = delayq(capsys, clock, "delay-dlq", "--queue-url", dlq(env), option)
        assert (status, out) == (2, "")
        assert message in err
    assert counts(env.sqs, dlq(env)) == (1, 0)


def test_without_a_stack_or_variables_the_error_names_what_to_set(
    capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    status, _, err = delayq(capsys, clock, "rejects")
    assert status == 2
    assert "the environment does not set DELAYQ_TABLE_NAME, DELAYQ_DELAY_QUEUE_URL" in err
    assert "--stack-name" in err


def test_the_delay_dlq_from_the_environment_needs_queue_url(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    status, _, err = delayq(capsys, clock, "delay-dlq")
    assert status == 2
    assert "no queue to redrive delay-dlq from: pass --queue-url" in err


# --- the delay queue's dead-letter queue -----------------------------------------------------


def test_a_dry_run_says_what_would_move_and_leaves_the_queue_as_it_was(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), "d-1", "d-2", "d-3")

    status, out, _ = delayq(capsys, clock, "delay-dlq", "--queue-url", dlq(env), "--dry-run")

    assert status == 0
    assert out.splitlines()[:2] == [
        f"redrive delay-dlq from {dlq(env)} (dry run: nothing was moved)",
        "would move: 3",
    ]
    assert counts(env.sqs, dlq(env)) == (3, 0)
    assert delay_ids(env) == []


def test_dead_letters_go_back_to_the_delay_queue_and_json_reports_it(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), "d-1", "d-2", "d-3")

    status, out, _ = delayq(capsys, clock, "delay-dlq", "--queue-url", dlq(env), "--json")

    assert status == 0
    assert json.loads(out) == {
        "source": "delay-dlq",
        "source_url": dlq(env),
        "dry_run": False,
        "moved": 3,
        "still_rejected": 0,
        "failed": 0,
        "skipped": 0,
        "reasons": {},
        "errors": [],
        "waited_seconds": 0.0,
    }
    assert counts(env.sqs, dlq(env)) == (0, 0)
    assert delay_ids(env) == ["d-1", "d-2", "d-3"]


def test_a_failed_message_stays_prints_its_error_and_exits_1(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), "d-1")
    env.sqs.send_message(QueueUrl=dlq(env), MessageBody='{"v": 3}')

    status, out, _ = delayq(capsys, clock, "delay-dlq", "--queue-url", dlq(env))

    assert status == 1
    lines = out.splitlines()
    assert [lines[i] for i in (1, 4, 5)] == [
        "moved: 1",
        "failed: 1 (left on the source)",
        "errors:",
    ]
    assert "unknown envelope version 3" in lines[6]
    assert counts(env.sqs, dlq(env)) == (1, 0)


def test_a_queue_that_cannot_be_read_stops_the_run_with_exit_1(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    gone = dlq(env) + "-gone"
    status, out, err = delayq(capsys, clock, "delay-dlq", "--queue-url", gone)
    assert (status, out) == (1, "")
    assert f"redrive from {gone} stopped" in err


def test_limit_moves_that_many_and_leaves_the_rest(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), *(f"d-{i:02}" for i in range(25)))

    status, out, _ = delayq(
        capsys, clock, "delay-dlq", "--queue-url", dlq(env), "--limit", "12", "--json"
    )

    assert (status, json.loads(out)["moved"]) == (0, 12)
    assert len(delay_ids(env)) == 12
    assert counts(env.sqs, dlq(env)) == (13, 0)


def test_rate_paces_the_moves_on_the_injected_clock(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), *(f"d-{i:02}" for i in range(30)))

    status, out, _ = delayq(
        capsys, clock, "delay-dlq", "--queue-url", dlq(env), "--rate", "5", "--json"
    )

    # Bursts of one second's worth: the first 5 at once, the other 25 at 5 per second (and
    # at most one more second for the receive that finds the queue empty).
    assert (status, json.loads(out)["moved"]) == (0, 30)
    assert 5.0 <= sum(clock.slept) <= 6.0
    assert json.loads(out)["waited_seconds"] == pytest.approx(sum(clock.slept))
    assert len(delay_ids(env)) == 30


def test_a_paced_redrive_reports_its_progress_while_it_runs(
    env: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    dead_letter(env.sqs, dlq(env), *(f"p-{i:02}" for i in range(30)))

    status, out, err = delayq(capsys, clock, "delay-dlq", "--queue-url", dlq(env), "--rate", "5")

    progress = [line for line in err.splitlines() if line.startswith("redrive: ")]
    # 6 s of pacing on the fake clock, a line at most every 2 s.
    assert 2 <= len(progress) <= 4
    assert progress[-1].endswith("moved, 0 still rejected, 0 failed")
    read = [int(line.split()[1]) for line in progress]
    assert read == sorted(read)
    assert status == 0
    assert "moved" in out


# --- the reject queue ------------------------------------------------------------------------


def test_rejects_go_through_ingest_again_and_the_still_bad_stay_with_their_reason(
    env: AwsResources,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed = kafka_record(offset=1, target="payments.capture", seconds="5")
    broken = kafka_record(offset=2, seconds="5")
    result = ingest_batch(
        kafka_event(fixed, broken),
        settings=env.settings,
        services=runtime.ingest_services(env.settings),
        clock=clock,
        deadline=Deadline.after(60),
    )
    assert len(result.rejected) == 2
    monkeypatch.setenv(c.ENV_ALLOWED_TARGETS, ",".join((*TARGETS, "payments.*")))  # the fix

    status, out, _ = delayq(capsys, clock, "rejects")

    assert status == 0
    assert out.splitlines()[:3] == [
        f"redrive rejects from {env.settings.reject_queue_url}",
        "moved: 1",
        "still rejected: 1 (missing-target 1)",
    ]
    assert env.visible_and_delayed(env.settings.delay_queue_url) == 1
    [left] = env.bodies(env.settings.reject_queue_url)
    assert (left["reason"], left["record"]) == ("missing-target", broken)


# --- a deployed stack: CloudFormation outputs and the ingest function's environment ---------


def deploy(aws: AwsResources, name: str, outputs: dict[str, str]) -> None:
    """A stack with these outputs, and the ingest function the template would create."""
    role = boto3.client("iam").create_role(RoleName=f"{name}-ingest", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return None\n")
    boto3.client("lambda", region_name=REGION).create_function(
        FunctionName=f"{name}-IngestFunction",
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="app.handler",
        Code={"ZipFile": code.getvalue()},
        Environment={"Variables": ingest_environ(aws.settings)},
    )
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=name, TemplateBody=json.dumps(template)
    )


def test_stack_name_reads_the_queues_and_settings_of_the_deployed_stack(
    aws: AwsResources, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    deploy(
        aws,
        "delayq-prod",
        {"DelayDeadLetterQueueUrl": dlq(aws), "IngestFunctionName": "delayq-prod-IngestFunction"},
    )
    dead_letter(aws.sqs, dlq(aws), "d-1", "d-2")

    status, out, _ = delayq(
        capsys, clock, "delay-dlq", "--stack-name", "delayq-prod", "--region", REGION, "--json"
    )

    assert (status, json.loads(out)["moved"]) == (0, 2)
    assert delay_ids(aws) == ["d-1", "d-2"]


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (None, "cannot read stack delayq-prod in us-east-1: "),
        ({"DelayDeadLetterQueueUrl": "x"}, "stack delayq-prod has no IngestFunctionName output"),
    ],
)
def test_a_stack_that_cannot_be_resolved_exits_2(
    aws: AwsResources,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
    outputs: dict[str, str] | None,
    message: str,
) -> None:
    if outputs is not None:
        deploy(aws, "delayq-prod", outputs)
    status, _, err = delayq(capsys, clock, "delay-dlq", "--stack-name", "delayq-prod")
    assert status == 2
    assert message in err


# --- the running `delayq local` --------------------------------------------------------------


def test_the_state_file_of_delayq_local_is_enough_to_redrive_from_another_process(
    moto_server: MotoServer,
    stack_name: str,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
) -> None:
    config = StackConfig(
        project_root=PROJECT_ROOT,
        stack_name=stack_name,
        aws_endpoint=moto_server.endpoint_url,
        parameters={"AllowedTargets": "orders.*"},
        functions=frozenset({"IngestFunction"}),
        handlers={"IngestFunction": RecordingHandler()},
        kafka_consumers=1,
        emulate_ttl=False,
    )
    with EmbeddedStack(config) as stack:
        path = write_state(_describe(stack))
        delay_queue = stack.resource("DelayQueue").ref
    state = json.loads(path.read_text())
    assert state["environment"][c.ENV_SHARDS] == "2"  # the local stack's, not the template's
    assert c.ENV_TABLE_NAME not in os.environ  # what follows sees the state file only
    sqs = AwsEndpoint(moto_server.endpoint_url).client("sqs")
    dead_letter(sqs, state["outputs"]["DelayDeadLetterQueueUrl"], "d-1")

    status, out, _ = delayq(capsys, clock, "delay-dlq", "--json")

    assert (status, json.loads(out)["moved"]) == (0, 1)
    [moved] = sqs.receive_message(QueueUrl=delay_queue)["Messages"]
    assert Envelope.decode(moved["Body"]).request.delay_id == "d-1"
    assert "AWS_ENDPOINT_URL" not in os.environ
