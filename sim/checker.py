"""The checker: reads what a run recorded (what producers wrote, what ingest acknowledged,
what reached the target cluster, what sits in the dead-letter destinations) and judges it
against the documented guarantees.

- Nothing lost: every acknowledged delay request is delivered at least once, or sits in a
  dead-letter destination (the delay queue's DLQ, the stream's on-failure destination) with
  its message, whole (an offloaded value's S3 object still there); every acknowledged
  invalid record sits in the reject queue with its reason and original bytes. An
  unreachable target never dead-letters within the outage allowance (24 h).
- Never early: no record is produced before its due time on the producing function's clock
  (its ``delay-emitted-ms`` header against ``delay-due-ms``).
- Sources: every delivery carries the bytes (key, value, user headers) of one delay record
  of its id whose due time (or a reschedule's of it) it was produced for; deliveries are
  matched to their records by those bytes, so two messages sharing id and due time are told
  apart (a delivery of neither, e.g. one with the other's value, is ``corrupt``).
- Cancels: a message a cancel applies to (same id, written before it: by timestamp, then by
  offset on one partition; across partitions a tie goes to the cancel) is not delivered when
  the cancel was acknowledged at least the emitter's hold + 2 s before its due time. Nor is
  it produced more than an invocation's timeout after the cancel was acknowledged: the
  function that produces a message (emitter, or ingest on the direct path) reads the cancel
  markers in the same invocation, so that read came after the cancel (README: a cancel
  ingested before the read always wins). That catches a message that waited, e.g. behind a
  stalled partition, while its cancel came in through another.
  An undelivered message counts as cancelled only when such a cancel was acknowledged
  before the message was due to go out (its last due time + the release slack), or it was
  due near an outage; a cancel acknowledged after that does not excuse its loss.
- Reschedules: one acknowledged that early moves the message: it is delivered at the new
  time and not at the old one; a chain of them (each naming the previous one's new time as
  ``delay-was-due``) moves it to the last. One acknowledged that early, written after what it
  moves was acknowledged and before any cancel of it, is never refused.
- Released when passed: a stored message is delivered within 10 minutes of the first
  scheduler run that passed its release second (its due second, or the later one its
  tenant's release cap gave it: ``delay-release-ms``), or of that time if later, unless the
  target or an ingest partition was down meanwhile; a late capped message the emitter gave a
  new slot (with strict caps) has until 10 minutes after that slot.
- Counted: a period's pending count is at most the records that may be counted in it (a
  capped or deferred tenant's message in the period of its release).
- Duplicates: deliveries of one message beyond the first (they carry its ``delay-id``).
- Integrity: a delivered record has the original key, value and user headers.
- IAM: no call a function (or its event source) made was refused by its role.
- Tenant limits (README, Tenants, limits and priorities), when the run sets them:
  never produced before the release a cap gave a message (``delay-release-ms``); with strict
  caps, no second of a producing function's clock carries more of a capped tenant's messages
  than its cap (each message counted once, by its first delivery: duplicates are
  at-least-once; a reschedule's copy is not counted against the cap, as documented); a
  message rejected as ``quota-exceeded`` belongs to a tenant whose quota rejects, whose
  quota was used up in the second of its record's timestamp (at least that many of the
  tenant's messages written in that second were accepted: a redelivered batch is counted as
  its first attempt was, whatever records it holds), is never also delivered (a deferring
  quota delivers them; no cap in this world is too low to place a message within 7 days)
  and sits in the reject queue with its original bytes. The lateness of a capped or
  deferred tenant's messages counts from their release and is reported apart. With a delay
  queue per priority, every envelope sent to a delay queue went to its priority's queue and
  carries the priority it was written with (a reschedule's copy: its original's).
- Retries: no invocation left a transient error (throttling, a network error, a lost
  response) without calling again, while it had time to.
"""

from __future__ import annotations

import base64
import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from delayq import constants as c
from delayq.envelope import dead_letter_of, decode_body
from delayq.exceptions import EnvelopeError
from delayq.kafka import Failure
from delayq.limits import Limits
from delayq.pending import counts_of, period_of
from delayq.records import DelayRequest, Reason
from delayq.store import request_from_item
from sim.aws import Produced
from sim.functions import TIMEOUT_S
from sim.pipeline import Pipeline
from sim.workload import Intent, Workload

