"""The workload of one seeded run: what producers write to the delay topic, and when.

Delays across both paths and the horizon boundary (due now or past, within the direct window,
seconds, minutes, either side of 15 minutes, hours; in some runs days, up to the maximum
delay), same-second bursts (some written over their second, record by record), cancels before and
after delivery, ids reused after a cancel, reschedules earlier and later, values large enough
to be offloaded to S3 and records exactly at the payload limit, and invalid records.

The contract's corners (weights drawn per seed, ``Shape.contract``): records of one id on
either partition (not only ``partition_of``), so a partition that stalls ingests them out of
order; an id reused after a cancel in the same due-second or at exactly the same due time
(other values, large ones too); chains of controls per id (reschedule after reschedule, cancel
and reschedule in both orders), in one event-source batch (milliseconds apart) or across; and
controls near the cutoffs (the emitter's hold, the horizon).

With tenant limits (``Shape.limits``) the run also sets ``DELAYQ_TENANT_LIMITS`` (drawn per
seed): a tenant whose release cap binds on every burst of it, one with an ingest quota whose
excess is rejected, one whose excess is deferred (and that is capped too); messages of those
tenants and of none (their target topic, unlimited), at mixed priorities.
"""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from delayq import constants as c
from testkit.events import header, kafka_record

TARGETS: Final = ("orders.timeout", "reminders")
FORBIDDEN_TARGET: Final = "payments.internal"
LARGE_BYTES: Final = 250_000  # over the 200 KB offload threshold
HORIZON_MS: Final = 900_000
DIRECT_WINDOW_MS: Final = c.DEFAULT_DIRECT_WINDOW_MS  # ingest delivers these itself
PARTITIONS: Final = 2  # of the delay topic
# The tenants of a run with limits ("": no delay-tenant header, so its target topic: unlimited).
CAPPED: Final = "bulk"
METERED: Final = "metered"  # over its ingest quota: rejected
DEFERRED: Final = "deferred"  # over its ingest quota: deferred
TENANTS: Final = (CAPPED, METERED, DEFERRED, "")

Kind = Literal["delay", "cancel", "reschedule", "invalid"]


@dataclass(frozen=True)
class Shape:
    """How much and what mix one run writes."""

    messages: int = 300
    window_ms: int = 20 * 60_000
    max_delay_ms: int = 2 * 3_600_000
    # Of runs: some of their messages (long_delay of them) wait hours to days, up to the
    # deployed maximum delay (MaxDelaySeconds: 7 days, less the clocks' margin), so TTL,
    # payload lifecycles and marker lifetimes meet real lifetimes.
    long_runs: float = 0.15
    long_delay: float = 0.05
    longest_delay_ms: int = 7 * 86_400_000 - 10 * 60_000
    burst_size: int = 25
    # Of bursts: written over one second (each record at its own millisecond, so the event
    # source's first batch may hold part of one, and its retry more), not all at once.
    burst_spread: float = 0.5
    cancel: float = 0.08
    direct_cancel: float = 0.3  # of messages for the direct path
    reuse_after_cancel: float = 0.35
    reschedule: float = 0.08
    large: float = 0.05
    at_limit: float = 0.01  # values making the record exactly the payload limit (1 MiB)
    invalid: float = 0.03
    # Tenant limits (release caps, ingest quotas) and priorities: see the module's docstring.
    limits: bool = False
    # The contract's corners; each weight is scaled per seed by a draw in [0, 2).
    contract: bool = True
    cross_partition: float = 0.15  # a record of an id written to the other partition
    same_due_reuse: float = 0.5  # of reuses after a cancel: same due-second (half: same due)
    chain: float = 0.5  # of controlled messages: a second control follows the first
    one_batch: float = 0.5  # of chained controls: milliseconds apart (one batch)
    near_cutoff: float = 0.3  # of reschedules: acknowledged around the hold or the horizon
    extra_controls: float = (
        0.06  # of stored messages: a reschedule (chainable) beyond ``reschedule``
    )


