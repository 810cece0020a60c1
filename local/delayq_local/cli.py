"""The `delayq` command: run the local stack, run the demo, redrive dead letters; the commands
that only talk to Kafka (send, cancel, reschedule, tail) are in `kafka_commands`."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from delayq import constants as c
from delayq.clock import Clock, Sleep, system_clock
from delayq.exceptions import ConfigurationError, DelayQueueError
from delayq.retry import Deadline
from delayq.runtime import client, message_store, pending_counts
from delayq.settings import Settings, topic_allowed
from delayq_local import deploy_init, kafka_commands
from delayq_local.aws import AwsEndpoint
from delayq_local.demo import DemoOptions, run_demo
from delayq_local.demo_plan import DEFAULT_TARGETS
from delayq_local.exceptions import LocalStackError
from delayq_local.kafka_commands import epoch_ms, header
from delayq_local.kafka_mock import CONSUMER_TUNING
from delayq_local.lookup import Whereabouts, locate
from delayq_local.pending_view import PERIOD_MINUTES, pending_report
from delayq_local.redrive import RedriveReport, RedriveSource, redrive, redrive_services
from delayq_local.reject_listing import list_rejects
from delayq_local.reports import require_spark
from delayq_local.source_queue import SourceQueue
from delayq_local.stack import EmbeddedStack, StackConfig, TimeCompression, environ_during
from delayq_local.state import allowed_targets, export_line, read_state, state_file, write_state
from delayq_local.stream_failures import FAILED_BATCH_PREFIX

# How often a running redrive reports its progress.
PROGRESS_SECONDS: Final = 2.0
# How long `delayq get` may take for its reads.
GET_SECONDS: Final = 30.0
# The template's outputs a redrive reads (the ingest function's environment has the rest).
DELAY_DLQ_OUTPUT: Final = "DelayDeadLetterQueueUrl"
INGEST_FUNCTION_OUTPUT: Final = "IngestFunctionName"
# What ingest writes to, so what a redrive needs whatever its source.
# `delayq report`'s own folder: `delayq demo` writes into results/ itself, never in here.
REPORT_RESULTS: Final = Path("results/report")
# Requests `delayq report` leaves pending, so that the backlog forecast has something to show.
REPORT_PENDING: Final = 40
REDRIVE_VARIABLES: Final = (
    c.ENV_TABLE_NAME,
    c.ENV_DELAY_QUEUE_URL,
    c.ENV_REJECT_QUEUE_URL,
    c.ENV_PAYLOAD_BUCKET,
)


def main(
    argv: Sequence[str] | None = None,
    *,
    clock: Clock = system_clock,
    sleep: Sleep = time.sleep,
) -> int:
    """Entry point of the `delayq` console script; returns the exit status (2: usage or
    configuration). ``clock`` and ``sleep`` pace `redrive --rate`."""
    parser = _parser(clock, sleep)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except (LocalStackError, ConfigurationError) as e:
        print(f"delayq: {e}", file=sys.stderr)
        return 2


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line as `main` reads it."""
    return _parser(system_clock, time.sleep).parse_args(argv)


