"""The operator: ``delayq redrive`` at arbitrary times of a run (``Knobs.redrive``).

Each run redrives the reject queue (records ingest refused, ingested again under the same
settings: an invalid record goes back with its reason, a quota refusal counts against the
counters of its record's second again, a refused control is tried again) and then the delay
queue's dead-letter queue (messages the emitter gave up on, sent back to the delay queue), as
the command line does, through the same faulty clients, from an environment of its own (an
operator's machine: no role limits its calls). The records a run received from the reject
queue and that are not on it when the run ends were accepted by ingest: ``redriven`` keeps
when, so that the checker judges them from then (a control redriven late is a late control)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from delayq.settings import Settings
from delayq_local.redrive import RedriveServices, RedriveSource, redrive
from sim.faults import Knobs
from sim.functions import Container, Functions
from sim.world import Invocation, World

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

# Runs per run of the simulation when the knob draws one; the share of them while records
# are written and due.
MAX_RUNS = 3
BUSY = 0.7


class Operator:
    """Runs ``delayq redrive`` when the plan says; ``redriven``: ``(partition, offset)`` of
    each reject-queue record a run moved back into the pipeline, and when; ``handled``: the
    messages the runs dealt with (moved, or refused again)."""

    def __init__(
        self,
        world: World,
        *,
        knobs: Knobs,
        settings: Settings,
        functions: Functions,
        bodies: Callable[[str], list[str]],
        clients: Callable[[Container], tuple[Any, Any]],
    ) -> None:
        self.world = world
        self.knobs = knobs
        self.settings = settings
        self.functions = functions
        self._bodies = bodies
        self._clients = clients
        self.redriven: dict[tuple[int, int], int] = {}
        self.handled = 0  # messages the runs took from a queue and dealt with

    def plan(self, start_ms: int, busy_until_ms: int, end_ms: int) -> None:
        """Draw this run's redrives (on a random stream of their own) between ``start_ms``
        and ``end_ms``, most of them while records are written and due (to
        ``busy_until_ms``)."""
        draw = self.world.stream("operator")
        if self.knobs.redrive <= 0 or draw.random() >= self.knobs.redrive:
            return
        for _ in range(draw.randint(1, MAX_RUNS)):
            until = busy_until_ms if draw.random() < BUSY else end_ms
            self.world.at(draw.randint(start_ms, max(start_ms, until)), self._run)

    def _run(self) -> None:
        self.world.faults["redrive"] += 1
        taken: set[tuple[int, int]] = set()

        def body(cn: Container, _invocation: Invocation) -> None:
            sqs, s3 = self._clients(cn)
            services = RedriveServices(
                sqs=cast("SQSClient", _Receipts(sqs, self.settings.reject_queue_url, taken)),
                s3=s3,
                ingest=cn.ingest_services(),
            )
            for source, url in (
                (RedriveSource.REJECTS, self.settings.reject_queue_url),
                (RedriveSource.DELAY_DLQ, self.settings.delay_dlq_url),
            ):
                report = redrive(
                    source,
                    settings=self.settings,
                    services=services,
                    source_url=url,
                    wait_seconds=0,
                    clock=cn.clock,
                    sleep=self.world.sleep,
                )
                self.handled += report.handled
                self.world.note(f"redrive {source}: {report.as_dict()}")

        def done(ok: bool) -> None:
            now = self.world.now_ms
            left = {_coordinates(b) for b in self._bodies(self.settings.reject_queue_url)}
            for coordinates in taken - left:
                self.redriven.setdefault(coordinates, now)
            if not ok:  # the operator runs it again a little later
                self.world.at(
                    now + self.world.stream("operator").randint(60_000, 600_000), self._run
                )

        self.functions.invoke("operator", body, done)


def _coordinates(body: str) -> tuple[int, int]:
    """``(partition, offset)`` of the record a reject-queue body holds."""
    source = json.loads(body).get("source") or {}
    return int(source.get("partition", -1)), int(source.get("offset", -1))


class _Receipts:
    """An SQS client that notes the records it receives from the reject queue."""

    def __init__(self, client: Any, url: str, taken: set[tuple[int, int]]) -> None:
        self._client = client
        self._url = url
        self._taken = taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def receive_message(self, **kwargs: Any) -> Any:
        response = self._client.receive_message(**kwargs)
        if kwargs.get("QueueUrl") == self._url:
            self._taken.update(_coordinates(m["Body"]) for m in response.get("Messages", []))
        return response
