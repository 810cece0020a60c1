"""The local runner: the product end to end on one machine, through the real protocols.

moto in server mode stands in for AWS, librdkafka's mock cluster for Kafka, and emulated event
sources invoke the handlers the way Lambda does. See `EmbeddedStack`.
"""

from delayq_local.aws import AwsEndpoint, MotoServer, reachable
from delayq_local.exceptions import (
    HandlerLoadError,
    KafkaMockError,
    LocalStackError,
    ProvisionError,
    TemplateError,
)
from delayq_local.filters import EventFilter
from delayq_local.kafka_mock import ApiKey, MockKafkaCluster
from delayq_local.provision import Deployment, ProvisionedResource, provision
from delayq_local.sandbox import LambdaContext, LocalFunction, load_handler
from delayq_local.stack import EmbeddedStack, StackConfig, TimeCompression
from delayq_local.template import Template, load_template, loads_template

__all__ = [
    "ApiKey",
    "AwsEndpoint",
    "Deployment",
    "EmbeddedStack",
    "EventFilter",
    "HandlerLoadError",
    "KafkaMockError",
    "LambdaContext",
    "LocalFunction",
    "LocalStackError",
    "MockKafkaCluster",
    "MotoServer",
    "ProvisionError",
    "ProvisionedResource",
    "StackConfig",
    "Template",
    "TemplateError",
    "TimeCompression",
    "load_handler",
    "load_template",
    "loads_template",
    "provision",
    "reachable",
]
