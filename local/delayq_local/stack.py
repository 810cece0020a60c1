"""The embedded stack: moto + librdkafka's mock cluster + the template's resources + the handlers
wired to emulated event sources, in one process.

    with EmbeddedStack(StackConfig(project_root=Path("."))) as stack:
        print(stack.kafka_bootstrap, stack.aws_endpoint_url)

Endpoints are chosen by configuration: an explicit `aws_endpoint`, `localstack=True`, or
`AWS_ENDPOINT_URL` in the environment use that endpoint instead of the embedded moto server; a
`kafka_bootstrap` uses that cluster instead of the mock.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import boto3
from confluent_kafka.admin import AdminClient

from delayq import constants as c
from delayq.clock import handler_clock, set_handler_clock
from delayq_local.aws import DEFAULT_REGION, AwsEndpoint, MotoServer, localstack_endpoint
from delayq_local.exceptions import LocalStackError, ProvisionError
from delayq_local.faults import ActiveFaults, FaultPlan
from delayq_local.iam import Account, Denial, IamGuard, guard_of
from delayq_local.kafka_mock import CONSUMER_TUNING, MockKafkaCluster
from delayq_local.provision import DYNAMODB_TABLE, Deployment, ProvisionedResource, provision
from delayq_local.sandbox import Handler, LocalFunction, attribute_clients, load_handler
from delayq_local.sources import (
    EventSource,
    FailureDestinations,
    KafkaEventSource,
    ScheduleEventSource,
    SqsEventSource,
    StreamEventSource,
    TtlEmulator,
)
from delayq_local.specs import (
    FunctionSpec,
    KafkaEventSpec,
    ScheduleEventSpec,
    SqsEventSpec,
    StreamEventSpec,
)
from delayq_local.template import Template, load_template

log = logging.getLogger(__name__)

# How long start-up waits for the Kafka event sources' consumer groups to be assigned. A
# group join normally takes a second or two; with four test workers on two busy cores one
# took over 30 s (a CI run of 2026-11-26), so the bound is generous: it only turns a hang
# into an error.
KAFKA_ASSIGN_TIMEOUT_SECONDS: Final = 90.0
# Lambda scales an SQS-triggered function up to the event's MaximumConcurrency; locally the
# execution environments are threads of one process, so their number is capped.
LOCAL_MAX_CONCURRENCY: Final = 16
# Template parameters the stack sets (when the template has them) unless the configuration
# does: locally the cluster is self-managed and plain-text, at the bootstrap in use.
# The local stack keeps the id index (`delayq get ID`, reschedules by id alone): it costs
# nothing here.
LOCAL_PARAMETERS: Final = {
    "KafkaSource": "SelfManagedKafka",
    "KafkaSecurity": "PLAINTEXT",
    "IdIndex": "1",
}
BOOTSTRAP_PARAMETER: Final = "KafkaBootstrapServers"
_module_numbers = itertools.count(1)


@dataclass(frozen=True)
class TimeCompression:
    """Shorter periods so that the DynamoDB path runs within minutes (AWS: horizon 900 s,
    look-ahead 840 s, tick 60 s, TTL grace a day): TTL expiry, and so the cleanup function,
    then also run during a demo."""

    horizon_seconds: int = 60
    lookahead_seconds: int = 50
    tick_seconds: int = 5
    ttl_grace_seconds: int = 60
    # One machine's clocks (the fault plans skew them by a few seconds, not minutes).
    ttl_clock_margin_seconds: int = 5

    def environ(self) -> dict[str, str]:
        """The settings as handler environment variables."""
        return {
            c.ENV_HORIZON_SECONDS: str(self.horizon_seconds),
            c.ENV_LOOKAHEAD_SECONDS: str(self.lookahead_seconds),
            c.ENV_TICK_SECONDS: str(self.tick_seconds),
            c.ENV_TTL_GRACE_SECONDS: str(self.ttl_grace_seconds),
            c.ENV_TTL_CLOCK_MARGIN_SECONDS: str(self.ttl_clock_margin_seconds),
            # The compressed gap between horizon and look-ahead is the time ingest may take
            # to store a batch (in AWS the template sets it to the function's timeout).
            c.ENV_INGEST_TIMEOUT_SECONDS: str(self.horizon_seconds - self.lookahead_seconds),
        }


@dataclass(frozen=True)
class StackConfig:
    """What to run and where. Explicit fields win over the environment.

    - `aws_endpoint` / `localstack` / `kafka_bootstrap`: use these instead of the embedded moto
      server and mock cluster (`AWS_ENDPOINT_URL` in the environment also replaces moto).
    - `parameters`: template parameter overrides; `environment`: handler variables that win
      over the template's; `time`: the compressed periods (None keeps the template's).
    - `handlers`: callables to use instead of `functions/<name>/app.py`, by logical id;
      `functions`: wire only these functions (None: all).
    - `kafka_consumers`: consumers (and environments) of a Kafka event source (default: one
      per partition of its topics, at most `LOCAL_MAX_CONCURRENCY`).
    - `concurrency`: execution environments per SQS-triggered function (default: the event's
      `ScalingConfig.MaximumConcurrency`, at most `LOCAL_MAX_CONCURRENCY`, else 1).
    - `shards`: `DELAYQ_SHARDS` for the handlers (None keeps the template's): moto answers a
      DynamoDB Query by scanning the whole table, so each shard costs a table scan per
      due-second scheduled.
    - `overrides`: resource properties set over the template's, by logical id (e.g. shorter
      queue visibility timeouts, so that a crashed batch comes back within a test).
    - `faults`: a `FaultPlan` installed before the handlers run (see `delayq_local.faults`).
    - `enforce_iam`: check every call a function (or its event source) makes against its
      role in the template, refuse it as AWS would, and record it (`iam_denials()`).
    - `short_poll`: functions whose queue is short-polled every `sqs_idle_sleep` seconds (the
      emitter: moto wakes a long poll late for a delayed message); the others long-poll for
      `sqs_wait_seconds`.
    """

    project_root: Path = Path()
    template: Path | None = None
    stack_name: str = "delayq-local"
    region: str = DEFAULT_REGION
    aws_endpoint: str | None = None
    localstack: bool = False
    kafka_bootstrap: str | None = None
    kafka_brokers: int = 1
    topic_partitions: int = 3
    topics: tuple[str, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    time: TimeCompression | None = field(default_factory=TimeCompression)
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    functions: frozenset[str] | None = None
    concurrency: Mapping[str, int] = field(default_factory=dict)
    schedule_period_seconds: float | None = None
    short_poll: frozenset[str] = frozenset({"EmitterFunction"})
    sqs_wait_seconds: int = 1
    sqs_idle_sleep: float = 0.1
    stream_poll_seconds: float = 0.25
    ttl_sweep_seconds: float = 5.0
    emulate_ttl: bool = True
    kafka_retry_backoff_seconds: float = 1.0
    kafka_consumers: int | None = None
    shards: int | None = 2
    async_retry_delays: tuple[float, ...] = (1.0, 2.0)
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    faults: FaultPlan | None = None
    enforce_iam: bool = True

    @property
    def template_path(self) -> Path:
        """The template file (default: `template.yaml` in the project root)."""
        return self.template or self.project_root / "template.yaml"


class EmbeddedStack:
    """Starts everything in `start()`, tears it down in `stop()` (also a context manager)."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self.moto: MotoServer | None = None
        self.mock_kafka: MockKafkaCluster | None = None
        self.endpoint: AwsEndpoint | None = None
        self._deployment: Deployment | None = None
        self._kafka_bootstrap = ""
        self.sources: dict[tuple[str, str], EventSource] = {}
        self.ttl_emulators: list[TtlEmulator] = []
        self._saved_environ: dict[str, str | None] = {}
        self._modules: list[str] = []
        self.faults: ActiveFaults | None = None
        self.iam: IamGuard | None = None

    # Lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the endpoints, provision, load the handlers, start the event sources."""
        try:
            self._start_aws()
            self._start_kafka()
            assert self.endpoint is not None
            template = load_template(self.config.template_path)
            self._deployment = provision(
                template,
                self.config.stack_name,
                self.endpoint,
                self._parameters(template),
                self.config.overrides,
            )
            self._create_topics()
            self._saved_environ = _apply_environ(self._stack_environ())
            if self.config.enforce_iam:
                self.iam = self._iam_guard()
            if self.config.faults is not None:
                self.faults = self.config.faults.install()
            self._build_sources()
            everything = [*self.sources.values(), *self.ttl_emulators]
            for source in everything:
                source.prepare()
            for source in everything:
                source.start()
            self._wait_for_kafka_consumers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sources, restore the environment, stop the embedded endpoints."""
        self._stop_sources()
        if self.faults is not None:
            self.faults.remove()
        if self.iam is not None:
            self.iam.remove()
        self._unload_handlers()
        _restore_environ(self._saved_environ)
        self._saved_environ = {}
        if self.mock_kafka is not None:
            self.mock_kafka.stop()
        if self.moto is not None:
            self.moto.stop()

    def _stop_sources(self) -> None:
        running = [*self.ttl_emulators, *self.sources.values()]
        for source in running:
            source.request_stop()
        for source in running:
            source.join()

    def _unload_handlers(self) -> None:
        """Forget the loaded handler modules and their environments, so that their clients (the
        emitter's Kafka producers) are closed instead of retrying a stopped cluster for good."""
        self.sources.clear()
        self.ttl_emulators.clear()
        for name in self._modules:
            sys.modules.pop(name, None)
        self._modules.clear()
        gc.collect()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # What tests and the CLI look at ------------------------------------------------------

    @property
    def deployment(self) -> Deployment:
        """The provisioned resources and resolved functions."""
        if self._deployment is None:
            raise LocalStackError("the stack is not started")
        return self._deployment

    @property
    def aws_endpoint_url(self) -> str:
        """Where the AWS calls go."""
        if self.endpoint is None or self.endpoint.url is None:
            raise LocalStackError("the stack is not started")
        return self.endpoint.url

    @property
    def kafka_bootstrap(self) -> str:
        """`bootstrap.servers` of the Kafka cluster in use."""
        if not self._kafka_bootstrap:
            raise LocalStackError("the stack is not started")
        return self._kafka_bootstrap

    @property
    def delay_topic(self) -> str:
        """The topic the ingest function's Kafka event source reads."""
        for spec in self.deployment.functions.values():
            for event in spec.events:
                if isinstance(event, KafkaEventSpec) and event.topics:
                    return event.topics[0]
        raise LocalStackError("no function reads a Kafka topic")

    def resource(self, logical_id: str) -> ProvisionedResource:
        """A provisioned resource by logical id (`.ref` is the queue URL, table or bucket name)."""
        try:
            return self.deployment.resources[logical_id]
        except KeyError as e:
            raise LocalStackError(f"{logical_id} was not provisioned") from e

    def client(self, service: str) -> Any:
        """A boto3 client on the stack's AWS endpoint."""
        if self.endpoint is None:
            raise LocalStackError("the stack is not started")
        client = self.endpoint.client(service)
        if self.iam is not None:
            self.iam.install(client.meta.events)  # the event sources' calls are checked too
        return client

    def iam_denials(self) -> list[Denial]:
        """The calls refused because a function's role does not grant them (empty when IAM is
        not enforced)."""
        return self.iam.denials if self.iam is not None else []

    def source(self, function_id: str, event: str | None = None) -> EventSource:
        """The event source wired to a function (its only one, or the named event)."""
        matches = [
            s for (f, e), s in self.sources.items() if f == function_id and event in (None, e)
        ]
        if len(matches) != 1:
            raise LocalStackError(f"{len(matches)} sources match {function_id}/{event}")
        return matches[0]

    def stats(self) -> dict[str, dict[str, int]]:
        """Every source's counters, by source name."""
        return {s.name: s.stats.snapshot() for s in [*self.sources.values(), *self.ttl_emulators]}

    # Start-up steps ----------------------------------------------------------------------

    def _start_aws(self) -> None:
        config, environ = self.config, os.environ
        url = config.aws_endpoint
        external_credentials = False
        if url is None and config.localstack:
            url = localstack_endpoint()
        elif url is None and environ.get("AWS_ENDPOINT_URL"):
            url = environ["AWS_ENDPOINT_URL"]
            external_credentials = "AWS_ACCESS_KEY_ID" in environ
        if url is None:
            self.moto = MotoServer().start()
            url = self.moto.endpoint_url
        self.endpoint = AwsEndpoint(
            url=url, region=config.region, fake_credentials=not external_credentials
        )

    def _iam_guard(self) -> IamGuard:
        """Check the functions' calls against their roles from now on: the clients the handlers
        make (boto3's default session) and the event sources' (`client()`)."""
        guard = iam_guard(self.deployment)
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        attribute_clients(boto3.DEFAULT_SESSION.events)
        return guard.install(boto3.DEFAULT_SESSION.events)

    def _start_kafka(self) -> None:
        if self.config.kafka_bootstrap:
            self._kafka_bootstrap = self.config.kafka_bootstrap
            return
        self.mock_kafka = MockKafkaCluster(self.config.kafka_brokers).start()
        self._kafka_bootstrap = self.mock_kafka.bootstrap_servers

    def _parameters(self, template: Template) -> dict[str, str]:
        defaults = {**LOCAL_PARAMETERS, BOOTSTRAP_PARAMETER: self.kafka_bootstrap}
        chosen = {k: v for k, v in defaults.items() if k in template.parameters}
        return {**chosen, **self.config.parameters}

    def _create_topics(self) -> None:
        if self.mock_kafka is None:
            return
        topics = set(self.config.topics)
        for spec in self.deployment.functions.values():
            topics.update(t for e in spec.events if isinstance(e, KafkaEventSpec) for t in e.topics)
        for topic in sorted(topics):
            self.mock_kafka.create_topic(topic, self.config.topic_partitions)

    def _overrides(self) -> dict[str, str]:
        """What the local stack sets over the template's environment, for every function."""
        overrides = {
            c.ENV_KAFKA_BOOTSTRAP: self.kafka_bootstrap,
            c.ENV_KAFKA_SECURITY: "PLAINTEXT",
            c.ENV_KAFKA_SECRET_ARN: "",
            "POWERTOOLS_METRICS_DISABLED": "true",
            # Short local runs end before a minute's statistics would be written: write each
            # batch's, so `delayq report` sees every delivery (cost does not matter here).
            c.ENV_STATS_FLUSH_MESSAGES: "1",
        }
        if self.config.time is not None:
            overrides.update(self.config.time.environ())
        if self.config.shards is not None:
            overrides[c.ENV_SHARDS] = str(self.config.shards)
        overrides.update(self.config.environment)
        return overrides

    def _function_environ(self, spec: FunctionSpec) -> dict[str, str]:
        assert self.endpoint is not None
        return {**self.endpoint.environ(), **spec.environment, **self._overrides()}

    def _stack_environ(self) -> dict[str, str]:
        assert self.endpoint is not None
        merged: dict[str, str] = dict(self.endpoint.environ())
        for spec in self._wired_functions():
            for name, value in spec.environment.items():
                if merged.get(name, value) != value:
                    log.info("%s differs between functions; each sees its own at import", name)
                merged[name] = value
        merged.update(self._overrides())
        return merged

    def _wired_functions(self) -> list[FunctionSpec]:
        wanted = self.config.functions
        return [
            spec
            for logical_id, spec in self.deployment.functions.items()
            if wanted is None or logical_id in wanted
        ]

    def _local_function(self, spec: FunctionSpec) -> LocalFunction:
        handler = self.config.handlers.get(spec.logical_id)
        if handler is not None:
            fake = handler
            loader: Callable[[], Handler] = lambda: fake  # noqa: E731 (one shared callable)
        else:
            path, attribute = spec.handler_location(self.config.template_path.parent)
            environ = self._function_environ(spec)
            prefix = re.sub(r"\W", "_", f"delayq_fn_{self.config.stack_name}_{spec.logical_id}")

            def loader() -> Handler:
                number = next(_module_numbers)
                name = f"{prefix}_{number}"
                self._modules.append(name)
                skewed = self.faults.handler_clock(spec.logical_id) if self.faults else None
                if skewed is not None:
                    set_handler_clock(name, skewed)
                with environ_during({**environ, **_own_logger(environ, spec, number)}):
                    handler = load_handler(path, attribute, name)
                # The module took its clock when imported; one still set was never taken.
                if skewed is not None and handler_clock(name) is skewed:
                    raise LocalStackError(
                        f"{spec.logical_id}: {path} does not take its clock from "
                        "delayq.clock.handler_clock, so its clock cannot be skewed"
                    )
                return handler

        return LocalFunction(
            name=spec.name,
            logical_id=spec.logical_id,
            loader=loader,
            timeout_seconds=spec.timeout_seconds,
            memory_mb=spec.memory_mb,
            arn=spec.arn,
        )

    def _build_sources(self) -> None:
        builders: Mapping[type, Callable[[LocalFunction, FunctionSpec, Any], EventSource]] = {
            SqsEventSpec: self._sqs_source,
            KafkaEventSpec: self._kafka_source,
            ScheduleEventSpec: self._schedule_source,
            StreamEventSpec: self._stream_source,
        }
        for spec in self._wired_functions():
            function = self._local_function(spec)
            for event in spec.events:
                if not event.enabled:
                    log.info("%s/%s is disabled in the template", spec.logical_id, event.name)
                    continue
                self.sources[(spec.logical_id, event.name)] = builders[type(event)](
                    function, spec, event
                )
        if self.config.emulate_ttl:
            self.ttl_emulators = [
                emulator
                for table in self.deployment.of_type(DYNAMODB_TABLE)
                if (emulator := self._ttl_emulator(table)) is not None
            ]

    def _queue_url(self, arn: str) -> str:
        return self.deployment.by_arn(arn).ref

    def _sqs_source(
        self, function: LocalFunction, spec: FunctionSpec, event: SqsEventSpec
    ) -> EventSource:
        return SqsEventSource(
            function,
            event,
            self.client("sqs"),
            self._queue_url(event.queue_arn),
            region=self.config.region,
            concurrency=self.config.concurrency.get(
                spec.logical_id, min(event.maximum_concurrency or 1, LOCAL_MAX_CONCURRENCY)
            ),
            wait_seconds=(
                0 if spec.logical_id in self.config.short_poll else self.config.sqs_wait_seconds
            ),
            idle_sleep=self.config.sqs_idle_sleep,
        )

    def _kafka_source(
        self, function: LocalFunction, spec: FunctionSpec, event: KafkaEventSpec
    ) -> EventSource:
        return KafkaEventSource(
            function,
            event,
            self.kafka_bootstrap,
            consumers=self.config.kafka_consumers or self._partitions(event.topics),
            retry_backoff_seconds=self.config.kafka_retry_backoff_seconds,
            consumer_config=CONSUMER_TUNING if self.mock_kafka is not None else None,
        )

    def _partitions(self, topics: Sequence[str]) -> int:
        """How many partitions the topics have (Lambda polls with up to one consumer each)."""
        metadata = AdminClient({"bootstrap.servers": self.kafka_bootstrap}).list_topics(
            timeout=KAFKA_ASSIGN_TIMEOUT_SECONDS
        )
        count = sum(len(metadata.topics[t].partitions) for t in topics if t in metadata.topics)
        return max(1, min(count, LOCAL_MAX_CONCURRENCY))

    def _schedule_source(
        self, function: LocalFunction, spec: FunctionSpec, event: ScheduleEventSpec
    ) -> EventSource:
        period = self.config.schedule_period_seconds
        if period is None and self.config.time is not None:
            period = float(self.config.time.tick_seconds)
        return ScheduleEventSource(
            function,
            event,
            period_seconds=period,
            region=self.config.region,
            account=self.deployment.account,
            retry_attempts=spec.async_retry_attempts,
            retry_delays=self.config.async_retry_delays,
            destinations=FailureDestinations(
                sqs=self.client("sqs"),
                dead_letter_queue_url=self._sqs_destination(spec.dead_letter_arn),
                on_failure_queue_url=self._sqs_destination(spec.async_on_failure_arn),
            ),
        )

    def _stream_source(
        self, function: LocalFunction, spec: FunctionSpec, event: StreamEventSpec
    ) -> EventSource:
        return StreamEventSource(
            function,
            event,
            self.client("dynamodbstreams"),
            region=self.config.region,
            poll_interval=self.config.stream_poll_seconds,
            sqs=self.client("sqs"),
            on_failure_queue_url=self._sqs_destination(event.on_failure_arn),
            s3=self.client("s3"),
            on_failure_bucket=_s3_destination(event.on_failure_arn),
        )

    def _sqs_destination(self, arn: str | None) -> str | None:
        if not arn or _s3_destination(arn):
            return None
        if not arn.startswith("arn:aws:sqs:"):
            log.warning("failure destination %s is not an SQS queue or S3 bucket", arn)
            return None
        try:
            return self._queue_url(arn)
        except ProvisionError:
            log.warning("failure destination %s was not provisioned", arn)
            return None

    def _ttl_emulator(self, table: ProvisionedResource) -> TtlEmulator | None:
        ttl = table.properties.get("TimeToLiveSpecification") or {}
        if str(ttl.get("Enabled", "false")).lower() != "true":
            return None
        stream_arn = table.attributes.get("StreamArn")
        streams = [
            s
            for s in self.sources.values()
            if isinstance(s, StreamEventSource) and stream_arn and s.spec.stream_arn == stream_arn
        ]
        view = (table.properties.get("StreamSpecification") or {}).get("StreamViewType", "")
        return TtlEmulator(
            self.client("dynamodb"),
            table.ref,
            str(ttl["AttributeName"]),
            [k["AttributeName"] for k in table.properties["KeySchema"]],
            period_seconds=self.config.ttl_sweep_seconds,
            streams=streams,
            stream_view_type=str(view),
            region=self.config.region,
        )

    def _wait_for_kafka_consumers(self) -> None:
        for source in self.sources.values():
            if isinstance(source, KafkaEventSource) and not source.wait_assigned(
                KAFKA_ASSIGN_TIMEOUT_SECONDS
            ):
                raise LocalStackError(
                    f"{source.name}: no partitions assigned within {KAFKA_ASSIGN_TIMEOUT_SECONDS}s"
                )


def iam_guard(deployment: Deployment) -> IamGuard:
    """A guard over the deployed functions' roles (not installed)."""
    partition_keys = {
        table.ref: key["AttributeName"]
        for table in deployment.of_type(DYNAMODB_TABLE)
        for key in table.properties.get("KeySchema") or []
        if key.get("KeyType") == "HASH"
    }
    return guard_of(
        {
            logical_id: spec.role_policies
            for logical_id, spec in deployment.functions.items()
            if spec.role_policies is not None
        },
        Account(deployment.region, deployment.account, partition_keys),
    )


def _own_logger(environ: Mapping[str, str], spec: FunctionSpec, number: int) -> dict[str, str]:
    """The Powertools service name of one execution environment: the template's (the stack),
    then the function and the environment's number. In AWS each environment is a process of
    its own; here they share one, and Powertools keeps one logger (and the keys a handler
    appends to it) per service name, so a shared name would mix one invocation's keys
    (function, request id, cold start) into another's lines."""
    service = environ.get("POWERTOOLS_SERVICE_NAME") or "delayq"
    return {"POWERTOOLS_SERVICE_NAME": f"{service}/{spec.logical_id}/{number}"}


def _apply_environ(values: Mapping[str, str]) -> dict[str, str | None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    return saved


def _restore_environ(saved: Mapping[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def environ_during(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then restore what was there."""
    saved = _apply_environ(values)
    try:
        yield
    finally:
        _restore_environ(saved)


_S3_ARN_PREFIX: Final = "arn:aws:s3:::"


def _s3_destination(arn: str | None) -> str | None:
    """The bucket of an S3 on-failure destination, else None."""
    if arn and arn.startswith(_S3_ARN_PREFIX):
        return arn.removeprefix(_S3_ARN_PREFIX)
    return None