def _parser(clock: Clock, sleep: Sleep) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delayq",
        description="The Kafka delay queue, locally: stack, requests, demo; and redrive.",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    local = commands.add_parser("local", help="run the embedded stack in the foreground")
    _stack_options(local, log_level="WARNING")
    local.add_argument(
        "--json", action="store_true", help="print the stack's state (and its counters) as JSON"
    )
    local.set_defaults(command=_local)

    _workload_commands(commands)

    kafka_commands.register(commands, look_up=_look_up, index_kept=_index_kept)
    deploy_init.register(commands)

    again = commands.add_parser(
        "redrive",
        help="move dead-lettered messages back into the pipeline",
        description="delay-dlq: envelopes the emitter failed to deliver go back to the delay "
        "queue. rejects: rejected records are ingested again under the current settings "
        "(those still invalid go back with their new reason). cleanup-failures: the stream "
        "batches the cleanup function gave up on (in the payload bucket) go to the delay "
        "queue; --limit counts batches. Exit status: 0, 1 when a "
        "message failed (it stays on the source) or the run broke off, 2 for usage or "
        "configuration errors.",
    )
    again.add_argument(
        "source", choices=[str(s) for s in RedriveSource], help="the queue to move out of"
    )
    again.add_argument(
        "--queue-url",
        help=f"the queue to read (default: the stack's {DELAY_DLQ_OUTPUT} output for "
        f"delay-dlq, {c.ENV_REJECT_QUEUE_URL} for rejects)",
    )
    again.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="read at most N source messages (a bundle counts as one; default: all)",
    )
    again.add_argument(
        "--rate",
        type=float,
        metavar="MSGS_PER_SECOND",
        help="at most this many moves per second (default: no limit)",
    )
    again.add_argument("--dry-run", action="store_true", help="read and classify, write nothing")
    again.add_argument("--json", action="store_true", help="print the report as JSON")
    again.add_argument(
        "--wait",
        type=int,
        default=1,
        metavar="SECONDS",
        help="long polling per receive; the run ends on an empty one (default: %(default)s)",
    )
    _stack_choice(again)
    again.set_defaults(command=functools.partial(_redrive, clock=clock, sleep=sleep))

    rejects = commands.add_parser(
        "rejects",
        help="what the reject queue holds",
        description="list: each rejected record's reason, detail, coordinates, id and decoded "
        "headers. Messages are received hidden for 30 s and made visible again at once: "
        "nothing is consumed. Exit status: 0, 2 for usage or configuration errors.",
    )
    rejects_commands = rejects.add_subparsers(required=True, metavar="ACTION")
    listing = rejects_commands.add_parser("list", help="show what the reject queue holds")
    listing.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N (default: %(default)s)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    _stack_choice(listing)
    listing.set_defaults(command=_rejects_list)

    get = commands.add_parser(
        "get",
        help="say where a message is, by id",
        description="Reads the id's cancel and reschedule record and, with the id index "
        "(IdIndex=1, on in `delayq local`), every message ingest stored or queued with the id: "
        "due and release times, waiting or sent to the delay queue, dropped by a cancel or "
        "reschedule (strongly consistent). Without the index, --due finds the message stored "
        "for that due time. What cannot be known is said: delivered or rejected. Exit status: "
        "0 when the table knows the id, 1 when it does not, 2 for usage or configuration errors.",
    )
    get.add_argument("delay_id", metavar="ID")
    get.add_argument(
        "--due",
        type=epoch_ms,
        help="its due time (epoch ms or ISO 8601), to find it stored without the id index",
    )
    get.add_argument("--json", action="store_true", help="print the answer as JSON")
    _stack_choice(get)
    get.set_defaults(command=_get)

    pending = commands.add_parser(
        "pending",
        help="count what waits, per minute, hour or day and target",
        description="Counts of the messages waiting for each period from now on, stored and "
        "queued, from the counts ingest keeps (one Query per day, no table scan), with the "
        "scheduler's progress and the delay queues' approximate depth. Exit status: 0, 2 for "
        "usage or configuration errors (a stack that keeps no counts: PendingCounts=0).",
    )
    pending.add_argument(
        "--by", choices=list(PERIOD_MINUTES), default="hour", help="default: %(default)s"
    )
    pending.add_argument("--target", help="only this target topic")
    pending.add_argument(
        "--days", type=_days, default=7, help="how far ahead, 1-14 (default: %(default)s)"
    )
    pending.add_argument("--json", action="store_true", help="print the answer as JSON")
    _stack_choice(pending)
    pending.set_defaults(command=functools.partial(_pending, clock=clock))
    return parser


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, not {text!r}") from e
    if not 1 <= days <= 14:
        raise argparse.ArgumentTypeError(f"--days must be 1..14, not {days}")
    return days