# A cancel or reschedule acknowledged this long before due always wins (README: the
# emitter's hold + 2 s, for clocks that agree within that); the hold comes from the settings,
# and a run whose clocks are further apart widens the window by the difference.
GUARD_MS: Final = 2_000
# A producing invocation reads the cancel markers at most this long before it produces: the
# longest timeout of the functions that produce (ingest's direct path, the emitter), + 2 s.
READ_BOUND_MS: Final = max(TIMEOUT_S["ingest"], TIMEOUT_S["emitter"]) * 1000 + GUARD_MS
# Dead-letter reasons nothing in the simulated world justifies: the target cluster accepts
# every record it can reach, outages are shorter than the 24-hour allowance, payloads are
# deleted only by the bucket's lifecycle rule (sim.aws.LifecycleS3), whose retention outlives
# every run.
UNCAUSED_REASONS: Final = frozenset(
    {
        str(Failure.UNAVAILABLE),
        str(Failure.REFUSED),
        str(Failure.PAYLOAD_MISSING),
        str(Failure.CAP_FULL),
    }
)
# Messages due this soon after an outage ended are counted as the outage's.
OUTAGE_RECOVERY_MS: Final = 10 * 60_000
# A message stored at least this much beyond the horizon at ingest waited in the table.
STORED_MARGIN_MS: Final = 5 * 60_000
# After a scheduler run released a message to the delay queue, the emitter delivers it within
# this (receives, retries after a crash's visibility timeout), the target being up.
RELEASE_SLACK_MS: Final = 10 * 60_000
# Lateness histogram resolution.
BUCKET_MS: Final = 10
# A release cap places a message within this of its due time, or rejects it.
RELEASE_SPREAD_MS: Final = c.MAX_RELEASE_SPREAD_SECONDS * 1000


@dataclass
class Violation:
    """One broken guarantee: what, of which message."""

    # lost, early, cancel, reschedule, corrupt, refused, dead-lettered, iam, unretried, stuck, held,
    # counted, cap, priority, misrouted
    kind: str
    delay_id: str
    due_ms: int
    detail: str


@dataclass
class Verdict:
    """What the checker found in one run."""

    messages: int = 0  # acknowledged delay requests
    delivered: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    rejected: int = 0
    unacknowledged: int = 0
    duplicates: int = 0
    lateness: Counter[int] = field(default_factory=Counter)  # 10 ms buckets of first deliveries
    # The same, of messages due away from the run's long outages (scheduler, target cluster).
    steady_lateness: Counter[int] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    # Tenant limits: messages of capped or deferring tenants delivered, and the lateness of
    # their first deliveries from their release (apart from ``lateness``); requests rejected
    # over their tenant's ingest quota (counted in ``messages``, not in ``rejected``).
    limited: int = 0
    limited_lateness: Counter[int] = field(default_factory=Counter)
    over_quota: int = 0
    # How many acknowledged histories exercised each clause of the contract (coverage_of).
    coverage: Counter[str] = field(default_factory=Counter)


def _user_headers(headers: Any) -> list[tuple[str, bytes | None]]:
    return [(n, v) for n, v in headers if not n.startswith(c.HEADER_PREFIX)]


