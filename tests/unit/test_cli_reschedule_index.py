"""`delayq reschedule ID` without --due: refused, with nothing written, on a stack known to keep
no id index (ingest would reject the record as missing-due)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delayq import constants as c
from delayq_local.cli import main
from delayq_local.state import ENV_STATE_FILE


@pytest.fixture
def local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A running `delayq local`'s state file with its ingest function's variables."""
    path = tmp_path / "state.json"
    monkeypatch.setenv(ENV_STATE_FILE, str(path))
    monkeypatch.delenv(c.ENV_ID_INDEX, raising=False)
    return path


def write_state(path: Path, environment: dict[str, str]) -> None:
    path.write_text(
        json.dumps(
            {
                "stack_name": "delayq-test",
                "aws_endpoint": "http://127.0.0.1:1",
                "region": "us-east-1",
                "environment": environment,
            }
        )
    )


# Nothing listens there: a command that tried to write would fail, not exit 2 with our words.
NO_BROKER = ["--bootstrap", "127.0.0.1:1", "-X", "message.timeout.ms=1000"]


@pytest.mark.parametrize("environment", [{c.ENV_ID_INDEX: "0"}, {}], ids=["off", "default"])
def test_a_stack_without_the_index_refuses_a_reschedule_by_id_alone(
    local_state: Path, environment: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    write_state(local_state, {c.ENV_TABLE_NAME: "t", **environment})

    assert main(["reschedule", "order-7", "--delay", "60", *NO_BROKER]) == 2

    err = capsys.readouterr().err
    assert "keeps no id index" in err
    assert "pass --due" in err
    assert "nothing written" in err


def test_the_environment_alone_cannot_say_and_does_not_refuse(
    local_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayq_local.cli import _index_kept, _parser

    args = _parser(lambda: 0, lambda _s: None).parse_args(["reschedule", "x", "--delay", "1"])
    assert _index_kept(args) is None  # no state file: the environment, which may be partial
    monkeypatch.setenv(c.ENV_ID_INDEX, "1")
    assert _index_kept(args) is True
    write_state(local_state, {c.ENV_ID_INDEX: "1"})
    monkeypatch.delenv(c.ENV_ID_INDEX)
    assert _index_kept(args) is True
