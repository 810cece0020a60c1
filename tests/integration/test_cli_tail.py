"""The operator commands (`send`, `tail`, `get`, `rejects list`) against a running local stack
found through its state file, `tail` from another process, as a user runs them in a second
terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from delayq_local import EmbeddedStack, StackConfig
from delayq_local.cli import _describe, main
from delayq_local.state import ENV_STATE_FILE, write_state
from tests.integration.support import fast_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TARGET = "tail.orders"


def config(stack_name: str) -> StackConfig:
    return fast_stack(stack_name, "tail.*", TARGET)


def delayq_process(*argv: str) -> subprocess.Popen[str]:
    code = "import sys; from delayq_local.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(  # noqa: S603 (this interpreter, fixed arguments)
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def test_send_says_where_it_wrote_and_tail_shows_the_delivery(
    stack_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "local-stack.json"))
    with EmbeddedStack(config(stack_name)) as stack:
        write_state(_describe(stack))
        tail = delayq_process(
            "tail", "--from-beginning", "--count", "2", "--seconds", "90", "--json"
        )
        try:
            # Without --id: the id is the record's coordinates, which ingest uses.
            assert main(["send", "--target", TARGET, "--delay", "1", "--value", "a"]) == 0
            sent = capsys.readouterr().out
            assert main(["send", "--target", TARGET, "--delay", "3", "--id", "o-2", "--json"]) == 0
            second = json.loads(capsys.readouterr().out)
            assert main(["send", "--target", "elsewhere", "--delay", "1"]) == 2
            refused = capsys.readouterr().err
            # Beyond the horizon: stored, so `get` finds it by id and due time.
            due_ms = int(time.time() * 1000) + 60_000
            argv = ["send", "--target", TARGET, "--at", str(due_ms), "--id", "o-9"]
            assert main(argv) == 0
            assert capsys.readouterr().out.startswith("sent o-9 to ")
            stored = wait_for_get(capsys, "o-9", due_ms)
            assert main(["get", "nobody", "--due", str(due_ms)]) == 1
            assert "nothing for" in capsys.readouterr().out
            # Written anyway: ingest rejects it, and `rejects list` shows it, left in place.
            assert main(["send", "--target", "elsewhere", "--delay", "1", "--no-check"]) == 0
            capsys.readouterr()
            rejected = wait_for_reject(capsys, "target-not-allowed")
            out, err = tail.communicate(timeout=120)
        finally:
            tail.kill()
    assert tail.returncode == 0, err
    first_id = sent.split()[1]
    assert first_id.startswith(f"{stack.delay_topic}-")
    assert (second["id"], second["target"], second["topic"]) == ("o-2", TARGET, stack.delay_topic)
    assert "not allowed by the running stack" in refused
    assert rejected["headers"]["delay-target"] == "elsewhere"
    assert stored["stored"]["target"] == TARGET
    assert stored["stored"]["due_ms"] == due_ms
    deliveries = [json.loads(line) for line in out.splitlines()]
    assert sorted(d["id"] for d in deliveries) == sorted([first_id, "o-2"])
    [o2] = [d for d in deliveries if d["id"] == "o-2"]
    assert o2["due_ms"] == second["due_ms"]  # what send said, from the record's timestamp
    for delivery in deliveries:
        assert delivery["target"] == TARGET
        assert delivery["emitted_ms"] >= delivery["due_ms"]
        assert delivery["lateness_ms"] == delivery["emitted_ms"] - delivery["due_ms"]


def wait_for_get(
    capsys: pytest.CaptureFixture[str], delay_id: str, due_ms: int, timeout: float = 30
) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = main(["get", delay_id, "--due", str(due_ms), "--json"])
        out, err = capsys.readouterr()
        assert status in (0, 1), err
        answer: dict[str, Any] = json.loads(out)
        if status == 0:
            return answer
        time.sleep(0.5)
    raise AssertionError(f"{delay_id} was not stored within {timeout} s")


def wait_for_reject(
    capsys: pytest.CaptureFixture[str], reason: str, timeout: float = 30
) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert main(["rejects", "list", "--json"]) == 0
        listed: list[dict[str, Any]] = [
            json.loads(line) for line in capsys.readouterr().out.splitlines()
        ]
        found = [r for r in listed if r["reason"] == reason]
        if found:
            assert main(["rejects", "list", "--json"]) == 0  # still there: nothing consumed
            assert reason in capsys.readouterr().out
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {reason} reject within {timeout} s")


def test_tail_ends_with_status_1_when_too_few_deliveries_come(
    stack_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "local-stack.json"))
    with EmbeddedStack(config(stack_name)) as stack:
        write_state(_describe(stack))
        status = main(["tail", TARGET, "--count", "1", "--seconds", "2"])
    assert status == 1