@dataclass
class Intent:
    """One record a producer writes, and what it means."""

    kind: Kind
    send_ms: int
    delay_id: str
    partition: int
    headers: list[tuple[str, bytes]]
    key: bytes | None = None
    value: bytes | None = None
    due_ms: int = 0  # a delay's due time; a reschedule's new due time
    was_due_ms: int = 0  # a reschedule's old due time
    offset: int = -1  # given by the broker
    tenant: str = ""  # its delay-tenant header (a delay; "": none)

    def record(self) -> dict[str, Any]:
        """The record as the Kafka event source shows it (offset and partition added on write)."""
        return kafka_record(
            offset=self.offset,
            partition=self.partition,
            timestamp=self.send_ms,
            key=self.key,
            value=self.value,
            headers=[header(name, value) for name, value in self.headers],
        )


@dataclass
class Workload:
    """Every record of the run, in send order."""

    intents: list[Intent] = field(default_factory=list)
    limits: str = ""  # the run's DELAYQ_TENANT_LIMITS (empty: none)

    @property
    def last_due_ms(self) -> int:
        """The latest due time asked for (old or new)."""
        return max((max(i.due_ms, i.was_due_ms, i.send_ms) for i in self.intents), default=0)


def partition_of(delay_id: str) -> int:
    """Keyed by id, as a producer keyed by id would write (one id, one partition)."""
    return zlib.crc32(delay_id.encode()) % PARTITIONS


def tenant_limits(rng: random.Random) -> str:
    """A run's ``DELAYQ_TENANT_LIMITS``: caps of a few messages a second, so that every burst
    of a capped tenant (``Shape.burst_size`` in one second) is spread over many."""
    return json.dumps(
        {
            CAPPED: {"release_per_second": rng.randint(1, 3)},
            METERED: {"ingest_per_second": rng.randint(1, 3)},
            DEFERRED: {
                "ingest_per_second": rng.randint(1, 2),
                "over_quota": "defer",
                "release_per_second": rng.randint(2, 4),
            },
        },
        sort_keys=True,
    )


def generate(rng: random.Random, start_ms: int, shape: Shape) -> Workload:
    """The records of one run (deterministic for a given ``rng`` state)."""
    out: list[Intent] = []
    counter = 0

    def new_id() -> str:
        nonlocal counter
        counter += 1
        return f"m-{counter}"

    def delay(
        send_ms: int,
        due_ms: int,
        delay_id: str,
        *,
        relative: bool = False,
        tenant: str = "",
        partition: int | None = None,
    ) -> Intent:
        draw = rng.random()
        large = draw < shape.large
        at_limit = draw >= 1 - shape.at_limit
        value = rng.randbytes(LARGE_BYTES if large else rng.randint(1, 600))
        headers = [
            (c.HEADER_TARGET, rng.choice(TARGETS).encode()),
            (c.HEADER_ID, delay_id.encode()),
        ]
        if relative:
            headers.append((c.HEADER_DELAY_MS, str(due_ms - send_ms).encode()))
        else:
            headers.append((c.HEADER_DELIVER_AT, str(due_ms).encode()))
        if shape.limits:
            headers += _tenant_headers(rng, tenant)
        headers.append(("trace", rng.randbytes(8).hex().encode()))
        key = delay_id.encode() if rng.random() < 0.8 else None
        if at_limit:  # key + value + user headers exactly at the limit ingest accepts
            user = sum(len(n) + len(v) for n, v in headers if not n.startswith("delay-"))
            value = rng.randbytes(c.DEFAULT_MAX_PAYLOAD_BYTES - len(key or b"") - user)
        return Intent(
            "delay",
            send_ms,
            delay_id,
            partition_of(delay_id) if partition is None else partition,
            headers,
            key,
            value,
            due_ms,
            tenant=tenant,
        )

    # Draws added later come from a generator of their own: the main stream stays as it was.
    spread = random.Random(repr(rng.getstate()))

    def delay_ms() -> int:
        return _wait(rng, shape)

    made = 0
    while made < shape.messages:
        send_ms = start_ms + rng.randint(0, shape.window_ms)
        if rng.random() < 0.02:  # a burst: many messages due in the same second
            due_ms = send_ms + max(0, delay_ms())
            second_ms = due_ms - due_ms % 1000
            tenant = rng.choice(TENANTS) if shape.limits else ""
            burst = [
                delay(send_ms, second_ms + rng.randint(0, 999), new_id(), tenant=tenant)
                for _ in range(shape.burst_size)
            ]
            if spread.random() < shape.burst_spread:
                _over_its_second(burst, spread)
            out.extend(burst)
            made += shape.burst_size
            continue
        if rng.random() < shape.invalid:
            out.append(_invalid(rng, send_ms, new_id()))
            made += 1
            continue
        wait = delay_ms()  # a relative delay is never negative (the contract refuses it)
        message = delay(
            send_ms,
            send_ms + wait,
            new_id(),
            relative=wait >= 0 and rng.random() < 0.3,
            tenant=rng.choice(TENANTS) if shape.limits else "",
        )
        out.append(message)
        made += 1
        _controls(rng, shape, message, out, delay)
    if spread.random() < shape.long_runs:
        _lengthen(out, spread, shape)
    # The corners draw from their own generator, so that the rest of the mix is the same as
    # without them (a seed's older findings still reproduce).
    corners = _Corners(random.Random(repr(rng.getstate())), shape, delay)
    return Workload(corners.follow_all(out), tenant_limits(rng) if shape.limits else "")


