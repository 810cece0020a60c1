"""The `delayq` commands that talk to Kafka only: `send`, `cancel`, `reschedule` (write to the
delay topic) and `tail` (read the target topics).

They find the cluster through `--bootstrap`, `$DELAYQ_KAFKA_BOOTSTRAP` or the running
`delayq local` (its state file), and take librdkafka settings with `-X key=value` as kcat does
(`-X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=...`), or
sign in to Amazon MSK with IAM (`--msk-iam`: OAUTHBEARER tokens signed with the caller's AWS
credentials, as the emitter signs its own), so that they reach a deployed cluster too.

Exit status: 0 done; 1 `tail --count N` ended before N deliveries; 2 usage or configuration
errors (no cluster, a target the running stack does not allow, an unknown topic).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

import boto3

from delayq import constants as c
from delayq.kafka import TokenProvider, msk_iam_token
from delayq.settings import topic_allowed
from delayq_local.exceptions import LocalStackError
from delayq_local.lookup import Whereabouts, waiting
from delayq_local.producer import Acknowledged, DelayProducer, Due
from delayq_local.state import allowed_targets, read_state
from delayq_local.tail import Tail, choose_topics
from delayq_local.timefmt import iso_ms

DEFAULT_TOPIC: Final = "delay-requests"


# What the stack's table says of an id before a cancel (None: no table to read), or why not.
LookUp = Callable[[argparse.Namespace, str], Whereabouts | None]
# Whether the stack's ingest keeps the id index (None: the variables cannot say).
IndexKept = Callable[[argparse.Namespace], bool | None]


def register(
    commands: Any, look_up: LookUp | None = None, index_kept: IndexKept | None = None
) -> None:
    """Add `send`, `cancel`, `reschedule` and `tail` to the `delayq` parser; `look_up` reads
    what was waiting before a cancel, `index_kept` whether a reschedule without `--due` can
    be found (both on the CLI's stack choice)."""
    send = commands.add_parser(
        "send",
        help="produce one delay request",
        description="Prints the request's delay id (the one given, else the record's "
        "coordinates topic-partition-offset, which ingest uses) and where it was written. "
        "A target the running `delayq local` does not allow is refused before anything is "
        "written (exit 2); --no-check writes it anyway (ingest then rejects it).",
    )
    _client_options(send)
    send.add_argument("--target", required=True, help="the topic to deliver to")
    when = send.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=float, help="seconds from now (the broker timestamp)")
    when.add_argument("--delay-ms", type=int, help="milliseconds from now")
    when.add_argument("--at", type=epoch_ms, help="absolute time: epoch ms or ISO 8601")
    send.add_argument("--key", help="record key (UTF-8)")
    send.add_argument("--value", default="", help="record value (UTF-8)")
    send.add_argument("--id", dest="delay_id", help="delay id (the cancel key)")
    send.add_argument(
        "--header",
        action="append",
        default=[],
        type=header,
        metavar="NAME=VALUE",
        help="a user header (repeatable)",
    )
    send.add_argument(
        "--no-check", action="store_true", help="skip the allow-list check of the target"
    )
    send.set_defaults(command=_send)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a pending request by its id",
        description="Writes a delay-cancel record: it wins over every message with that id "
        "ingested before it. With the stack's id index (IdIndex=1, on in `delayq local`), it "
        "first reads which messages with the id wait and says so; without it, that cannot be "
        "known here.",
    )
    _client_options(cancel)
    cancel.add_argument("delay_id", metavar="ID")
    cancel.add_argument(
        "--stack-name", help="a deployed stack whose table to read (default: `delayq local`)"
    )
    cancel.set_defaults(command=functools.partial(_cancel, look_up=look_up))

    _add_reschedule(commands, index_kept)
    _add_tail(commands)