def _stack_choice(parser: argparse.ArgumentParser) -> None:
    """`--stack-name` and `--region`: which stack an AWS-side command works on."""
    where = parser.add_argument_group(
        "stack",
        "default: the running `delayq local` (its state file), else the DELAYQ_* variables "
        "of the environment (those the ingest function has); set variables win over the "
        "state file",
    )
    where.add_argument(
        "--stack-name",
        help="a deployed stack: queues from its outputs, settings from its ingest function",
    )
    where.add_argument("--region", help="the stack's region (default: boto3's, e.g. AWS_REGION)")


def _workload_commands(commands: Any) -> None:
    """`delayq demo` and `delayq report`: a workload on the embedded stack."""
    demo = commands.add_parser("demo", help="run a mixed workload end to end and report")
    _stack_options(demo, log_level="ERROR")
    demo.add_argument(
        "--messages",
        type=int,
        default=DemoOptions.messages,
        help="records to send (default: %(default)s)",
    )
    demo.add_argument(
        "--max-delay",
        type=float,
        default=DemoOptions.max_delay_seconds,
        help="longest delay in seconds (default: %(default)s)",
    )
    demo.add_argument(
        "--send-seconds",
        type=float,
        default=DemoOptions.send_seconds,
        help="write the records at a steady rate over this many seconds, the burst at once "
        "in the middle; 0 writes everything at once (default: %(default)s)",
    )
    demo.add_argument("--seed", type=int, default=DemoOptions.seed)
    demo.add_argument(
        "--results",
        type=Path,
        default=DemoOptions.results,
        help="where demo.json and lateness.png go (default: %(default)s)",
    )
    demo.add_argument(
        "--kafka-outage",
        metavar="AT:SECONDS",
        type=_outage,
        help="take the mock brokers down AT seconds in, for SECONDS",
    )
    demo.set_defaults(command=_demo)

    report = commands.add_parser(
        "report",
        help="run a small workload, export the table and run the Spark reports on it",
    )
    _stack_options(report, log_level="ERROR")
    report.add_argument("--messages", type=int, default=300, help="default: %(default)s")
    report.add_argument("--max-delay", type=float, default=60.0, help="default: %(default)s")
    report.add_argument("--send-seconds", type=float, default=10.0, help="default: %(default)s")
    report.add_argument(
        "--pending",
        type=int,
        default=REPORT_PENDING,
        help="more requests, due 1 hour to 3 days ahead: left pending for the backlog "
        "forecast (default: %(default)s)",
    )
    report.add_argument("--seed", type=int, default=DemoOptions.seed)
    report.add_argument(
        "--results",
        type=Path,
        default=REPORT_RESULTS,
        help="where demo.json, lateness.png and the reports (index.html, delivery/, backlog/) "
        "go; not the demo's folder (default: %(default)s)",
    )
    report.set_defaults(command=_report)


def _stack_options(parser: argparse.ArgumentParser, log_level: str) -> None:
    group = parser.add_argument_group("stack")
    group.add_argument(
        "--project-root",
        type=Path,
        default=Path(),
        help="where template.yaml and functions/ are (default: .)",
    )
    group.add_argument("--template", type=Path, help="default: <project-root>/template.yaml")
    group.add_argument("--stack-name", default="delayq-local")
    group.add_argument("--region", default="us-east-1")
    group.add_argument(
        "--aws-endpoint",
        help="an AWS endpoint instead of the embedded moto (default: $AWS_ENDPOINT_URL if set)",
    )
    group.add_argument(
        "--localstack",
        action="store_true",
        help="use LocalStack ($LOCALSTACK_ENDPOINT or localstack-client's)",
    )
    group.add_argument("--kafka-bootstrap", help="a Kafka cluster instead of the mock one")
    group.add_argument("--brokers", type=int, default=1, help="mock cluster brokers")
    group.add_argument("--partitions", type=int, default=3, help="partitions per created topic")
    group.add_argument(
        "--allowed-targets",
        default="demo.*",
        help="the AllowedTargets parameter (default: %(default)s)",
    )
    group.add_argument(
        "--topic",
        action="append",
        dest="topics",
        help=f"a target topic to create (default: {', '.join(DEFAULT_TARGETS)})",
    )
    group.add_argument(
        "--parameter",
        action="append",
        default=[],
        type=header,
        metavar="NAME=VALUE",
        help="a template parameter override",
    )
    group.add_argument(
        "--env",
        action="append",
        default=[],
        type=header,
        metavar="NAME=VALUE",
        help="a handler environment override",
    )
    group.add_argument("--log-level", default=log_level, help="the handlers' LOG_LEVEL")
    group.add_argument(
        "--shards",
        type=int,
        default=StackConfig.shards,
        help="DELAYQ_SHARDS (default %(default)s: moto scans the table per "
        "query; 0 keeps the template's)",
    )
    group.add_argument(
        "--emitter-concurrency",
        type=int,
        help="emitter execution environments (default: the template's "
        "MaximumConcurrency, at most 16)",
    )
    time = parser.add_argument_group("time compression (AWS: 900 / 840 / 60 / 86400)")
    time.add_argument("--no-compression", action="store_true", help="keep the template's periods")
    time.add_argument("--horizon", type=int, default=TimeCompression.horizon_seconds)
    time.add_argument("--lookahead", type=int, default=TimeCompression.lookahead_seconds)
    time.add_argument("--tick", type=int, default=TimeCompression.tick_seconds)
    time.add_argument("--ttl-grace", type=int, default=TimeCompression.ttl_grace_seconds)


