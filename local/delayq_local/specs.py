"""Functions and their event sources, read from the CloudFormation resources that create them
in AWS (resolved, typed, defaulted): `AWS::Lambda::Function`, `AWS::Lambda::EventInvokeConfig`,
`AWS::Lambda::EventSourceMapping`, and the schedules (`AWS::Events::Rule`,
`AWS::Scheduler::Schedule`) that invoke a function.

Defaults are Lambda's own (timeout, memory, batch sizes, batching windows, retry counts), so a
template that leaves a property out behaves locally as it would in AWS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from delayq_local.exceptions import TemplateError
from delayq_local.filters import EventFilter
from delayq_local.template import LOCAL_CODE_BUCKET

LAMBDA_DEFAULT_TIMEOUT_SECONDS: Final = 3
LAMBDA_DEFAULT_MEMORY_MB: Final = 128
ASYNC_DEFAULT_RETRY_ATTEMPTS: Final = 2


@dataclass(frozen=True)
class SqsEventSpec:
    """An `SQS` event: a queue polled in batches."""

    name: str
    queue_arn: str
    batch_size: int = 10
    batching_window_seconds: float = 0.0
    report_batch_item_failures: bool = False
    maximum_concurrency: int | None = None
    filter: EventFilter | None = None
    enabled: bool = True


@dataclass(frozen=True)
class KafkaEventSpec:
    """An `MSK` or `SelfManagedKafka` event: topics read by a consumer group."""

    name: str
    kind: str
    topics: tuple[str, ...]
    starting_position: str = "LATEST"
    batch_size: int = 100
    batching_window_seconds: float = 0.5
    consumer_group_id: str | None = None
    source_arn: str | None = None
    bootstrap_servers: str | None = None
    filter: EventFilter | None = None
    enabled: bool = True


@dataclass(frozen=True)
class ScheduleEventSpec:
    """A `Schedule`/`ScheduleV2` event: an EventBridge rule invoking the function asynchronously."""

    name: str
    expression: str
    period_seconds: float | None
    input: Any = None
    enabled: bool = True


@dataclass(frozen=True)
class StreamEventSpec:
    """A `DynamoDB` event: a table's stream read in order, retried on error."""

    name: str
    stream_arn: str
    starting_position: str = "TRIM_HORIZON"
    batch_size: int = 100
    batching_window_seconds: float = 0.0
    report_batch_item_failures: bool = False
    maximum_retry_attempts: int = -1
    maximum_record_age_seconds: int = -1
    bisect_on_error: bool = False
    on_failure_arn: str | None = None
    filter: EventFilter | None = None
    enabled: bool = True


EventSpec = SqsEventSpec | KafkaEventSpec | ScheduleEventSpec | StreamEventSpec


@dataclass(frozen=True)
class FunctionSpec:
    """One `AWS::Lambda::Function` (SAM's `Globals` merged in), intrinsics resolved, with its
    event sources and its asynchronous invocation settings."""

    logical_id: str
    name: str
    arn: str
    code_uri: str
    handler: str
    timeout_seconds: float
    memory_mb: int
    environment: Mapping[str, str]
    events: tuple[EventSpec, ...]
    dead_letter_arn: str | None = None
    async_retry_attempts: int = ASYNC_DEFAULT_RETRY_ATTEMPTS
    async_on_failure_arn: str | None = None
    # The policy documents of its execution role, resolved (None: the role is not one of the
    # template's, so its calls are not checked; see `delayq_local.iam`).
    role_policies: tuple[Mapping[str, Any], ...] | None = None

    def handler_location(self, root: Path) -> tuple[Path, str]:
        """The handler's source file (under `root`, the template's folder) and function name."""
        module, _, attribute = self.handler.rpartition(".")
        if not module or not attribute:
            raise TemplateError(f"{self.logical_id}: Handler {self.handler!r} is not module.func")
        return root / self.code_uri / (module.replace(".", "/") + ".py"), attribute


def function_spec(
    logical_id: str, name: str, arn: str, properties: Mapping[str, Any]
) -> FunctionSpec:
    """Build a `FunctionSpec` from an `AWS::Lambda::Function`'s resolved properties."""
    code = properties.get("Code") or {}
    if code.get("S3Bucket") != LOCAL_CODE_BUCKET:
        raise TemplateError(f"{logical_id}: CodeUri must be a local path to run locally")
    if "Handler" not in properties:
        raise TemplateError(f"{logical_id}: no Handler")
    variables = (properties.get("Environment") or {}).get("Variables") or {}
    return FunctionSpec(
        logical_id=logical_id,
        name=name,
        arn=arn,
        code_uri=str(code.get("S3Key") or "."),
        handler=str(properties["Handler"]),
        timeout_seconds=float(properties.get("Timeout", LAMBDA_DEFAULT_TIMEOUT_SECONDS)),
        memory_mb=int(properties.get("MemorySize", LAMBDA_DEFAULT_MEMORY_MB)),
        environment={str(k): env_string(v) for k, v in variables.items()},
        events=(),
        dead_letter_arn=(properties.get("DeadLetterConfig") or {}).get("TargetArn"),
    )