def _client_options(parser: argparse.ArgumentParser, *, writes: bool = True) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: "
        "$DELAYQ_KAFKA_BOOTSTRAP, else the running `delayq local`)",
    )
    parser.add_argument(
        "-X",
        dest="kafka_config",
        action="append",
        default=[],
        type=header,
        metavar="KEY=VALUE",
        help="a librdkafka setting, as kcat takes it (repeatable)",
    )
    parser.add_argument(
        "--msk-iam",
        action="store_true",
        help="authenticate to Amazon MSK with IAM (SASL_SSL, OAUTHBEARER tokens signed with "
        "your AWS credentials; port 9098)",
    )
    parser.add_argument(
        "--region", help="the MSK cluster's region, for --msk-iam (default: boto3's)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    if writes:
        parser.add_argument("--topic", help=f"the delay topic (default: {DEFAULT_TOPIC})")


def _add_reschedule(commands: Any, index_kept: IndexKept | None) -> None:
    """`delayq reschedule ID (--at T | --delay S) [--due OLD]`."""
    move = commands.add_parser(
        "reschedule",
        help="move a pending request to another time by its id",
        description="Writes a delay-reschedule record. Ingest moves the message stored for "
        "--due (without it: the message it finds by id, when the stack keeps the id index, "
        "IdIndex=1, as `delayq local` does) to the new time, or rejects the record "
        "(reschedule-not-found, reschedule-cancelled, reschedule-too-late, missing-due) to the "
        "reject queue.",
    )
    _client_options(move)
    move.add_argument("delay_id", metavar="ID")
    new_time = move.add_mutually_exclusive_group(required=True)
    new_time.add_argument("--at", type=epoch_ms, help="new time: epoch ms or ISO 8601")
    new_time.add_argument("--delay", type=float, help="new time: seconds from now")
    move.add_argument(
        "--due",
        type=epoch_ms,
        help="the message's current due time (epoch ms or ISO 8601); without it, ingest finds "
        "the message by its id (the stack's id index): refused, unwritten, on a stack known "
        "to keep no index",
    )
    move.add_argument(
        "--stack-name", help="a deployed stack whose settings to check (default: `delayq local`)"
    )
    move.set_defaults(command=functools.partial(_reschedule, index_kept=index_kept))


def _add_tail(commands: Any) -> None:
    tail = commands.add_parser(
        "tail",
        help="show deliveries on the target topics as they happen",
        description="One line per delivery: when it was emitted, topic[partition]@offset, id, "
        "due time, lateness (emitted - due) and attempt. Default topics: those of the cluster "
        "the running stack may deliver to (its allow-list), else every topic but the delay "
        "topic and Kafka's internal ones. Exit status 1 when --count deliveries were not seen "
        "within --seconds.",
    )
    _client_options(tail, writes=False)
    tail.add_argument("topics", nargs="*", metavar="TOPIC", help="the topics to read")
    tail.add_argument(
        "--from-beginning", action="store_true", help="read what the topics hold already"
    )
    tail.add_argument("--count", type=int, metavar="N", help="stop after N deliveries")
    tail.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds")
    tail.set_defaults(command=_tail)


# Where the cluster is ----------------------------------------------------------------------


def _cluster(args: argparse.Namespace) -> tuple[str, dict[str, Any], Mapping[str, Any]]:
    """(bootstrap, the `-X` settings, the running local stack's state when that is the
    cluster, else {})."""
    state = read_state()
    bootstrap = (
        args.bootstrap or os.environ.get(c.ENV_KAFKA_BOOTSTRAP) or state.get("kafka_bootstrap")
    )
    if not bootstrap:
        raise LocalStackError(
            "no Kafka bootstrap: pass --bootstrap, set DELAYQ_KAFKA_BOOTSTRAP, "
            "or start `delayq local`"
        )
    local = bootstrap == state.get("kafka_bootstrap")
    config: dict[str, Any] = {k: v.decode() for k, v in args.kafka_config}
    if args.msk_iam:
        config.update(msk_iam_config(args.region))
    return str(bootstrap), config, state if local else {}


def msk_iam_config(
    region: str | None, token_provider: TokenProvider = msk_iam_token
) -> dict[str, Any]:
    """librdkafka settings that sign in to MSK with IAM: the caller's credentials sign each
    token (aws-msk-iam-sasl-signer-python, as the emitter's role does)."""
    region = region or boto3.session.Session().region_name
    if not region:
        raise LocalStackError("--msk-iam needs a region: pass --region or set AWS_REGION")

    def oauth_cb(_: Any) -> tuple[str, float]:
        token, expiry_ms = token_provider(region)
        return token, expiry_ms / 1000

    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": oauth_cb}


def _producer(args: argparse.Namespace) -> tuple[DelayProducer, Mapping[str, Any]]:
    bootstrap, config, state = _cluster(args)
    topic = args.topic or state.get("delay_topic", DEFAULT_TOPIC)
    return DelayProducer(bootstrap, topic=topic, config=config), state


def _report(args: argparse.Namespace, fields: Mapping[str, Any], text: str) -> None:
    print(json.dumps(fields, sort_keys=True) if args.json else text)


def _where(ack: Acknowledged) -> str:
    return f"{ack.topic}[{ack.partition}]@{ack.offset}"


# The commands ------------------------------------------------------------------------------


def _send(args: argparse.Namespace) -> int:
    producer, state = _producer(args)
    allowed = allowed_targets(state)
    if allowed and not args.no_check and not topic_allowed(args.target, allowed):
        producer.close()
        raise LocalStackError(
            f"target {args.target} is not allowed by the running stack (AllowedTargets: "
            f"{','.join(allowed)}): ingest would reject it as target-not-allowed; nothing "
            "was written (--no-check writes it anyway)"
        )
    due = Due(seconds=args.delay, ms=args.delay_ms, at_ms=args.at)
    with producer:
        producer.send(
            args.target,
            due,
            value=args.value.encode(),
            key=args.key.encode() if args.key is not None else None,
            delay_id=args.delay_id,
            headers=args.header,
        )
    [ack] = producer.acknowledged
    delay_id = args.delay_id or ack.coordinates
    due_ms = due.due_ms(ack.timestamp_ms)
    _report(
        args,
        {
            "id": delay_id,
            "target": args.target,
            "topic": ack.topic,
            "partition": ack.partition,
            "offset": ack.offset,
            "due_ms": due_ms,
        },
        f"sent {delay_id} to {_where(ack)}: for {args.target}, due {iso_ms(due_ms)} "
        f"(--due {due_ms})",
    )
    return 0


def _cancel(args: argparse.Namespace, *, look_up: LookUp | None = None) -> int:
    found, why = None, "no stack table to read"
    if look_up is not None:
        try:
            found = look_up(args, args.delay_id)
        except LocalStackError as e:
            why = str(e)
    now_ms = time.time_ns() // 1_000_000
    waits = waiting(found, now_ms) if found is not None and found.located else None
    producer, _ = _producer(args)
    with producer:
        producer.cancel(args.delay_id)
    [ack] = producer.acknowledged
    if waits:
        said = f"it stops {len(waits)} message(s) waiting when it was sent, due " + ", ".join(
            iso_ms(w.due_ms) for w in waits
        )
    elif found is not None and found.located:
        said = "no indexed message with this id was waiting when it was sent"
    elif found is not None:
        said = "whether a message was waiting is unknown: no message with this id is indexed"
    else:
        said = f"whether a message was waiting is unknown ({why})"
    _report(
        args,
        {
            "id": args.delay_id,
            "topic": ack.topic,
            "partition": ack.partition,
            "offset": ack.offset,
            "waiting_due_ms": [w.due_ms for w in waits] if waits is not None else None,
        },
        f"cancel for {args.delay_id} written to {_where(ack)}: it wins over every message "
        f"with that id ingested before it; {said}",
    )
    return 0


def _reschedule(args: argparse.Namespace, *, index_kept: IndexKept | None = None) -> int:
    due = Due(seconds=args.delay, at_ms=args.at)
    kept = index_kept(args) if index_kept is not None and args.due is None else None
    if kept is False:
        raise LocalStackError(
            f"the stack keeps no id index ({c.ENV_ID_INDEX}=0, the template's IdIndex): "
            "ingest could not find the message by id alone; pass --due (its current due "
            "time, as `delayq send` printed it); nothing written"
        )
    producer, _ = _producer(args)
    with producer:
        producer.reschedule(args.delay_id, args.due, due)
    [ack] = producer.acknowledged
    _report(
        args,
        {
            "id": args.delay_id,
            "topic": ack.topic,
            "partition": ack.partition,
            "offset": ack.offset,
            "was_due_ms": args.due,
            "at_ms": args.at,
            "delay_seconds": args.delay,
        },
        f"reschedule for {args.delay_id} written to {_where(ack)}: the message "
        + (
            f"due at {iso_ms(args.due)}"
            if args.due is not None
            else "ingest finds by its id"
            + ("" if kept else " (if the stack keeps the id index, else missing-due)")
        )
        + " moves to "
        + (iso_ms(args.at) if args.at is not None else f"{args.delay:g}s from now")
        + " if ingest records it at least the emitter's hold + 2 s before that; otherwise "
        "the record goes to the reject queue with its reason",
    )
    return 0


def _tail(args: argparse.Namespace) -> int:
    bootstrap, config, state = _cluster(args)
    existing = [] if args.topics else Tail.existing_topics(bootstrap, config)
    topics = choose_topics(
        existing,
        explicit=args.topics,
        allowed=allowed_targets(state),
        exclude=[state.get("delay_topic", DEFAULT_TOPIC)],
    )
    if not topics:
        raise LocalStackError("nothing to tail: no topic given and no target topic found")
    # The mock cluster answers fetches only when fetch.wait.max.ms expires: its tuning first.
    config = {**(state.get("kafka_consumer_config") or {}), **config}
    tail = Tail(bootstrap, topics, from_beginning=args.from_beginning, config=config).start()
    if not args.json:
        print(f"tailing {', '.join(topics)} (Ctrl-C stops)", file=sys.stderr, flush=True)
    until = time.monotonic() + args.seconds if args.seconds is not None else None
    seen = 0
    try:
        for delivery in tail.follow(until):
            print(json.dumps(delivery.as_json()) if args.json else delivery.line(), flush=True)
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        tail.close()
    if tail.unreadable:
        print(f"{tail.unreadable} record(s) without delivery headers", file=sys.stderr)
    if args.count is not None and seen < args.count:
        print(f"{seen} of {args.count} deliveries seen", file=sys.stderr)
        return 1
    return 0


# Argument types ----------------------------------------------------------------------------


def header(text: str) -> tuple[str, bytes]:
    """`NAME=VALUE` as a header (or a `-X` setting)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value.encode()


def epoch_ms(text: str) -> int:
    """Epoch milliseconds, or ISO 8601 with its time zone."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not epoch ms or ISO 8601: {text!r}") from e
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time zone (e.g. 2026-01-01T12:00:00+00:00)")
    return int(moment.timestamp() * 1000)