def _stack_config(args: argparse.Namespace) -> StackConfig:
    byte_pairs: list[tuple[str, bytes]] = args.parameter
    env_pairs: list[tuple[str, bytes]] = args.env
    return StackConfig(
        project_root=args.project_root,
        template=args.template,
        stack_name=args.stack_name,
        region=args.region,
        aws_endpoint=args.aws_endpoint,
        localstack=args.localstack,
        kafka_bootstrap=args.kafka_bootstrap,
        kafka_brokers=args.brokers,
        topic_partitions=args.partitions,
        topics=tuple(args.topics or DEFAULT_TARGETS),
        parameters={"AllowedTargets": args.allowed_targets}
        | {k: v.decode() for k, v in byte_pairs},
        environment={"LOG_LEVEL": args.log_level} | {k: v.decode() for k, v in env_pairs},
        time=None
        if args.no_compression
        else TimeCompression(args.horizon, args.lookahead, args.tick, args.ttl_grace),
        concurrency=(
            {"EmitterFunction": args.emitter_concurrency} if args.emitter_concurrency else {}
        ),
        shards=args.shards or None,
    )


def _local(args: argparse.Namespace) -> int:
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    started = time.monotonic()
    with EmbeddedStack(_stack_config(args)) as stack:
        state = _describe(stack)
        path = write_state(state)
        if args.json:
            print(json.dumps(state, indent=2), flush=True)
        else:
            print("\n".join(local_summary(state, path, time.monotonic() - started)), flush=True)
        try:
            stopping.wait()
        finally:
            path.unlink(missing_ok=True)
            stats = stack.stats()
            if args.json:
                print(json.dumps(stats, indent=2))
            else:
                invocations = sum(s.get("invocations", 0) for s in stats.values())
                errors = sum(s.get("errors", 0) for s in stats.values())
                print(f"stopped: {invocations} invocations, {errors} failed")
    return 0


def local_summary(state: Mapping[str, Any], path: Path, seconds: float) -> list[str]:
    """What `delayq local` prints: where everything is, and what to try."""
    targets = allowed_targets(state)
    first = next((t for t in DEFAULT_TARGETS if topic_allowed(t, targets)), DEFAULT_TARGETS[0])
    bootstrap = state["kafka_bootstrap"]
    return [
        f"delayq local: stack {state['stack_name']} up in {seconds:.1f} s",
        f"  Kafka     {bootstrap}   delay topic {state['delay_topic']}",
        f"  AWS       {state['aws_endpoint']}   region {state['region']}",
        f"  targets   {', '.join(targets) or '(none allowed)'}",
        f"  send      delayq send --target {first} --delay 10 --value hello --id hello-1",
        "  watch     delayq tail        (or: kcat -b "
        f"{bootstrap} -C -t {first} -f '%T %k %s %h\\n')",
        f"  env       {export_line(state)}",
        f"  state     {path}   (--json prints it)",
        "Ctrl-C stops the stack.",
    ]