def _over_its_second(burst: list[Intent], rng: random.Random) -> None:
    """Write a burst record by record over the second it was sent in."""
    for message in burst:
        message.send_ms += rng.randrange(1000) - message.send_ms % 1000


def _lengthen(out: list[Intent], rng: random.Random, shape: Shape) -> None:
    """Make ``long_delay`` of the messages no control names yet wait hours to days (the
    corners may then add controls to them)."""
    seen = Counter(i.delay_id for i in out)
    for message in out:
        if message.kind != "delay" or seen[message.delay_id] > 1:
            continue
        if rng.random() >= shape.long_delay:
            continue
        message.due_ms = message.send_ms + rng.randint(shape.max_delay_ms, shape.longest_delay_ms)
        message.headers = [
            (c.HEADER_DELIVER_AT, str(message.due_ms).encode())
            if name in {c.HEADER_DELIVER_AT, c.HEADER_DELAY_MS}
            else (name, value)
            for name, value in message.headers
        ]


def _wait(rng: random.Random, shape: Shape) -> int:
    """A delay: due already, within the direct window, seconds, minutes, either side of the
    horizon, hours."""
    band = rng.random()
    if band < 0.05:
        return -rng.randint(0, 5_000)  # due already
    if band < 0.17:
        return rng.randint(0, DIRECT_WINDOW_MS)  # the direct window
    if band < 0.37:
        return rng.randint(1_000, 60_000)
    if band < 0.55:
        return rng.randint(60_000, HORIZON_MS - 40_000)
    if band < 0.67:
        return rng.randint(HORIZON_MS - 20_000, HORIZON_MS + 20_000)  # the boundary
    return rng.randint(HORIZON_MS + 20_000, shape.max_delay_ms)


def _invalid(rng: random.Random, send_ms: int, delay_id: str) -> Intent:
    """A record ingest rejects: a target off the allow-list, or a due time that is no number."""
    bad_target = rng.random() < 0.5
    headers = [
        (c.HEADER_TARGET, (FORBIDDEN_TARGET if bad_target else TARGETS[0]).encode()),
        (c.HEADER_ID, delay_id.encode()),
        (c.HEADER_DELIVER_AT, (str(send_ms + 5_000) if bad_target else "soon").encode()),
    ]
    return Intent(
        "invalid", send_ms, delay_id, partition_of(delay_id), headers, None, rng.randbytes(40)
    )


def _tenant_headers(rng: random.Random, tenant: str) -> list[tuple[str, bytes]]:
    """A message's tenant and priority headers: the capped tenant's at low priority, the
    others at any (normal when the header is left out)."""
    headers = [(c.HEADER_TENANT, tenant.encode())] if tenant else []
    priority = "low" if tenant == CAPPED else rng.choice(("high", "normal", "normal", "low"))
    if priority != "normal" or rng.random() < 0.5:
        headers.append((c.HEADER_PRIORITY, priority.encode()))
    return headers