def with_invoke_config(spec: FunctionSpec, properties: Mapping[str, Any]) -> FunctionSpec:
    """`spec` with an `AWS::Lambda::EventInvokeConfig`'s retries and on-failure destination."""
    on_failure = (properties.get("DestinationConfig") or {}).get("OnFailure") or {}
    return replace(
        spec,
        async_retry_attempts=int(
            properties.get("MaximumRetryAttempts", ASYNC_DEFAULT_RETRY_ATTEMPTS)
        ),
        async_on_failure_arn=on_failure.get("Destination"),
    )


def mapping_event(name: str, props: Mapping[str, Any]) -> EventSpec:
    """An `AWS::Lambda::EventSourceMapping` as the event source it is, by its source's kind."""
    arn = str(props.get("EventSourceArn") or "")
    if "SelfManagedEventSource" in props:
        endpoints = props["SelfManagedEventSource"].get("Endpoints") or {}
        config = props.get("SelfManagedKafkaEventSourceConfig") or {}
        return _kafka(
            name, "SelfManagedKafka", props, endpoints.get("KafkaBootstrapServers"), config
        )
    service = arn.split(":")[2] if arn.count(":") >= 2 else ""
    if service == "kafka":
        config = props.get("AmazonManagedKafkaEventSourceConfig") or {}
        return _kafka(name, "MSK", props, None, config)
    if service == "sqs":
        return _sqs(name, props)
    if service == "dynamodb":
        return _stream(name, props)
    raise TemplateError(f"{name}: event source {arn or '?'} is not emulated")


def schedule_event(name: str, expression: str, state: Any, raw_input: Any) -> ScheduleEventSpec:
    """A schedule (an `AWS::Events::Rule` or an `AWS::Scheduler::Schedule`) of one function:
    its expression, `State`, and the target's `Input` (JSON text)."""
    try:
        payload = json.loads(raw_input) if isinstance(raw_input, str) else raw_input
    except json.JSONDecodeError as e:
        raise TemplateError(f"{name}: schedule Input is not JSON") from e
    return ScheduleEventSpec(
        name=name,
        expression=expression,
        period_seconds=rate_seconds(expression),
        input=payload,
        enabled=str(state or "ENABLED").upper() == "ENABLED",
    )


def env_string(value: Any) -> str:
    """How CloudFormation renders a scalar in `Environment.Variables`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_UNIT_SECONDS: Final = {"minute": 60, "hour": 3600, "day": 86400}


def rate_seconds(expression: str) -> float | None:
    """The period of a `rate(...)` expression in seconds; None for `cron(...)`/`at(...)`."""
    match = _RATE.match(expression.strip())
    if match is None:
        if expression.strip().startswith(("cron(", "at(")):
            return None
        raise TemplateError(f"bad schedule expression {expression!r}")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2).rstrip("s")])


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _enabled(props: Mapping[str, Any]) -> bool:
    return _bool(props.get("Enabled", True))


def _reports_item_failures(props: Mapping[str, Any]) -> bool:
    return "ReportBatchItemFailures" in (props.get("FunctionResponseTypes") or [])


def _sqs(name: str, props: Mapping[str, Any]) -> SqsEventSpec:
    scaling = props.get("ScalingConfig") or {}
    concurrency = scaling.get("MaximumConcurrency")
    return SqsEventSpec(
        name=name,
        queue_arn=str(props["EventSourceArn"]),
        batch_size=int(props.get("BatchSize", 10)),
        batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        report_batch_item_failures=_reports_item_failures(props),
        maximum_concurrency=int(concurrency) if concurrency is not None else None,
        filter=EventFilter.from_criteria(props.get("FilterCriteria")),
        enabled=_enabled(props),
    )


def _kafka(
    name: str,
    kind: str,
    props: Mapping[str, Any],
    servers: list[str] | None,
    config: Mapping[str, Any],
) -> KafkaEventSpec:
    topics = props.get("Topics") or []
    group = config.get("ConsumerGroupId")
    return KafkaEventSpec(
        name=name,
        kind=kind,
        topics=tuple(str(t) for t in topics),
        starting_position=str(props.get("StartingPosition", "LATEST")),
        batch_size=int(props.get("BatchSize", 100)),
        batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0.5)),
        consumer_group_id=str(group) if group else None,
        source_arn=str(props["EventSourceArn"]) if props.get("EventSourceArn") else None,
        bootstrap_servers=",".join(servers) if servers else None,
        filter=EventFilter.from_criteria(props.get("FilterCriteria")),
        enabled=_enabled(props),
    )


def _stream(name: str, props: Mapping[str, Any]) -> StreamEventSpec:
    destination = (props.get("DestinationConfig") or {}).get("OnFailure") or {}
    return StreamEventSpec(
        name=name,
        stream_arn=str(props["EventSourceArn"]),
        starting_position=str(props.get("StartingPosition", "TRIM_HORIZON")),
        batch_size=int(props.get("BatchSize", 100)),
        batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        report_batch_item_failures=_reports_item_failures(props),
        maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
        maximum_record_age_seconds=int(props.get("MaximumRecordAgeInSeconds", -1)),
        bisect_on_error=_bool(props.get("BisectBatchOnFunctionError", False)),
        on_failure_arn=destination.get("Destination"),
        filter=EventFilter.from_criteria(props.get("FilterCriteria")),
        enabled=_enabled(props),
    )