def _describe(stack: EmbeddedStack) -> dict[str, Any]:
    deployment = stack.deployment
    return {
        "stack_name": deployment.stack_name,
        "aws_endpoint": stack.aws_endpoint_url,
        "region": deployment.region,
        "kafka_bootstrap": stack.kafka_bootstrap,
        # What a consumer of the embedded mock cluster needs (it answers a fetch only when
        # fetch.wait.max.ms expires).
        "kafka_consumer_config": dict(CONSUMER_TUNING) if stack.mock_kafka is not None else {},
        "delay_topic": stack.delay_topic,
        "resources": {k: r.ref for k, r in sorted(deployment.resources.items())},
        "outputs": dict(sorted(deployment.outputs.items())),
        # The stack runs its handlers in this process, under their merged environment.
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DELAYQ_")},
        "sources": sorted(s.name for s in stack.sources.values()),
    }


def demo_options(args: argparse.Namespace) -> DemoOptions:
    """`delayq demo`'s workload and results folder."""
    return DemoOptions(kafka_outage=args.kafka_outage, **_workload(args))


def report_options(args: argparse.Namespace) -> DemoOptions:
    """`delayq report`'s workload: the reports go into its results folder, next to its own
    demo.json (never the demo's folder by default), and part of the requests stay pending."""
    return DemoOptions(reports=args.results, pending=args.pending, **_workload(args))


def _demo(args: argparse.Namespace) -> int:
    return _run_workload(args, demo_options(args))


def _report(args: argparse.Namespace) -> int:
    require_spark()
    return _run_workload(args, report_options(args))


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "messages": args.messages,
        "max_delay_seconds": args.max_delay,
        "send_seconds": args.send_seconds,
        "seed": args.seed,
        "results": args.results,
    }


def _run_workload(args: argparse.Namespace, options: DemoOptions) -> int:
    """Run the demo (and the reports, when asked), print the summary; 1 if anything was lost
    or early."""
    report = run_demo(_stack_config(args), options)
    print("\n".join(report.lines()))
    print(f"results: {options.results / 'demo.json'}, {options.results / 'lateness.png'}")
    if options.reports:
        print(f"reports: {report.extra['reports']}")
    if not report.ok:
        print(f"FAILED: {report.lost} lost, {report.early} early", file=sys.stderr)
        return 1
    return 0


@dataclass(frozen=True)
class _Stack:
    """Where a redrive runs: the ingest function's variables, the stack's outputs, and the
    variables that point boto3 at its endpoint (none for AWS)."""

    name: str
    environ: Mapping[str, str]
    outputs: Mapping[str, Any] = field(default_factory=dict)
    endpoint: Mapping[str, str] = field(default_factory=dict)
    region: str | None = None
    # The variables are all the ingest function has (a deployed or local stack): one left out
    # is at its default. The environment's may be a partial copy.
    complete: bool = True