def _controls(
    rng: random.Random, shape: Shape, message: Intent, out: list[Intent], delay: Any
) -> None:
    """Cancels, id reuse and reschedules that follow ``message``."""
    wait = message.due_ms - message.send_ms
    p = message.partition
    direct = 0 <= wait <= DIRECT_WINDOW_MS
    if rng.random() < (shape.direct_cancel if direct else shape.cancel):
        band = rng.random()
        if direct and band < 0.6:
            # Right behind a message for the direct path: ingest holds it up to its due time,
            # or finds it past due when its partition stalled while the cancel went through.
            cancel_ms = message.send_ms + rng.randint(1, 400)
        elif wait > 20_000 and band < 0.4:
            cancel_ms = message.send_ms + rng.randint(1_000, wait // 2)  # well before due
        elif wait > 20_000 and band < 0.7:
            cancel_ms = message.due_ms - rng.randint(5_500, 12_000)  # just inside the guarantee
        else:
            cancel_ms = max(message.due_ms, message.send_ms) + rng.randint(5_000, 60_000)  # after
        headers = [(c.HEADER_CANCEL, message.delay_id.encode())]
        # A producer not keyed by id may write the cancel to another partition.
        where = p if rng.random() < 0.5 else (p + 1) % PARTITIONS
        out.append(Intent("cancel", cancel_ms, message.delay_id, where, headers, None, None))
        if rng.random() < shape.reuse_after_cancel:
            send_ms = cancel_ms + rng.randint(1, 5_000)
            again = delay(
                send_ms,
                send_ms + rng.randint(2_000, 1_800_000),
                message.delay_id,
                tenant=message.tenant,
            )
            if again.due_ms != message.due_ms:
                out.append(again)
        return
    if wait > HORIZON_MS + 15 * 60_000 and rng.random() < shape.reschedule:
        latest = message.due_ms - HORIZON_MS - 5 * 60_000  # still waiting in the store
        moved_ms = rng.randint(message.send_ms + 1_000, latest)
        new_due = moved_ms + (
            rng.randint(2_000, 60_000)
            if rng.random() < 0.3
            else rng.randint(HORIZON_MS + 60_000, 3_600_000)
        )
        if new_due == message.due_ms:
            return
        headers = [
            (c.HEADER_RESCHEDULE, message.delay_id.encode()),
            (c.HEADER_WAS_DUE, str(message.due_ms).encode()),
            (c.HEADER_DELIVER_AT, str(new_due).encode()),
        ]
        out.append(
            Intent(
                "reschedule",
                moved_ms,
                message.delay_id,
                p,
                headers,
                None,
                None,
                new_due,
                message.due_ms,
            )
        )


class _Corners:
    """The contract's corners that follow a message (see the module's docstring)."""

    def __init__(self, rng: random.Random, shape: Shape, delay: Any) -> None:
        self.rng = rng
        self.delay = delay
        # Per seed: some seeds lean hard on one corner, others leave it out.
        self.on = shape.contract
        self.w: dict[str, float] = {
            name: min(1.0, getattr(shape, name) * rng.uniform(0, 2))
            for name in (
                "cross_partition",
                "same_due_reuse",
                "chain",
                "one_batch",
                "near_cutoff",
                "extra_controls",
            )
        }
        self.hold_ms = c.DEFAULT_MAX_HOLD_MS

    def chance(self, name: str) -> bool:
        """Whether this seed takes the corner ``name`` this time."""
        return self.rng.random() < self.w[name]

    def where(self, delay_id: str) -> int:
        """An id's partition, or (``cross_partition``) the other one."""
        p = partition_of(delay_id)
        return (p + 1) % PARTITIONS if self.chance("cross_partition") else p

    def follow_all(self, out: list[Intent]) -> list[Intent]:
        """``out`` with the corners of its delay records added, in send order; an id the mix
        already controls or reuses is left alone (its controls would name stale due times)."""
        seen = Counter(i.delay_id for i in out)
        for message in [i for i in out if i.kind == "delay" and seen[i.delay_id] == 1]:
            self.follow(message, out)
        out.sort(key=lambda i: i.send_ms)
        return out

    def follow(self, message: Intent, out: list[Intent]) -> None:
        """Maybe move ``message``'s partition, and add controls and reuses of its id."""
        if not self.on:
            return
        rng = self.rng
        message.partition = self.where(message.delay_id)
        wait = message.due_ms - message.send_ms
        if wait <= DIRECT_WINDOW_MS + 20_000 or not self.chance("extra_controls"):
            return
        if rng.random() < 0.35:
            self.cancel_and_reuse(message, out)
        else:
            self.reschedules(message, out)

    def cancel_and_reuse(self, message: Intent, out: list[Intent]) -> None:
        """Cancel, then send the id again due in the same second or at the same due time (a
        new message), perhaps large, perhaps on the other partition."""
        rng = self.rng
        # Milliseconds apart (one batch, perhaps ingested out of order), or seconds apart.
        most = 30 if self.chance("one_batch") else 3_000
        cancel_ms = message.send_ms + rng.randint(1, most)
        headers = [(c.HEADER_CANCEL, message.delay_id.encode())]
        out.append(
            Intent("cancel", cancel_ms, message.delay_id, self.where(message.delay_id), headers)
        )
        send_ms = cancel_ms + rng.randint(1, most)
        same = self.chance("same_due_reuse")
        due_ms = message.due_ms
        if not same:
            due_ms = due_ms - due_ms % 1000 + rng.randint(0, 999)  # the same due-second
        again = self.delay(
            send_ms,
            max(due_ms, send_ms),
            message.delay_id,
            tenant=message.tenant,
            partition=self.where(message.delay_id),
        )
        out.append(again)
        if rng.random() < (0.6 if same else 0.3):  # both offloaded, with other values
            message.value = rng.randbytes(LARGE_BYTES)
            again.value = rng.randbytes(LARGE_BYTES)

    def reschedules(self, message: Intent, out: list[Intent]) -> None:
        """A reschedule, then perhaps another of the new time, or a cancel (either order);
        milliseconds apart (one batch) or seconds apart."""
        rng = self.rng
        first_ms = self.control_ms(message)
        if first_ms is None:
            return
        new_due = first_ms + rng.randint(HORIZON_MS // 3, 2 * HORIZON_MS)
        move = self.reschedule(message, first_ms, message.due_ms, new_due)
        if not self.chance("chain"):
            out.append(move)
            return
        gap = rng.randint(1, 40) if self.chance("one_batch") else rng.randint(500, 30_000)
        second_ms = first_ms + gap
        then = rng.random()
        if then < 0.6:  # reschedule after reschedule: the moved one, by its new time
            again = self.reschedule(
                message,
                second_ms,
                new_due,
                second_ms + rng.randint(HORIZON_MS // 3, 2 * HORIZON_MS),
            )
            out += [move, again]
            return
        cancel = Intent(
            "cancel",
            first_ms if then < 0.8 else second_ms,
            message.delay_id,
            self.where(message.delay_id),
            [(c.HEADER_CANCEL, message.delay_id.encode())],
        )
        move.send_ms = second_ms if then < 0.8 else first_ms  # cancel first, or move first
        out += [move, cancel]

    def control_ms(self, message: Intent) -> int | None:
        """When the first control is written: near a cutoff (the hold before due, the horizon
        before due), or anywhere well before due."""
        rng = self.rng
        wait = message.due_ms - message.send_ms
        if self.chance("near_cutoff"):
            edge = (
                self.hold_ms + 2_000
                if rng.random() < 0.5 or wait < HORIZON_MS + 5_000
                else HORIZON_MS
            )
            at = message.due_ms - edge + rng.randint(-3_000, 3_000)
        else:
            at = message.send_ms + rng.randint(1_000, max(1_000, wait - 20_000))
        return at if at > message.send_ms else None

    def reschedule(self, message: Intent, send_ms: int, was_due: int, new_due: int) -> Intent:
        """A reschedule of ``message`` from ``was_due`` to ``new_due``."""
        headers = [
            (c.HEADER_RESCHEDULE, message.delay_id.encode()),
            (c.HEADER_WAS_DUE, str(was_due).encode()),
            (c.HEADER_DELIVER_AT, str(new_due).encode()),
        ]
        return Intent(
            "reschedule",
            send_ms,
            message.delay_id,
            self.where(message.delay_id),
            headers,
            None,
            None,
            new_due,
            was_due,
        )
