"""The demo's verdict: what was expected against what arrived, and how late."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from delayq_local.demo_plan import Workload
from delayq_local.observe import Delivery, Rejection

# Relative due times count from the broker timestamp, a little after the record's planned moment.
DUE_TOLERANCE_MS: Final = 5000
# Requests with a shorter delay spend longer than their delay in the pipeline (the Kafka event
# source's batching window, a cold start): they cannot be on time, so `steady_lateness_ms`
# leaves them out.
STEADY_DELAY_MS: Final = 5000


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True)
class Lateness:
    """Lateness (milliseconds after due) of a set of deliveries."""

    p50: float
    p99: float
    max: float
    count: int
    # Negative when something arrived early (by the clock the values were measured with).
    min: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Lateness:
        """Summarise `values` (milliseconds)."""
        return cls(
            p50=percentile(values, 50),
            p99=percentile(values, 99),
            max=max(values, default=0.0),
            count=len(values),
            min=min(values, default=0.0),
        )


@dataclass(frozen=True)
class DemoReport:
    """The numbers `results/demo.json` carries."""

    expected: int
    delivered: int
    lost: int
    early: int
    duplicates: int
    cancelled: int
    cancelled_honoured: int
    rejected: int
    rejected_expected: int
    rejected_by_reason: Mapping[str, int]
    rejected_wrong_reason: int
    due_mismatches: int
    lateness_ms: Lateness
    steady_lateness_ms: Lateness
    end_to_end_ms: Lateness
    burst: Lateness
    lost_ids: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Seen by the target consumer before due: early in true time (this process's clock), which
    # `early` (the emitter's clock) cannot show when the emitter's clock is ahead.
    early_received: int = 0
    # Deliveries that were not their message's first attempt (`delay-attempt` above 1).
    retried: int = 0
    # Calls the functions made that their roles in the template do not grant (AWS would
    # refuse them), and how many calls were checked.
    iam_denials: tuple[str, ...] = ()
    iam_checked: int = 0

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing early, no call AWS would refuse (what `make demo` exits
        non-zero on)."""
        return self.lost == 0 and self.early == 0 and not self.iam_denials

    @classmethod
    def build(
        cls,
        workload: Workload,
        deliveries: Sequence[Delivery],
        rejections: Sequence[Rejection],
        extra: Mapping[str, Any] | None = None,
        iam: tuple[Sequence[str], int] = ((), 0),
    ) -> DemoReport:
        """Compare the plan with what was observed (`iam`: the refused calls, and how many
        were checked)."""
        expected = workload.expected
        first: dict[str, Delivery] = {}
        for d in deliveries:
            first.setdefault(d.delay_id, d)
        delivered = [first[i] for i in expected if i in first]
        lost = sorted(i for i in expected if i not in first)
        reason_of = {
            r.value.decode(errors="replace"): r.reason for r in rejections if r.value is not None
        }
        return cls(
            expected=len(expected),
            delivered=len(delivered),
            lost=len(lost),
            early=sum(1 for d in deliveries if d.emitted_ms < d.due_ms),
            duplicates=len(deliveries) - len(first),
            cancelled=len(workload.cancelled),
            cancelled_honoured=sum(1 for i in workload.cancelled if i not in first),
            rejected=len(rejections),
            rejected_expected=len(workload.invalid),
            rejected_by_reason=dict(Counter(r.reason for r in rejections)),
            rejected_wrong_reason=sum(
                1 for bad in workload.invalid if reason_of.get(bad.marker) != bad.reason
            ),
            due_mismatches=sum(
                1
                for d in delivered
                if abs(d.due_ms - expected[d.delay_id].due_ms) > DUE_TOLERANCE_MS
            ),
            lateness_ms=Lateness.of([d.emitted_ms - d.due_ms for d in delivered]),
            steady_lateness_ms=Lateness.of(
                [
                    d.emitted_ms - d.due_ms
                    for d in delivered
                    if expected[d.delay_id].delay_ms >= STEADY_DELAY_MS
                ]
            ),
            end_to_end_ms=Lateness.of([d.received_ms - d.due_ms for d in delivered]),
            burst=Lateness.of(
                [d.emitted_ms - d.due_ms for d in delivered if expected[d.delay_id].kind == "burst"]
            ),
            lost_ids=tuple(lost[:20]),
            extra=dict(extra or {}),
            early_received=sum(1 for d in deliveries if d.received_ms < d.due_ms),
            retried=sum(1 for d in deliveries if d.attempt > 1),
            iam_denials=tuple(iam[0]),
            iam_checked=iam[1],
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the documented keys, and the rest)."""
        return asdict(self)

    def write(self, directory: Path, deliveries: Sequence[Delivery]) -> tuple[Path, Path]:
        """Write `demo.json` and the lateness histogram `lateness.png` into `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        summary = directory / "demo.json"
        summary.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        histogram = directory / "lateness.png"
        _histogram([d.emitted_ms - d.due_ms for d in deliveries], self, histogram)
        return summary, histogram

    def lines(self) -> list[str]:
        """The human summary."""
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected_by_reason.items()))
        late = self.lateness_ms
        return [
            f"expected   {self.expected}",
            f"delivered  {self.delivered}   lost {self.lost}   duplicates {self.duplicates}"
            f"   retried {self.retried}",
            f"early      {self.early}   (seen before due by the consumer: {self.early_received})",
            f"cancelled  {self.cancelled}   honoured {self.cancelled_honoured}",
            f"rejected   {self.rejected} of {self.rejected_expected} invalid records"
            f" (wrong or missing reason: {self.rejected_wrong_reason}): {reasons}",
            f"lateness   p50 {late.p50:.0f} ms   p99 {late.p99:.0f} ms   max {late.max:.0f} ms"
            f"   (burst of {self.burst.count}: p99 {self.burst.p99:.0f} ms,"
            f" max {self.burst.max:.0f} ms)",
            f"           delays of {STEADY_DELAY_MS // 1000} s and more: p50 "
            f"{self.steady_lateness_ms.p50:.0f} ms   p99 {self.steady_lateness_ms.p99:.0f} ms"
            f"   max {self.steady_lateness_ms.max:.0f} ms",
            f"consumer   p50 {self.end_to_end_ms.p50:.0f} ms   p99 {self.end_to_end_ms.p99:.0f} ms"
            f"   max {self.end_to_end_ms.max:.0f} ms after due (seen by the target consumer)",
            f"iam        {self.iam_checked} calls checked against the template's roles,"
            f" {len(self.iam_denials)} refused",
            *(f"           refused: {denial}" for denial in self.iam_denials[:10]),
        ]


def _histogram(values: Sequence[float], report: DemoReport, path: Path) -> None:
    import matplotlib  # noqa: PLC0415 (heavy; only the report needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(8, 4.5))
    axes.hist(values or [0], bins=60, color="#4c72b0")
    for name, value, style in (
        ("p50", report.lateness_ms.p50, "--"),
        ("p99", report.lateness_ms.p99, ":"),
    ):
        axes.axvline(value, color="#c44e52", linestyle=style, label=f"{name} {value:.0f} ms")
    axes.set_xlabel("lateness: emitted - due (ms)")
    axes.set_ylabel("messages (log scale)")
    axes.set_yscale("log")
    axes.set_title(
        f"{report.delivered}/{report.expected} delivered, {report.early} early, "
        f"{report.duplicates} duplicates"
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