def _redrive(args: argparse.Namespace, *, clock: Clock, sleep: Sleep) -> int:
    stack = _stack_of(args)
    missing = [name for name in REDRIVE_VARIABLES if not stack.environ.get(name)]
    if missing:
        raise LocalStackError(
            f"{stack.name} does not set {', '.join(missing)}: set the variables the ingest "
            "function has, pass --stack-name, or start `delayq local`"
        )
    settings = Settings.from_env(
        stack.environ, **({"region": stack.region} if stack.region else {})
    )
    source = RedriveSource(args.source)
    url = (
        args.queue_url
        or {
            RedriveSource.DELAY_DLQ: stack.outputs.get(DELAY_DLQ_OUTPUT),
            RedriveSource.REJECTS: settings.reject_queue_url,
            RedriveSource.CLEANUP_FAILURES: f"s3://{settings.payload_bucket}/{FAILED_BATCH_PREFIX}",
        }[source]
    )
    if not url:
        raise LocalStackError(
            f"no queue to redrive {source} from: pass --queue-url (or --stack-name, "
            f"whose {DELAY_DLQ_OUTPUT} output names it)"
        )
    with environ_during(stack.endpoint):
        try:
            report = redrive(
                source,
                settings=settings,
                services=redrive_services(settings),
                source_url=str(url),
                limit=args.limit,
                rate_per_second=args.rate,
                dry_run=args.dry_run,
                wait_seconds=args.wait,
                clock=clock,
                sleep=sleep,
                progress=None if args.json else _Progress(clock),
            )
        except ConfigurationError:
            raise
        except (DelayQueueError, BotoCoreError, ClientError) as e:
            print(f"delayq: redrive from {url} stopped: {e}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({**report.as_dict(), "source_url": url}, indent=2))
    else:
        print("\n".join(_summary(report, str(url))))
    return 1 if report.failed else 0


def _rejects_list(args: argparse.Namespace) -> int:
    stack = _stack_of(args)
    settings = _settings_needing(stack, c.ENV_REJECT_QUEUE_URL)
    with environ_during(stack.endpoint):
        source = SourceQueue(client("sqs", settings), settings.reject_queue_url)
        try:
            views, errors = list_rejects(source, args.limit, Deadline.after(GET_SECONDS))
        except (DelayQueueError, BotoCoreError, ClientError) as e:
            raise LocalStackError(f"cannot read {settings.reject_queue_url}: {e}") from e
    for view in views:
        print(json.dumps(view.as_json()) if args.json else "\n".join(view.lines()))
    if not args.json:
        print(f"{len(views)} rejected record(s) shown", file=sys.stderr)
    for error in errors:
        print(f"delayq: {error}", file=sys.stderr)
    return 0


def _settings_needing(stack: _Stack, name: str) -> Settings:
    """The stack's settings, when it sets `name`."""
    if not stack.environ.get(name):
        raise LocalStackError(
            f"{stack.name} does not set {name}: pass --stack-name, or start `delayq local`"
        )
    return Settings.from_env(stack.environ, **({"region": stack.region} if stack.region else {}))


def _get(args: argparse.Namespace) -> int:
    stack = _stack_of(args)
    settings = _settings_needing(stack, c.ENV_TABLE_NAME)
    with environ_during(stack.endpoint):
        try:
            found = locate(
                message_store(settings), args.delay_id, args.due, Deadline.after(GET_SECONDS)
            )
        except (DelayQueueError, BotoCoreError, ClientError) as e:
            raise LocalStackError(f"cannot read {settings.table_name}: {e}") from e
    print(json.dumps(found.as_json(), indent=2) if args.json else "\n".join(found.lines()))
    return 0 if found.found else 1


def _index_kept(args: argparse.Namespace) -> bool | None:
    """Whether the stack's ingest keeps the id index (its ``DELAYQ_ID_INDEX``; unset: the
    default, off); None when the variables may be incomplete and do not say."""
    stack = _stack_of(args)
    raw = stack.environ.get(c.ENV_ID_INDEX, "").strip()
    if raw:
        return raw == "1"
    return False if stack.complete else None


def _look_up(args: argparse.Namespace, delay_id: str) -> Whereabouts | None:
    """What the stack's table says of `delay_id` (None: no stack table is known)."""
    stack = _stack_of(args)
    if not stack.environ.get(c.ENV_TABLE_NAME):
        return None
    settings = _settings_needing(stack, c.ENV_TABLE_NAME)
    with environ_during(stack.endpoint):
        try:
            return locate(message_store(settings), delay_id, None, Deadline.after(GET_SECONDS))
        except (DelayQueueError, BotoCoreError, ClientError) as e:
            raise LocalStackError(f"cannot read {settings.table_name}: {e}") from e


def _pending(args: argparse.Namespace, *, clock: Clock) -> int:
    stack = _stack_of(args)
    settings = _settings_needing(stack, c.ENV_TABLE_NAME)
    if not settings.pending_counts:
        raise LocalStackError(
            f"{stack.name} keeps no pending counts ({c.ENV_PENDING_COUNTS}=0; the template's "
            "PendingCounts parameter turns them on)"
        )
    urls = [
        u
        for u in (
            settings.delay_queue_url,
            settings.delay_queue_high_url,
            settings.delay_queue_low_url,
        )
        if u
    ]
    with environ_during(stack.endpoint):
        try:
            report = pending_report(
                pending_counts(settings),
                message_store(settings),
                client("sqs", settings) if urls else None,
                urls,
                now_ms=clock(),
                days=args.days,
                by=args.by,
                target=args.target,
                deadline=Deadline.after(GET_SECONDS),
            )
        except (DelayQueueError, BotoCoreError, ClientError) as e:
            raise LocalStackError(f"cannot read the pending counts of {stack.name}: {e}") from e
    print(json.dumps(report.as_json(), indent=2) if args.json else "\n".join(report.lines()))
    return 0


class _Progress:
    """A redrive's progress on stderr, at most once per `PROGRESS_SECONDS`."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last_ms = clock()

    def __call__(self, report: RedriveReport, read: int) -> None:
        now_ms = self._clock()
        if now_ms - self._last_ms < PROGRESS_SECONDS * 1000:
            return
        self._last_ms = now_ms
        print(
            f"redrive: {read} read, {report.moved} moved, {report.still_rejected} still "
            f"rejected, {report.failed} failed",
            file=sys.stderr,
            flush=True,
        )


def _stack_of(args: argparse.Namespace) -> _Stack:
    """--stack-name, else the running `delayq local` (set variables win), else the
    environment."""
    if args.stack_name:
        return _deployed_stack(args.stack_name, args.region)
    state = read_state()
    if not state:
        return _Stack("the environment", os.environ, region=args.region, complete=False)
    if "environment" not in state:
        raise LocalStackError(f"{state_file()} has no environment: restart `delayq local`")
    endpoint = AwsEndpoint(
        state["aws_endpoint"],
        state["region"],
        fake_credentials="AWS_ACCESS_KEY_ID" not in os.environ,
    )
    return _Stack(
        f"the running `delayq local` ({state['stack_name']})",
        {**state["environment"], **os.environ},
        state.get("outputs", {}),
        endpoint.environ(),
        state["region"],
    )


def _deployed_stack(name: str, region: str | None) -> _Stack:
    """Outputs from CloudFormation, settings from the ingest function's environment."""
    region = region or boto3.session.Session().region_name
    if not region:
        raise LocalStackError("no region: pass --region or set AWS_REGION")
    try:
        [described] = boto3.client("cloudformation", region_name=region).describe_stacks(
            StackName=name
        )["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        if INGEST_FUNCTION_OUTPUT not in outputs:
            raise LocalStackError(f"stack {name} has no {INGEST_FUNCTION_OUTPUT} output")
        configuration = boto3.client("lambda", region_name=region).get_function_configuration(
            FunctionName=outputs[INGEST_FUNCTION_OUTPUT]
        )
    except (BotoCoreError, ClientError) as e:
        raise LocalStackError(f"cannot read stack {name} in {region}: {e}") from e
    environ = configuration.get("Environment", {}).get("Variables", {})
    return _Stack(f"stack {name}", environ, outputs, region=region)


def _summary(report: RedriveReport, url: str) -> list[str]:
    """The report for a person: counts, reasons, and one line per error."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(report.reasons.items()))
    lines = [
        f"redrive {report.source} from {url}"
        + (" (dry run: nothing was moved)" if report.dry_run else ""),
        f"{'would move' if report.dry_run else 'moved'}: {report.moved}",
        f"still rejected: {report.still_rejected}" + (f" ({reasons})" if reasons else ""),
        f"skipped: {report.skipped} (re-rejected by this run, left for the next)",
        f"failed: {report.failed} (left on the source)",
    ]
    if report.waited_seconds:
        lines.append(f"paced: waited {report.waited_seconds:.1f} s")
    if report.errors:
        lines.append("errors:")
        lines.extend(f"  {error}" for error in report.errors)
    return lines


def _outage(text: str) -> tuple[float, float]:
    at, _, duration = text.partition(":")
    try:
        return float(at), float(duration)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected AT:SECONDS, not {text!r}") from e
