"""Operators by id alone (`get`, `reschedule`, `cancel` without --due) on a running local
stack, which keeps the id index."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayq_local import EmbeddedStack, StackConfig
from delayq_local.cli import _describe, main
from delayq_local.state import ENV_STATE_FILE, write_state
from tests.integration.support import fast_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TARGET = "byid.orders"


def config(stack_name: str) -> StackConfig:
    return fast_stack(stack_name, "byid.*", TARGET)


def get(capsys: pytest.CaptureFixture[str], delay_id: str) -> tuple[int, dict[str, Any]]:
    status = main(["get", delay_id, "--json"])
    out, err = capsys.readouterr()
    assert status in (0, 1), err
    return status, json.loads(out)


def wait_until(
    capsys: pytest.CaptureFixture[str],
    delay_id: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float = 40,
) -> dict[str, Any]:
    end = time.monotonic() + timeout
    answer: dict[str, Any] = {}
    while time.monotonic() < end:
        _, answer = get(capsys, delay_id)
        if done(answer):
            return answer
        time.sleep(0.5)
    raise AssertionError(f"{delay_id}: not reached within {timeout} s: {answer}")


def states(answer: dict[str, Any]) -> list[str]:
    return [entry["state"] for entry in answer["indexed"]]


def test_get_reschedule_and_cancel_by_id_alone(
    stack_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "local-stack.json"))
    with EmbeddedStack(config(stack_name)) as stack:
        write_state(_describe(stack))
        # Unknown ids: nothing indexed, status 1.
        status, nobody = get(capsys, "nobody")
        assert (status, nobody["found"], nobody["indexed"]) == (1, False, [])
        # Beyond the (compressed) horizon: stored; within it: queued by ingest.
        assert main(["send", "--target", TARGET, "--delay", "200", "--id", "h-1"]) == 0
        assert main(["send", "--target", TARGET, "--delay", "8", "--id", "q-1"]) == 0
        capsys.readouterr()
        queued = wait_until(capsys, "q-1", lambda a: states(a) == ["queued"], timeout=8)
        waiting = wait_until(capsys, "h-1", lambda a: states(a) == ["waiting"])
        first_due = waiting["indexed"][0]["due_ms"]
        assert main(["get", "h-1"]) == 0
        text = capsys.readouterr().out
        assert "indexed    due " in text
        assert "waiting in the table" in text

        # Moved by id alone: the old version is dropped, the copy waits at the new time.
        assert main(["reschedule", "h-1", "--delay", "400", "--json"]) == 0
        moved = json.loads(capsys.readouterr().out)
        assert moved["was_due_ms"] is None
        answer = wait_until(capsys, "h-1", lambda a: sorted(states(a)) == ["dropped", "waiting"])
        new = next(e for e in answer["indexed"] if e["state"] == "waiting")
        assert new["due_ms"] > first_due
        assert answer["reschedule"]["moved_to_ms"] == new["due_ms"]

        # Cancelled by id: it says what was waiting when it was written.
        assert main(["cancel", "h-1", "--json"]) == 0
        cancelled = json.loads(capsys.readouterr().out)
        assert cancelled["waiting_due_ms"] == [new["due_ms"]]
        answer = wait_until(capsys, "h-1", lambda a: states(a) == ["dropped", "dropped"])
        assert answer["cancel"] is not None
        assert main(["cancel", "nobody"]) == 0
        assert "no message with this id is indexed" in capsys.readouterr().out
    assert queued["indexed"][0]["due_ms"] > 0
