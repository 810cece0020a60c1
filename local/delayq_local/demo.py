"""`delayq demo`: the whole pipeline on the embedded stack, a mixed workload, and a verdict."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from delayq_local.demo_plan import DEFAULT_TARGETS, Sender, Workload
from delayq_local.faults import BrokerOutage, FaultPlan
from delayq_local.kafka_mock import CONSUMER_TUNING
from delayq_local.observe import DeliveryObserver, Rejection, drain_rejections
from delayq_local.producer import DelayProducer
from delayq_local.reports import export_and_report
from delayq_local.stack import EmbeddedStack, StackConfig
from delayq_local.verdict import DemoReport


@dataclass(frozen=True)
class DemoOptions:
    """The workload's size and shape, and how long to wait for it. `send_seconds`: the
    window the records are written over at a steady rate (0: all at once). `kafka_outage`:
    `(at, seconds)` after the workload starts, every broker is down (added to the stack's
    fault plan, whose timed faults count from the same moment)."""

    messages: int = 2000
    max_delay_seconds: float = 80.0
    send_seconds: float = 40.0
    seed: int = 7
    results: Path = Path("results")
    settle_seconds: float = 5.0
    timeout_seconds: float = 120.0
    cancel_after_seconds: float = 5.0
    kafka_outage: tuple[float, float] | None = None
    # `delayq report`: export the table and run the Spark reports into this folder.
    reports: Path | None = None
    # Requests due hours to days ahead, left pending (for the backlog forecast).
    pending: int = 0


class Progress:
    """A one-line progress bar on a terminal; a line every 10 s otherwise."""

    def __init__(self, out: TextIO, total: int) -> None:
        self._out = out
        self._total = max(1, total)
        self._tty = out.isatty()
        self._last = 0.0

    def update(self, delivered: int, rejected: int, elapsed: float, last_due_in: float) -> None:
        """Redraw (terminal) or print (log) the state."""
        now = time.monotonic()
        if not self._tty and now - self._last < 10:
            return
        self._last = now
        width = 30
        filled = round(width * min(delivered, self._total) / self._total)
        wait = f"last due in {last_due_in:3.0f}s" if last_due_in > 0 else "settling"
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {delivered}/{self._total} delivered"
            f"  {rejected} rejected  {elapsed:4.0f}s  {wait}"
        )
        self._out.write(f"\r{line}" if self._tty else f"{line}\n")
        self._out.flush()

    def close(self) -> None:
        """End the progress line."""
        if self._tty:
            self._out.write("\n")


def run_demo(config: StackConfig, options: DemoOptions, out: TextIO = sys.stderr) -> DemoReport:
    """Start the stack, send the workload, wait for it, and write `demo.json` + the histogram.

    What the handlers print (their logs, Powertools' metrics) goes to `handlers.log` in the
    results folder, so the terminal shows the progress.
    """
    options.results.mkdir(parents=True, exist_ok=True)
    with (
        (options.results / "handlers.log").open("w") as handler_output,
        contextlib.redirect_stdout(handler_output),
        warnings.catch_warnings(),
    ):
        # Powertools warns on every invocation that adds no metric.
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        return _run(config, options, out)


def _with_outage(config: StackConfig, outage: tuple[float, float] | None) -> StackConfig:
    if outage is None:
        return config
    plan = config.faults or FaultPlan()
    return replace(config, faults=replace(plan, timed=(*plan.timed, BrokerOutage(*outage))))


def _run(config: StackConfig, options: DemoOptions, out: TextIO) -> DemoReport:
    started = time.monotonic()
    config = _with_outage(config, options.kafka_outage)
    with EmbeddedStack(config) as stack:
        out.write(
            f"stack up in {time.monotonic() - started:.1f}s: Kafka {stack.kafka_bootstrap}, "
            f"AWS {stack.aws_endpoint_url}\n"
        )
        topics = config.topics or DEFAULT_TARGETS
        tuning = CONSUMER_TUNING if stack.mock_kafka is not None else None
        observer = DeliveryObserver(stack.kafka_bootstrap, topics, tuning).start()
        rejections: list[Rejection] = []
        try:
            workload = Workload.generate(
                int(time.time() * 1000),
                options.messages,
                max_delay_seconds=options.max_delay_seconds,
                seed=options.seed,
                targets=topics,
                send_seconds=options.send_seconds,
                cancel_after_seconds=options.cancel_after_seconds,
                pending=options.pending,
            )
            with DelayProducer(stack.kafka_bootstrap, topic=stack.delay_topic) as producer:
                left = (
                    f" ({len(workload.pending)} due hours to days ahead)" if options.pending else ""
                )
                out.write(
                    f"sending {len(workload.messages)} requests{left}, "
                    f"{len(workload.cancelled)} cancels and {len(workload.invalid)} invalid "
                    f"records to {stack.delay_topic} over {workload.last_send_ms / 1000:.0f} s; "
                    "waiting for the last due time\n"
                )
                sender = Sender(workload, producer).start()
                try:
                    rejections = _wait(
                        stack,
                        workload=workload,
                        sender=sender,
                        observer=observer,
                        options=options,
                        out=out,
                    )
                finally:
                    sender.join()
        finally:
            observer.stop()
        reports = export_and_report(stack, options.reports, out) if options.reports else None
        extra: dict[str, Any] = {
            "duration_seconds": round(time.monotonic() - started, 1),
            "messages_sent": len(workload.messages) + len(workload.invalid),
            "pending": len(workload.pending),
            "time_compression": asdict(config.time) if config.time else None,
            "kafka_outage": options.kafka_outage,
            "unreadable_deliveries": observer.unreadable,
            "observer_rereads": observer.rereads,
            "sources": stack.stats(),
            "faults": stack.faults.counts() if stack.faults else None,
            "reports": reports.index if reports else None,
        }
        iam = ([str(d) for d in stack.iam_denials()], stack.iam.checked if stack.iam else 0)
    deliveries = observer.deliveries()
    report = DemoReport.build(workload, deliveries, rejections, extra, iam)
    report.write(options.results, deliveries)
    return report


def _wait(
    stack: EmbeddedStack,
    *,
    workload: Workload,
    sender: Sender,
    observer: DeliveryObserver,
    options: DemoOptions,
    out: TextIO,
) -> list[Rejection]:
    sqs = stack.client("sqs")
    reject_queue = stack.resource("RejectQueue").ref
    expected = workload.expected
    progress = Progress(out, len(expected))
    begin = workload.start_ms / 1000
    settle_at = workload.last_due_ms / 1000 + options.settle_seconds
    give_up_at = settle_at + options.timeout_seconds
    rejections: list[Rejection] = []
    try:
        while True:
            now = time.time()
            if stack.faults is not None:
                stack.faults.step(stack, now - begin)
            rejections.extend(drain_rejections(sqs, reject_queue))
            seen = {d.delay_id for d in observer.deliveries()}
            delivered = sum(1 for i in expected if i in seen)
            progress.update(delivered, len(rejections), now - begin, settle_at - now)
            complete = delivered == len(expected) and len(rejections) >= len(workload.invalid)
            sent = sender.done.is_set()
            if sender.error is not None:
                return rejections
            if (complete and now >= settle_at and sent) or now >= give_up_at:
                return rejections
            time.sleep(0.5)
    finally:
        if stack.faults is not None:
            stack.faults.restore(stack)
        progress.close()