class Checker:
    """Judges one run."""

    def __init__(self, pipeline: Pipeline, workload: Workload) -> None:
        self.p = pipeline
        self.workload = workload
        self.hold_ms = pipeline.settings.max_hold_ms
        acked = {(a.record["partition"], a.record["offset"]): a.at_ms for a in pipeline.kafka.acked}
        # A record ingest refused and an operator's redrive later had accepted counts from then.
        acked.update(pipeline.operator.redriven)
        self.ack_ms = {id(i): acked.get((i.partition, i.offset)) for i in workload.intents}
        self.deliveries: dict[tuple[str, int], list[Produced]] = defaultdict(list)
        for produced in pipeline.cluster.log:
            delay_id = produced.record.header(c.HEADER_ID)
            due = produced.record.header(c.HEADER_DUE_MS)
            if delay_id is not None and due is not None:
                self.deliveries[(delay_id.decode(), int(due))].append(produced)
        self.dead = self._dead_letters()
        self.rejects = self._rejects()
        self.limits = pipeline.settings.limits
        self.by_key = {(i.delay_id, i.due_ms): i for i in workload.intents if i.kind == "delay"}
        self.sources = self._sources()

    def _sources(self) -> dict[int, Intent]:
        """The delay record each delivery carries the bytes of (by ``id()`` of the delivery):
        one of its id, due at the delivery's due time or moved there, with its key, value and
        user headers. A delivery of none is not in the map."""
        candidates: dict[str, list[Intent]] = defaultdict(list)
        for i in self.workload.intents:
            if i.kind == "delay":
                candidates[i.delay_id].append(i)
        found: dict[int, Intent] = {}
        for (delay_id, _due), produced in self.deliveries.items():
            for d in produced:
                for i in candidates.get(delay_id, []):
                    if _same_bytes(d, i):
                        found[id(d)] = i
                        break
        return found

    def _dead_letters(self) -> dict[tuple[str, int], list[str]]:
        """Dead-lettered messages by ``(id, due)``: the reason of each copy. A copy whose
        value is a pointer to S3 counts only while the object is there (whole bytes); one
        that is not whole, or that gives a reason this world never causes, is a violation
        whether or not another copy was delivered."""
        found: dict[tuple[str, int], list[str]] = defaultdict(list)
        self.dead_letter_faults: list[Violation] = []
        copies: list[tuple[DelayRequest, str]] = []
        for body in self.p.queue_bodies(self.p.settings.delay_dlq_url):
            try:
                entries = decode_body(body)
            except EnvelopeError:
                continue
            for entry in entries:
                if entry.request is not None:
                    reason = (dead_letter_of(entry.text) or {}).get("reason", "max-receives")
                    copies.append((entry.request, str(reason)))
        for record in self.p.stream.failures:
            copies.append((request_from_item(record["dynamodb"]["OldImage"]), "cleanup-failed"))
        for request, reason in copies:
            key = (request.delay_id, request.due_ms)
            if not self._whole(request.payload_ref):
                detail = f"dead-lettered ({reason}) without its value: {request.payload_ref}"
            elif reason in UNCAUSED_REASONS:
                detail = f"dead-lettered as {reason}, which nothing in this world causes"
            else:
                found[key].append(reason)
                continue
            self.dead_letter_faults.append(Violation("dead-lettered", key[0], key[1], detail))
        return found

    def _whole(self, payload_ref: str | None) -> bool:
        """Whether a message's value can still be read (inline, or its S3 object exists)."""
        if not payload_ref:
            return True
        return self.p.payload(payload_ref.removeprefix("s3://").partition("/")[2]) is not None

    def _rejects(self) -> dict[tuple[int, int], tuple[str, dict[str, Any] | None]]:
        found: dict[tuple[int, int], tuple[str, dict[str, Any] | None]] = {}
        for body in self.p.queue_bodies(self.p.settings.reject_queue_url):
            d = json.loads(body)
            source = d.get("source") or {}
            found[(int(source.get("partition", -1)), int(source.get("offset", -1)))] = (
                str(d.get("reason")),
                self.p.rejected_record(body),
            )
        return found

    def run(self) -> Verdict:
        """Every guarantee, over every record of the run."""
        verdict = Verdict()
        by_id: dict[str, list[Intent]] = defaultdict(list)
        for intent in self.workload.intents:
            by_id[intent.delay_id].append(intent)
            if self.ack_ms[id(intent)] is None:
                verdict.unacknowledged += 1
        for intent in self.workload.intents:
            if self.ack_ms[id(intent)] is None:
                continue
            if intent.kind == "invalid":
                self._check_invalid(intent, verdict)
            elif intent.kind == "delay":
                self._check_delay(intent, by_id[intent.delay_id], verdict)
        for key, produced in self.deliveries.items():
            for record in produced:
                self._check_not_early(key, record, verdict)
        verdict.violations.extend(self.dead_letter_faults)
        verdict.violations.extend(self._unsourced())
        for denial in self.p.roles.guard.denials:
            verdict.violations.append(Violation("iam", denial.function, 0, str(denial)))
        for u in self.p.retries.found:
            detail = f"{u.function} never retried {u.call} after {u.error} at {u.at_ms}"
            verdict.violations.append(Violation("unretried", u.function, 0, detail))
        for s in self.p.kafka.stuck:
            detail = f"ingest fails the batch at offset {s.offset} for good: {s.error}"
            verdict.violations.append(Violation("stuck", f"partition {s.partition}", 0, detail))
        verdict.violations.extend(self._overcounted())
        verdict.violations.extend(self._over_cap())
        verdict.violations.extend(self._misrouted())
        verdict.coverage = self.coverage_of(by_id)
        return verdict

    def coverage_of(self, by_id: Mapping[str, list[Intent]]) -> Counter[str]:
        """Per clause of the contract, the acknowledged messages whose history exercised it
        (an id's records, in their order)."""
        found: Counter[str] = Counter()
        threshold = self.p.settings.offload_threshold_bytes
        for intents in by_id.values():
            acked = [i for i in intents if self.ack_ms[id(i)] is not None]
            delays = [i for i in acked if i.kind == "delay"]
            for message in delays:
                later = [i for i in acked if _after(message, i)]
                moves = [i for i in later if i.kind == "reschedule"]
                clauses = {
                    "cancel": any(i.kind == "cancel" for i in later),
                    "reschedule": bool(moves),
                    "reschedule chain": len(moves) > 1,
                    "id reuse": len(delays) > 1,
                    "across partitions": len({i.partition for i in acked}) > 1,
                    "release cap or deferral": self._limited(message),
                    "priority high or low": _priority(message) != c.PRIORITY_NORMAL,
                    "large payload (S3)": len(message.value or b"") > threshold,
                }
                found.update(name for name, hit in clauses.items() if hit)
            found["ingest quota refusal"] += sum(
                1
                for i in delays
                if (refused := self.rejects.get((i.partition, i.offset))) is not None
                and refused[0] == Reason.QUOTA_EXCEEDED
            )
        found["dead letter"] = sum(len(reasons) for reasons in self.dead.values())
        found["redrive"] = self.p.operator.handled
        return found

    # --- priorities -----------------------------------------------------------------------

    def _misrouted(self) -> list[Violation]:
        """With a delay queue per priority, every envelope sent to a delay queue (by ingest,
        the scheduler, the emitter putting one back) went to its priority's queue, and
        carries the priority its record was written with (a reschedule's copy: the one its
        original carries): a high- or normal-priority message never waits behind a low
        burst, and a low one never takes another class's concurrency."""
        s = self.p.settings
        queue_of = {
            c.PRIORITY_HIGH: s.delay_queue_high_url or s.delay_queue_url,
            c.PRIORITY_NORMAL: s.delay_queue_url,
            c.PRIORITY_LOW: s.delay_queue_low_url or s.delay_queue_url,
        }
        # By (id, due): the priorities of every record that may be sent under it (messages
        # reusing an id at one due time may differ; a reschedule's copy: its original's).
        written_as: dict[tuple[str, int], set[str]] = defaultdict(set)
        for i in self.workload.intents:
            if i.kind == "delay":
                written_as[(i.delay_id, i.due_ms)].add(_priority(i))
        for i in self.workload.intents:  # in send order: a chain's copies, their original's
            if i.kind == "reschedule":
                written_as[(i.delay_id, i.due_ms)] |= written_as.get(
                    (i.delay_id, i.was_due_ms), set()
                )
        out = []
        for url, delay_id, due_ms, priority in self.p.delay_sends:
            written = written_as.get((delay_id, due_ms)) or {priority}
            if priority not in written:
                detail = (
                    f"written with priority {' or '.join(sorted(written))}, queued as {priority}"
                )
                out.append(Violation("priority", delay_id, due_ms, detail))
            elif url != queue_of[priority]:
                detail = f"{priority} priority sent to {url}"
                out.append(Violation("misrouted", delay_id, due_ms, detail))
        return out

    # --- tenant limits --------------------------------------------------------------------

    def _limits_of(self, intent: Intent) -> Limits:
        """The limits of a request's tenant (its ``delay-tenant``, else its target topic)."""
        target = dict(intent.headers).get(c.HEADER_TARGET) or b""
        return self.limits.of(intent.tenant or target.decode())

    def _limited(self, intent: Intent) -> bool:
        """Whether its tenant's limits may release it after its due time: a release cap, or
        an ingest quota that defers."""
        limits = self._limits_of(intent)
        return limits.release_per_second is not None or (
            limits.ingest_per_second is not None and limits.defers
        )

    def _check_over_quota(
        self,
        message: Intent,
        record: dict[str, Any] | None,
        delivered: list[Produced],
        verdict: Verdict,
    ) -> None:
        """A request rejected over its tenant's quota is in the reject queue whole, never
        delivered, and its tenant's quota was used up in its record's second."""
        if (
            record is None
            or record.get("value") != base64.b64encode(message.value or b"").decode()
            or record.get("key")
            != (base64.b64encode(message.key).decode() if message.key else None)
        ):
            detail = "rejected over quota, not in the reject queue with its original bytes"
            verdict.violations.append(Violation("lost", message.delay_id, message.due_ms, detail))
            return
        if delivered:
            detail = f"rejected over quota and delivered at {delivered[0].at_ms}"
            verdict.violations.append(
                Violation("refused", message.delay_id, message.due_ms, detail)
            )
            return
        quota = self._limits_of(message).ingest_per_second or 0
        second = message.send_ms // 1000
        accepted = sum(
            1
            for i in self.workload.intents
            if i.kind == "delay"
            and i.tenant == message.tenant
            and i.send_ms // 1000 == second
            and (i.partition, i.offset) not in self.rejects
        )
        if accepted < quota:
            detail = (
                f"rejected over a quota of {quota}/s with {accepted} of its tenant's "
                f"messages written in second {second} accepted"
            )
            verdict.violations.append(
                Violation("refused", message.delay_id, message.due_ms, detail)
            )
            return
        verdict.over_quota += 1

    def _over_cap(self) -> list[Violation]:
        """With strict caps, no second of a producing function's clock carries more of a
        capped tenant's messages than its cap. Each message counts once, in the second of its
        first delivery; a reschedule's copy (not counted against the cap) not at all."""
        if not self.p.settings.strict_caps:
            return []
        seconds: dict[tuple[str, int], list[str]] = defaultdict(list)
        caps: dict[str, int] = {}
        for key, produced in self.deliveries.items():
            intent = self.by_key.get(key)
            if intent is None:
                continue
            cap = self._limits_of(intent).release_per_second
            if cap is None:
                continue
            tenant = intent.tenant or (dict(intent.headers)[c.HEADER_TARGET] or b"").decode()
            first = min(produced, key=lambda d: d.at_ms)
            second = int(first.record.header(c.HEADER_EMITTED_MS) or 0) // 1000
            seconds[(tenant, second)].append(intent.delay_id)
            caps[tenant] = cap
        return [
            Violation(
                "cap",
                ids[0],
                second * 1000,
                f"{len(ids)} of {tenant!r}'s messages produced in second {second} (their "
                f"producers' clocks), cap {caps[tenant]}/s: {', '.join(sorted(ids))}",
            )
            for (tenant, second), ids in sorted(seconds.items())
            if len(ids) > caps[tenant]
        ]

    def _overcounted(self) -> list[Violation]:
        """The pending counts never count a record twice: a period's count is at most the
        delay records released in it plus the reschedules moving a message into it (fewer
        when some went out on the direct path, were cancelled or moved away). A record is
        released at its due time, or, when its tenant's limits may hold it, at the release
        its deliveries carry; one whose release is not known (not delivered, or delivered
        with several) may be counted in any period it may be released in."""
        bound: Counter[tuple[int, int]] = Counter()
        unsure: list[tuple[Intent, set[int]]] = []
        for i in self.workload.intents:
            if i.kind == "reschedule" or (i.kind == "delay" and not self._limited(i)):
                bound[period_of(i.due_ms, i.send_ms)] += 1
            elif i.kind == "delay":
                produced = self.deliveries.get((i.delay_id, i.due_ms), [])
                releases = {_release_ms(d, i.due_ms) for d in produced}
                if len(releases) == 1:
                    bound[period_of(releases.pop(), i.send_ms)] += 1
                else:
                    unsure.append((i, releases))
        counted: Counter[tuple[int, int]] = Counter()
        # What the table holds at the end and what TTL deleted before it (a long run outlives
        # its counts): each item's records were counted in it and nowhere else.
        table = self.p.dynamodb.items(self.p.settings.table_name)
        for item in [*table, *self.p.ttl.deleted_items]:
            if item.get("kind", {}).get("S") == c.KIND_PENDING:
                for count in counts_of(item):
                    counted[(count.minute, count.minutes)] += count.total
        return [
            Violation(
                "counted",
                "",
                period[0] * 60_000,
                f"{n} counted pending for {period[1]} min, {bound[period]} records due",
            )
            for period, n in sorted(counted.items())
            if n > bound[period] + sum(1 for i, r in unsure if _may_count(i, r, period))
        ]

    # --- rules ----------------------------------------------------------------------------

    def _check_invalid(self, intent: Intent, verdict: Verdict) -> None:
        found = self.rejects.get((intent.partition, intent.offset))
        original = base64.b64encode(intent.value or b"").decode()
        if found is None or found[1] is None or found[1].get("value") != original:
            verdict.violations.append(
                Violation(
                    "lost", intent.delay_id, 0, "invalid record not in the reject queue whole"
                )
            )
            return
        verdict.rejected += 1

    def _check_delay(self, message: Intent, same_id: list[Intent], verdict: Verdict) -> None:
        verdict.messages += 1
        refused = self.rejects.get((message.partition, message.offset))
        if refused is not None and refused[0] == Reason.QUOTA_EXCEEDED:
            limits = self._limits_of(message)
            if limits.ingest_per_second is not None and not limits.defers:
                delivered = [
                    d
                    for d in self.deliveries.get((message.delay_id, message.due_ms), [])
                    if self.sources.get(id(d)) is message
                ]
                self._check_over_quota(message, refused[1], delivered, verdict)
                return
        if refused is not None:
            detail = f"a valid request rejected: {refused[0]}"
            verdict.violations.append(
                Violation("refused", message.delay_id, message.due_ms, detail)
            )
            return
        later = [i for i in same_id if _after(message, i) and self.ack_ms[id(i)] is not None]
        cancels = [i for i in later if i.kind == "cancel"]
        dues = [message.due_ms, *self._moves(message, later, cancels, verdict)]
        delivered = [
            d
            for due in dues
            for d in self.deliveries.get((message.delay_id, due), [])
            if self.sources.get(id(d)) is message
        ]
        self._check_one_time(message, delivered, verdict)
        if any(self._early_enough(cancel, min(dues)) for cancel in cancels):
            verdict.cancelled += 1
            for d in delivered:
                detail = f"delivered at {d.at_ms} after a timely cancel"
                verdict.violations.append(
                    Violation("cancel", message.delay_id, message.due_ms, detail)
                )
        elif delivered:
            self._delivered(message, delivered, verdict)
            if not later:
                self._check_released(message, min(delivered, key=lambda d: d.at_ms), verdict)
            acks = [ack for ack in (self.ack_ms[id(cancel)] for cancel in cancels) if ack]
            for d in delivered:
                if acks and min(acks) <= d.at_ms - READ_BOUND_MS:
                    detail = f"produced at {d.at_ms}, over an invocation after its cancel's ack"
                    verdict.violations.append(
                        Violation("cancel", message.delay_id, message.due_ms, detail)
                    )
        elif any(self._before_release(cancel, max(dues)) for cancel in cancels):
            verdict.cancelled += 1  # a late cancel may or may not win
        elif any(self.dead.get((message.delay_id, due)) for due in dues):
            verdict.dead_lettered += 1
        else:
            detail = "acknowledged, never delivered, not dead-lettered"
            verdict.violations.append(Violation("lost", message.delay_id, message.due_ms, detail))

    def _moves(
        self, message: Intent, later: list[Intent], cancels: list[Intent], verdict: Verdict
    ) -> list[int]:
        """The due times reschedules moved ``message`` to, in a chain (each names the time the
        one before moved it to); a delivery at an old time after a timely reschedule is a
        violation, and so is a timely reschedule refused although what it moves waited in the
        store (README, Limits), was acknowledged before the reschedule was written, and no
        cancel came first."""
        moved: list[int] = []
        current, since = message.due_ms, self.ack_ms[id(message)] or 0
        horizon_ms = self.p.settings.horizon_seconds * 1000
        for move in sorted(later, key=_order):
            if move.kind != "reschedule" or move.was_due_ms != current:
                continue
            ack = self.ack_ms[id(move)] or 0
            refused = self.rejects.get((move.partition, move.offset))
            if refused is not None:
                cancelled = bool(cancels)  # refused or not, the message is not delivered
                stored = current - since > horizon_ms + STORED_MARGIN_MS
                # The contract: what it moves was acknowledged before the reschedule was written
                # (a record it depends on, read later from another partition, leaves it refused).
                before = since <= move.send_ms
                if self._early_enough(move, current) and stored and before and not cancelled:
                    detail = f"a timely reschedule from {current} refused: {refused[0]}"
                    verdict.violations.append(
                        Violation("reschedule", message.delay_id, message.due_ms, detail)
                    )
                if (
                    refused[0] == Reason.RESCHEDULE_NOT_FOUND
                    and self.p.kafka.attempts[(move.partition, move.offset)] > 1
                ):
                    # Ingested again (a redelivered or retried batch) after the version it
                    # moves was stored: a later attempt may have applied it (README, Reschedule).
                    moved.append(move.due_ms)
                continue
            moved.append(move.due_ms)
            old_due, current, since = current, move.due_ms, ack
            if self._early_enough(move, old_due):
                for old in self.deliveries.get((message.delay_id, old_due), []):
                    if self.sources.get(id(old)) is not message:
                        continue
                    detail = (
                        f"delivered at the old time ({old.at_ms}) after a reschedule "
                        f"acknowledged at {self.ack_ms[id(move)]}"
                    )
                    verdict.violations.append(
                        Violation("reschedule", message.delay_id, old_due, detail)
                    )
        return moved

    def _delivered(self, message: Intent, delivered: list[Produced], verdict: Verdict) -> None:
        """Count a delivered message: duplicates, lateness of the first copy, integrity."""
        verdict.delivered += 1
        verdict.duplicates += len(delivered) - 1
        first = min(delivered, key=lambda d: d.at_ms)
        due = int(first.record.header(c.HEADER_DUE_MS) or 0)
        if self._limited(message):
            verdict.limited += 1
            bucket = max(0, first.at_ms - _release_ms(first, due)) // BUCKET_MS
            verdict.limited_lateness[bucket] += 1
        else:
            bucket = max(0, first.at_ms - due) // BUCKET_MS
            verdict.lateness[bucket] += 1
            if not self._near_outage(due):
                verdict.steady_lateness[bucket] += 1

    def _unsourced(self) -> list[Violation]:
        """Deliveries that carry the bytes of no delay record of their id (a changed key,
        value or user headers; another message's value)."""
        return [
            Violation(
                "corrupt",
                delay_id,
                due,
                f"produced by {d.function} at {d.at_ms} with bytes no record of its id has",
            )
            for (delay_id, due), produced in self.deliveries.items()
            for d in produced
            if id(d) not in self.sources
        ]

    def _check_released(self, message: Intent, first: Produced, verdict: Verdict) -> None:
        """A stored message goes out soon after a scheduler run passes its release second
        (its due second, or the slot its tenant's cap gave it): the run released it to the
        delay queue, and nothing but the target, the emitter or (for a message late at the
        emitter) its cap's next free second can hold it after that (not TTL, nor the safety
        net's redrive)."""
        ack = self.ack_ms[id(message)]
        horizon_ms = self.p.settings.horizon_seconds * 1000
        if ack is None or message.due_ms - ack <= horizon_ms + STORED_MARGIN_MS:
            return  # not stored (or not surely): ingest queued it itself
        first_ms = first.at_ms
        release_ms = _release_ms(first, message.due_ms)
        second = release_ms // 1000
        passed = [
            run.ended_ms
            for run in self.p.ticks.runs
            if run.started_ms >= ack and run.watermark >= second
        ]
        if not passed:
            return
        released_ms = min(passed)
        deadline_ms = max(release_ms, released_ms) + RELEASE_SLACK_MS
        paced_ms = self.p.paced.get((message.delay_id, message.due_ms))
        if paced_ms is not None:  # late at the emitter: it took a new slot, perhaps held
            deadline_ms = max(deadline_ms, paced_ms + RELEASE_SLACK_MS) + self.hold_ms
        if first_ms <= deadline_ms:
            return
        stalls = [(since, until) for _, since, until in self.p.kafka.stalls]
        for start, end in [*self.p.cluster.outages, *stalls]:
            if start <= first_ms and end + OUTAGE_RECOVERY_MS >= released_ms - horizon_ms:
                return  # the target (or a partition) was down meanwhile
        detail = (
            f"a scheduler run released its second by {released_ms}, first delivered at {first_ms}"
        )
        verdict.violations.append(Violation("held", message.delay_id, message.due_ms, detail))

    def _near_outage(self, due_ms: int) -> bool:
        """Due while the scheduler, the target or an ingest partition was stalled, or while
        they caught up."""
        horizon_ms = self.p.settings.horizon_seconds * 1000
        stalls = [(since, until) for _, since, until in self.p.kafka.stalls]
        outages = [self.p.ticks.down, *self.p.cluster.outages, *stalls]
        return any(
            start - horizon_ms <= due_ms <= end + OUTAGE_RECOVERY_MS
            for start, end in outages
            if end
        )

    def _before_release(self, cancel: Intent, due_ms: int) -> bool:
        """Acknowledged before a message due at ``due_ms`` had to go out (or it was due near
        an outage, when it may wait longer)."""
        ack = self.ack_ms[id(cancel)]
        return ack is not None and (
            ack <= due_ms + RELEASE_SLACK_MS + self.hold_ms or self._near_outage(due_ms)
        )

    def _check_one_time(self, message: Intent, delivered: list[Produced], verdict: Verdict) -> None:
        """A reschedule moves a message or not: its deliveries all carry one due time."""
        times = sorted({int(d.record.header(c.HEADER_DUE_MS) or 0) for d in delivered})
        if len(times) > 1:
            detail = f"delivered at more than one of its times: {times}"
            verdict.violations.append(Violation("reschedule", message.delay_id, times[0], detail))

    def _early_enough(self, control: Intent, due_ms: int) -> bool:
        """Acknowledged at least the emitter's hold + 2 s before ``due_ms``."""
        ack = self.ack_ms[id(control)]
        return ack is not None and ack <= due_ms - self.hold_ms - GUARD_MS - self.p.clock_offset_ms

    def _check_not_early(self, key: tuple[str, int], produced: Produced, verdict: Verdict) -> None:
        emitted = produced.record.header(c.HEADER_EMITTED_MS)
        release = _release_ms(produced, key[1])
        if emitted is None or int(emitted) < release:
            verdict.violations.append(
                Violation(
                    "early",
                    key[0],
                    key[1],
                    f"produced by {produced.function} at {emitted!r} (its clock), due {key[1]}, "
                    f"released at {release}",
                )
            )

    # --- reporting ------------------------------------------------------------------------

    def story(self, delay_id: str) -> list[str]:
        """Everything the run recorded about one id, in time order (for a failing seed)."""
        lines: list[tuple[int, str]] = []
        for intent in self.workload.intents:
            if intent.delay_id != delay_id:
                continue
            ack = self.ack_ms[id(intent)]
            what = f"{intent.kind} written (partition {intent.partition}, offset {intent.offset})"
            if intent.kind in ("delay", "reschedule"):
                what += f", due {intent.due_ms}"
            lines.append((intent.send_ms, what))
            lines.append(
                (
                    ack or 0,
                    f"  {intent.kind} acknowledged"
                    if ack
                    else f"  {intent.kind} never acknowledged",
                )
            )
        for (did, due), produced in self.deliveries.items():
            if did == delay_id:
                for d in produced:
                    emitted = d.record.header(c.HEADER_EMITTED_MS)
                    lines.append(
                        (d.at_ms, f"produced by {d.function} (due {due}, emitted {emitted!r})")
                    )
        for (did, due), reasons in self.dead.items():
            if did == delay_id:
                lines.append((due, f"dead-lettered (due {due}): {', '.join(reasons)}"))
        return [f"{t} {text}" for t, text in sorted(lines)]


