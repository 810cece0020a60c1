"""`delayq pending` against a running local stack: what ingest stored and queued shows up per
period and target, a target filter narrows it, and the delay queue's depth is read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from delayq_local import EmbeddedStack, StackConfig
from delayq_local.cli import _describe, main
from delayq_local.producer import DelayProducer, Due
from delayq_local.state import ENV_STATE_FILE, write_state
from tests.integration.support import fast_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TARGET = "pending.orders"
OTHER = "pending.mails"


def config(stack_name: str) -> StackConfig:
    return fast_stack(stack_name, "pending.*", TARGET)


def pending(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    status = main(["pending", *argv, "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    answer: dict[str, Any] = json.loads(out)
    return answer


def test_pending_counts_what_waits_per_period_and_target(
    stack_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_STATE_FILE, str(tmp_path / "local-stack.json"))
    with EmbeddedStack(config(stack_name)) as stack:
        write_state(_describe(stack))
        now_ms = int(time.time() * 1000)
        producer = DelayProducer(stack.kafka_bootstrap, stack.delay_topic)
        # Beyond the (compressed) horizon: stored. Two due in one minute, one an hour on.
        for n, delay_ms in enumerate((600_000, 600_000, 4_200_000)):
            producer.send(TARGET, Due(at_ms=now_ms + delay_ms), value=b"x", delay_id=f"s-{n}")
        producer.send(OTHER, Due(at_ms=now_ms + 600_000), value=b"y", delay_id="m-1")
        # Due in 12 s, within the (compressed) 15 s horizon: queued.
        producer.send(TARGET, Due(at_ms=now_ms + 12_000), value=b"z", delay_id="q-1")
        producer.flush()
        producer.close()
        end = time.monotonic() + 60
        answer = pending(capsys)
        while answer["total"] < 5 and time.monotonic() < end:
            time.sleep(0.5)
            answer = pending(capsys)
        narrowed = pending(capsys, "--target", TARGET, "--by", "minute")
        assert main(["pending", "--by", "day"]) == 0
        human = capsys.readouterr().out
    assert (answer["stored"], answer["queued"], answer["total"]) == (4, 1, 5)
    assert {r["target"] for r in answer["rows"]} == {TARGET, OTHER}
    assert answer["scheduler_behind_seconds"] is not None
    # The delay queue of each priority class, with SQS's approximate counts.
    assert len(answer["delay_queues"]) == 3
    assert all({"visible", "in_flight", "delayed"} <= q.keys() for q in answer["delay_queues"])
    # Per minute and for one target: three minutes (12 s on, 10 min on, 70 min on).
    assert [(r["stored"], r["queued"]) for r in narrowed["rows"]] == [(0, 1), (2, 0), (1, 0)]
    assert all(r["target"] == TARGET for r in narrowed["rows"])
    assert "pending per day" in human
    assert "total" in human
