"""The product end to end on the embedded stack, through the real protocols and handlers."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from delayq_local.demo import DemoOptions, run_demo
from delayq_local.demo_plan import DEFAULT_TARGETS
from delayq_local.stack import StackConfig, TimeCompression
from tests.integration.support import PROJECT_ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not (PROJECT_ROOT / "functions" / "emitter" / "app.py").exists(),
        reason="the handlers are not written yet",
    ),
]

# Short periods, so that both paths, the scheduler's catch-up and TTL clean-up all run.
FAST = TimeCompression(
    horizon_seconds=15, lookahead_seconds=10, tick_seconds=2, ttl_grace_seconds=10
)
# A loose bound for CI; the measured figures are printed.
LATENESS_P99_BOUND_MS = 5000


def config(stack_name: str) -> StackConfig:
    return StackConfig(
        project_root=PROJECT_ROOT,
        stack_name=stack_name,
        parameters={"AllowedTargets": "demo.*"},
        topics=DEFAULT_TARGETS,
        environment={"LOG_LEVEL": "ERROR"},
        time=FAST,
        concurrency={"EmitterFunction": 2},
        ttl_sweep_seconds=2.0,
    )


def test_every_request_arrives_on_time_and_bad_input_is_rejected(
    stack_name: str, tmp_path: Path
) -> None:
    # Written over 10 s, as a producer writes: the burst at one moment, cancels after their
    # requests.
    options = DemoOptions(
        messages=150,
        max_delay_seconds=40,
        send_seconds=10,
        results=tmp_path,
        timeout_seconds=60,
    )

    report = run_demo(config(stack_name), options, out=io.StringIO())

    print("\n".join(report.lines()))
    assert report.expected > 100
    assert (report.lost, report.lost_ids) == (0, ())
    assert report.early == 0
    assert report.cancelled_honoured == report.cancelled > 0
    assert report.rejected == report.rejected_expected
    assert report.rejected_wrong_reason == 0
    assert report.due_mismatches == 0
    assert report.lateness_ms.count == report.delivered
    assert report.lateness_ms.p99 < LATENESS_P99_BOUND_MS
    assert (tmp_path / "demo.json").is_file()
    assert (tmp_path / "lateness.png").stat().st_size > 0
    # Every function's calls (and its event sources') were checked against its role.
    assert report.iam_denials == ()
    assert report.iam_checked > report.expected
    assert report.ok


def test_a_kafka_outage_mid_run_loses_nothing(stack_name: str, tmp_path: Path) -> None:
    options = DemoOptions(
        messages=120,
        max_delay_seconds=40,
        send_seconds=0,  # all written before the outage starts
        results=tmp_path,
        timeout_seconds=90,
        kafka_outage=(8.0, 6.0),
    )

    report = run_demo(config(stack_name), options, out=io.StringIO())

    print("\n".join(report.lines()))
    assert (report.lost, report.lost_ids) == (0, ())
    assert report.early == 0
    assert report.cancelled_honoured == report.cancelled
