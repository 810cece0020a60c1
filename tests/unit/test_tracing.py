"""delayq.tracing: the handlers are traced only with Tracing=Active, and cost nothing otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import aws_lambda_powertools
import pytest

from delayq import buckets
from delayq import constants as c
from delayq.settings import tracing_enabled
from delayq.tracing import traced
from testkit.clock import FakeClock
from testkit.lambda_context import LambdaContext
from tests.factories import AwsResources, load_handler
from tests.template.conftest import FUNCTIONS

IN_LAMBDA = {"LAMBDA_TASK_ROOT": "/var/task"}


class RecordingTracer:
    """Stands in for Powertools Tracer: records what it wraps, and each call."""

    instances: ClassVar[list[RecordingTracer]] = []

    def __init__(self) -> None:
        self.wrapped: list[tuple[Callable[..., Any], dict[str, Any]]] = []
        self.calls = 0
        RecordingTracer.instances.append(self)

    def capture_lambda_handler(
        self, handler: Callable[..., Any], **options: Any
    ) -> Callable[..., Any]:
        self.wrapped.append((handler, options))

        def wrapper(event: Any, context: Any) -> Any:
            self.calls += 1
            return handler(event, context)

        return wrapper


class ExplodingTracer:
    def __init__(self) -> None:
        raise AssertionError("Tracer must not be built when tracing is disabled")


def echo(event: Any, context: Any) -> Any:
    return {"event": event}


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({"POWERTOOLS_TRACE_DISABLED": "false", **IN_LAMBDA}, True),
        ({"POWERTOOLS_TRACE_DISABLED": "False ", **IN_LAMBDA}, True),
        ({"POWERTOOLS_TRACE_DISABLED": "0", **IN_LAMBDA}, True),
        ({"POWERTOOLS_TRACE_DISABLED": "true", **IN_LAMBDA}, False),
        ({"POWERTOOLS_TRACE_DISABLED": "", **IN_LAMBDA}, False),
        # The template always sets it; without it, tracing stays off.
        (IN_LAMBDA, False),
        # Outside Lambda (tests, the local stack) there is no X-Ray daemon to send to.
        ({"POWERTOOLS_TRACE_DISABLED": "false"}, False),
        ({}, False),
    ],
)
def test_tracing_is_on_only_in_lambda_when_the_variable_says_false(
    environ: dict[str, str], enabled: bool
) -> None:
    assert tracing_enabled(environ) is enabled


def test_disabled_tracing_returns_the_handler_itself() -> None:
    def explode() -> Any:
        raise AssertionError("no tracer when disabled")

    environ = {"POWERTOOLS_TRACE_DISABLED": "true", **IN_LAMBDA}

    assert traced(echo, environ=environ, tracer_factory=explode) is echo


def test_enabled_tracing_wraps_the_handler_and_records_no_response() -> None:
    tracer = RecordingTracer()
    environ = {"POWERTOOLS_TRACE_DISABLED": "false", **IN_LAMBDA}

    wrapped = traced(echo, environ=environ, tracer_factory=lambda: tracer)

    assert wrapped is not echo
    assert wrapped({"a": 1}, None) == {"event": {"a": 1}}
    assert tracer.calls == 1
    assert tracer.wrapped == [(echo, {"capture_response": False})]


def test_enabled_tracing_uses_powertools_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aws_lambda_powertools, "Tracer", RecordingTracer)
    environ = {"POWERTOOLS_TRACE_DISABLED": "false", **IN_LAMBDA}

    wrapped = traced(echo, environ=environ)

    assert wrapped is not echo
    assert RecordingTracer.instances[-1].wrapped[0][0] is echo


@pytest.mark.parametrize("name", FUNCTIONS.values())
def test_each_handler_is_traced_exactly_when_enabled(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setattr(aws_lambda_powertools, "Tracer", ExplodingTracer)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    load_handler(name)  # no Tracer built

    monkeypatch.setattr(aws_lambda_powertools, "Tracer", RecordingTracer)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "false")
    before = len(RecordingTracer.instances)
    load_handler(name)
    [tracer] = RecordingTracer.instances[before:]
    [(inner, options)] = tracer.wrapped
    assert inner.__name__ == "handler"
    assert options == {"capture_response": False}


def test_a_handler_runs_with_tracing_disabled_in_lambda(
    aws: AwsResources,
    clock: FakeClock,
    lambda_context: LambdaContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the template configures a Tracing=Disabled stack, inside Lambda.
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setattr(aws_lambda_powertools, "Tracer", ExplodingTracer)
    monkeypatch.setenv(c.ENV_TICK_QUEUE_URL, aws.settings.tick_queue_url)
    monkeypatch.setenv(c.ENV_TABLE_NAME, aws.settings.table_name)
    app = load_handler("timer")
    monkeypatch.setattr(app, "clock", clock)

    result = app.handler({"source": "aws.events"}, lambda_context)

    assert result == {"tick": f"tick-{buckets.tick_index(clock.now_ms, aws.settings.tick_seconds)}"}
    assert (
        aws.sqs.get_queue_attributes(
            QueueUrl=aws.settings.tick_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "1"
    )
