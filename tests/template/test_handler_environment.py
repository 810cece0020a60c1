"""Each handler starts (cold start: settings parsed, clients built) with exactly the environment
the template gives its function, and nothing else.

The environment is the template's (Globals merged with the function's variables), resolved as
CloudFormation would for a default MSK IAM stack: resource references become names and URLs,
parameters their defaults. A handler that needs a variable its function does not get fails
here, before it fails in AWS at its first invocation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from delayq import runtime
from tests.factories import load_handler
from tests.template.conftest import FUNCTIONS

STACK = "delayq-test"
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/{}"
RESOURCE_VALUES = {
    "MessageTable": f"{STACK}-MessageTable-1QZ8XK2M4N6P",
    "DelayQueue": QUEUE_URL.format(f"{STACK}-DelayQueue-3V5T7R9P1N2M"),
    "DelayHighQueue": QUEUE_URL.format(f"{STACK}-DelayHighQueue-6Q8S0U2W4Y6A"),
    "DelayLowQueue": QUEUE_URL.format(f"{STACK}-DelayLowQueue-7R9T1V3X5Z7B"),
    "TickQueue": QUEUE_URL.format(f"{STACK}-TickQueue-8JX2K4M6N1PQ.fifo"),
    "RejectQueue": QUEUE_URL.format(f"{STACK}-RejectQueue-5B7N9M1K3J5H"),
    "DelayDeadLetterQueue": QUEUE_URL.format(f"{STACK}-DelayDeadLetterQueue-2C4E6G8J0L1N"),
    "PayloadBucket": f"{STACK}-payloadbucket-1x2y3z4w5v6u",
    "AWS::StackName": STACK,
}
# Parameters without a default, as an operator would pass them.
REQUIRED_PARAMETERS = {
    "AllowedTargets": "orders.*,reminders",
    "KafkaBootstrapServers": "b-1.delayq.x7k2pq.c2.kafka.us-east-1.amazonaws.com:9098",
}
# The conditions function variables depend on, for the default (MSK IAM) stack.
CONDITIONS = {"UsesScram": False, "TracingActive": False}


def resolve(value: Any, parameters: dict[str, Any]) -> str:
    if isinstance(value, dict) and "Ref" in value:
        name = value["Ref"]
        if name in RESOURCE_VALUES:
            return RESOURCE_VALUES[name]
        return str(REQUIRED_PARAMETERS.get(name, parameters[name].get("Default")))
    if isinstance(value, dict) and "Fn::If" in value:
        condition, then, otherwise = value["Fn::If"]
        return resolve(then if CONDITIONS[condition] else otherwise, parameters)
    assert isinstance(value, str | int), f"unresolvable in this test: {value!r}"
    return str(value)


def environment(template: dict[str, Any], logical_id: str) -> dict[str, str]:
    variables = {
        **template["Globals"]["Function"]["Environment"]["Variables"],
        **template["Resources"][logical_id]["Properties"]["Environment"]["Variables"],
    }
    return {k: resolve(v, template["Parameters"]) for k, v in variables.items()}


@pytest.fixture
def function_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No DELAYQ_* variable leaks in from the caller's shell; moto stands in for AWS."""
    for name in list(os.environ):
        if name.startswith("DELAYQ_"):
            monkeypatch.delenv(name)
    # The Kafka producer is not the subject here (and would try to reach the brokers).
    monkeypatch.setattr(runtime, "make_producer", lambda settings, secrets=None, cb=None: object())
    with mock_aws():
        yield


@pytest.mark.usefixtures("function_environment")
@pytest.mark.parametrize(("logical_id", "name"), FUNCTIONS.items())
def test_handler_cold_start_accepts_the_template_environment(
    template: dict[str, Any], monkeypatch: pytest.MonkeyPatch, logical_id: str, name: str
) -> None:
    for variable, value in environment(template, logical_id).items():
        monkeypatch.setenv(variable, value)
    handler = load_handler(name)
    # Every handler builds its settings and clients once, in _setup() (cached per container).
    setup = handler._setup()
    assert setup is not None