def _same_bytes(produced: Produced, intent: Intent) -> bool:
    """Whether a delivery carries a delay record's key, value and user headers."""
    record = produced.record
    return (
        record.value == intent.value
        and record.key == intent.key
        and _user_headers(record.headers) == _user_headers(intent.headers)
    )


def _order(intent: Intent) -> tuple[int, int, int]:
    """A record's place in the delay topic's order: timestamp, then partition and offset."""
    return (intent.send_ms, intent.partition, intent.offset)


def _after(first: Intent, then: Intent) -> bool:
    """Whether ``then`` was written after ``first`` (README, What a cancel applies to): by
    timestamp; on one millisecond by offset on one partition, and across partitions a
    control wins the tie."""
    if then.send_ms != first.send_ms:
        return then.send_ms > first.send_ms
    if then.partition == first.partition:
        return then.offset > first.offset
    return then.kind in ("cancel", "reschedule") and first.kind == "delay"


def _priority(intent: Intent) -> str:
    """The priority a delay record was written with (normal without the header)."""
    value = dict(intent.headers).get(c.HEADER_PRIORITY)
    return value.decode() if value is not None else c.PRIORITY_NORMAL


def _release_ms(produced: Produced, due_ms: int) -> int:
    """When a delivered record was free to go: its due time, or the later release its
    tenant's cap gave it (``delay-release-ms``)."""
    return max(due_ms, int(produced.record.header(c.HEADER_RELEASE_MS) or 0))


def _may_count(intent: Intent, releases: set[int], period: tuple[int, int]) -> bool:
    """Whether a limited message may be counted in ``period``: at one of ``releases``, or
    (none known) at any time from its due time to the farthest a cap may place it."""
    if releases:
        return any(period_of(r, intent.send_ms) == period for r in releases)
    start = period[0] * 60_000
    low = max(intent.due_ms, start)
    high = min(intent.due_ms + RELEASE_SPREAD_MS, start + period[1] * 60_000 - 1)
    # The period's length changes with how far ahead it was sent (pending.period_of): where
    # it may change within [low, high], both sides are tried.
    turns = [intent.send_ms + ahead + d for ahead in (3_600_000, 86_400_000) for d in (0, 1)]
    return any(
        period_of(t, intent.send_ms) == period for t in (low, high, *turns) if low <= t <= high
    )
