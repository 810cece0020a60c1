"""The `delayq` command: run the local stack, send and cancel delay requests, run the demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from delayq import constants as c
from delayq_local.demo import DemoOptions, run_demo
from delayq_local.exceptions import LocalStackError
from delayq_local.producer import DelayProducer, Due
from delayq_local.stack import EmbeddedStack, StackConfig, TimeCompression
from delayq_local.workload import DEFAULT_TARGETS

STATE_FILE: Final = Path("results/local-stack.json")
DEFAULT_TOPIC: Final = "delay-requests"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `delayq` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except LocalStackError as e:
        print(f"delayq: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delayq", description="The Kafka delay queue, locally: stack, requests, demo."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    local = commands.add_parser("local", help="run the embedded stack in the foreground")
    _stack_options(local, log_level="WARNING")
    local.set_defaults(command=_local)

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
    report.add_argument("--seed", type=int, default=DemoOptions.seed)
    report.add_argument("--results", type=Path, default=Path("results"))
    report.add_argument(
        "--reports",
        type=Path,
        default=Path("results/reports"),
        help="where the reports go (default: %(default)s)",
    )
    report.set_defaults(command=_report)

    send = commands.add_parser("send", help="produce one delay request")
    _client_options(send)
    send.add_argument("--target", required=True, help="the topic to deliver to")
    when = send.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=float, help="seconds from now (the broker timestamp)")
    when.add_argument("--delay-ms", type=int, help="milliseconds from now")
    when.add_argument("--at", type=_epoch_ms, help="absolute time: epoch ms or ISO 8601")
    send.add_argument("--key", help="record key (UTF-8)")
    send.add_argument("--value", default="", help="record value (UTF-8)")
    send.add_argument("--id", dest="delay_id", help="delay id (the cancel key)")
    send.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="NAME=VALUE",
        help="a user header (repeatable)",
    )
    send.set_defaults(command=_send)

    cancel = commands.add_parser("cancel", help="cancel a pending request by its id")
    _client_options(cancel)
    cancel.add_argument("delay_id", metavar="ID")
    cancel.set_defaults(command=_cancel)
    return parser


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
        type=_header,
        metavar="NAME=VALUE",
        help="a template parameter override",
    )
    group.add_argument(
        "--env",
        action="append",
        default=[],
        type=_header,
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


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: "
        "$DELAYQ_KAFKA_BOOTSTRAP, else the running `delayq local`)",
    )
    parser.add_argument("--topic", help=f"the delay topic (default: {DEFAULT_TOPIC})")


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
    with EmbeddedStack(_stack_config(args)) as stack:
        state = _describe(stack)
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")
        print(json.dumps(state, indent=2))
        print(
            f"\nexport AWS_ENDPOINT_URL={state['aws_endpoint']} "
            f"DELAYQ_KAFKA_BOOTSTRAP={state['kafka_bootstrap']}\n"
            f"try: delayq send --target {DEFAULT_TARGETS[0]} --delay 10 --value hello\n"
            "Ctrl-C stops the stack.",
            flush=True,
        )
        try:
            stopping.wait()
        finally:
            STATE_FILE.unlink(missing_ok=True)
            print(json.dumps(stack.stats(), indent=2))
    return 0


def _describe(stack: EmbeddedStack) -> dict[str, Any]:
    deployment = stack.deployment
    return {
        "stack_name": deployment.stack_name,
        "aws_endpoint": stack.aws_endpoint_url,
        "region": deployment.region,
        "kafka_bootstrap": stack.kafka_bootstrap,
        "delay_topic": stack.delay_topic,
        "resources": {k: r.ref for k, r in sorted(deployment.resources.items())},
        "sources": sorted(s.name for s in stack.sources.values()),
    }


def _demo(args: argparse.Namespace) -> int:
    return _run_workload(args, DemoOptions(kafka_outage=args.kafka_outage, **_workload(args)))


def _report(args: argparse.Namespace) -> int:
    return _run_workload(args, DemoOptions(reports=args.reports, **_workload(args)))


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "messages": args.messages,
        "max_delay_seconds": args.max_delay,
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


def _producer(args: argparse.Namespace) -> DelayProducer:
    state = _state()
    bootstrap = (
        args.bootstrap or os.environ.get(c.ENV_KAFKA_BOOTSTRAP) or state.get("kafka_bootstrap")
    )
    if not bootstrap:
        raise LocalStackError(
            "no Kafka bootstrap: pass --bootstrap, set DELAYQ_KAFKA_BOOTSTRAP, "
            "or start `delayq local`"
        )
    return DelayProducer(
        str(bootstrap), topic=args.topic or state.get("delay_topic", DEFAULT_TOPIC)
    )


def _state() -> Mapping[str, Any]:
    if not STATE_FILE.is_file():
        return {}
    state: Mapping[str, Any] = json.loads(STATE_FILE.read_text())
    return state


def _send(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        producer.send(
            args.target,
            Due(seconds=args.delay, ms=args.delay_ms, at_ms=args.at),
            value=args.value.encode(),
            key=args.key.encode() if args.key is not None else None,
            delay_id=args.delay_id,
            headers=args.header,
        )
    print(f"sent to {producer.topic}" + (f" (id {args.delay_id})" if args.delay_id else ""))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        producer.cancel(args.delay_id)
    print(f"cancel for {args.delay_id} sent to {producer.topic}")
    return 0


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value.encode()


def _epoch_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not epoch ms or ISO 8601: {text!r}") from e
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time zone (e.g. 2026-01-01T12:00:00+00:00)")
    return int(moment.timestamp() * 1000)


def _outage(text: str) -> tuple[float, float]:
    at, _, duration = text.partition(":")
    try:
        return float(at), float(duration)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected AT:SECONDS, not {text!r}") from e
