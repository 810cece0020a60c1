"""Provisioning the template's resources on moto, and resolving its functions."""

from __future__ import annotations

import json

import pytest

from delayq_local import (
    AwsEndpoint,
    Deployment,
    MotoServer,
    ProvisionError,
    Template,
    TemplateError,
    load_template,
    loads_template,
    provision,
    reachable,
)
from delayq_local.provision import resource_rule
from delayq_local.specs import KafkaEventSpec, ScheduleEventSpec, SqsEventSpec, StreamEventSpec
from tests.integration.support import PROJECT_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The resources the local stack must provision; the real template must have them too.
EXPECTED_RESOURCES = {
    "MessageTable": "AWS::DynamoDB::Table",
    "DelayQueue": "AWS::SQS::Queue",
    "DelayDeadLetterQueue": "AWS::SQS::Queue",
    "TickQueue": "AWS::SQS::Queue",
    "TickDeadLetterQueue": "AWS::SQS::Queue",
    "RejectQueue": "AWS::SQS::Queue",
    "TimerDeadLetterQueue": "AWS::SQS::Queue",
    "PayloadBucket": "AWS::S3::Bucket",
    "AnalyticsBucket": "AWS::S3::Bucket",
}
CREATED_TYPES = {"AWS::SQS::Queue", "AWS::DynamoDB::Table", "AWS::S3::Bucket"}
EXPECTED_FUNCTIONS = {
    "IngestFunction": KafkaEventSpec,
    "TimerFunction": ScheduleEventSpec,
    "SchedulerFunction": SqsEventSpec,
    "EmitterFunction": SqsEventSpec,
    "CleanupFunction": StreamEventSpec,
}


def queue_attributes(endpoint: AwsEndpoint, url: str) -> dict[str, str]:
    attributes: dict[str, str] = endpoint.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["All"]
    )["Attributes"]
    return attributes


def test_the_moto_server_answers_on_loopback(moto_server: MotoServer) -> None:
    assert moto_server.endpoint_url.startswith("http://127.0.0.1:")
    assert reachable(moto_server.endpoint_url)


def test_reachable_is_false_for_a_closed_port() -> None:
    assert not reachable("127.0.0.1:1")
    assert not reachable("not a url")


def test_queues_get_their_template_attributes(
    deployment: Deployment, endpoint: AwsEndpoint
) -> None:
    tick = queue_attributes(endpoint, deployment.resources["TickQueue"].ref)
    delay = queue_attributes(endpoint, deployment.resources["DelayQueue"].ref)
    tick_dlq = deployment.resources["TickDeadLetterQueue"]

    assert deployment.resources["TickQueue"].ref.endswith(f"/{deployment.stack_name}-tick.fifo")
    assert tick["FifoQueue"] == "true"
    assert tick["ContentBasedDeduplication"] == "false"
    assert tick["VisibilityTimeout"] == "120"
    assert json.loads(tick["RedrivePolicy"]) == {
        "deadLetterTargetArn": tick_dlq.attributes["Arn"],
        "maxReceiveCount": 3,
    }
    assert tick_dlq.attributes["QueueName"] == f"{deployment.stack_name}-TickDeadLetterQueue.fifo"
    assert delay["VisibilityTimeout"] == "180"
    assert json.loads(delay["RedrivePolicy"])["maxReceiveCount"] == 5


def test_the_table_gets_keys_ttl_and_stream(deployment: Deployment, endpoint: AwsEndpoint) -> None:
    dynamodb = endpoint.client("dynamodb")
    name = deployment.resources["MessageTable"].ref

    table = dynamodb.describe_table(TableName=name)["Table"]
    ttl = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]

    assert name == f"{deployment.stack_name}-messages"
    assert {(k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]} == {
        ("pk", "HASH"),
        ("sk", "RANGE"),
    }
    assert table["StreamSpecification"] == {
        "StreamEnabled": True,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}
    assert deployment.resources["MessageTable"].attributes["StreamArn"] == table["LatestStreamArn"]


def test_buckets_are_named_after_the_stack(deployment: Deployment, endpoint: AwsEndpoint) -> None:
    names = {b["Name"] for b in endpoint.client("s3").list_buckets()["Buckets"]}

    assert f"{deployment.stack_name}-payloadbucket".lower() in names
    assert f"{deployment.stack_name}-analyticsbucket".lower() in names


def test_function_environments_point_at_the_created_resources(deployment: Deployment) -> None:
    resources = deployment.resources
    emitter = deployment.functions["EmitterFunction"].environment
    ingest = deployment.functions["IngestFunction"].environment

    assert emitter["DELAYQ_DELAY_QUEUE_URL"] == resources["DelayQueue"].ref
    assert emitter["DELAYQ_TABLE_NAME"] == resources["MessageTable"].ref  # from Globals
    assert emitter["DELAYQ_PAYLOAD_BUCKET"] == resources["PayloadBucket"].ref
    assert emitter["POWERTOOLS_SERVICE_NAME"] == "delayq-emitter"  # the function wins
    assert "DELAYQ_KAFKA_SECRET_ARN" not in emitter  # !If [..., AWS::NoValue]
    assert ingest["POWERTOOLS_SERVICE_NAME"] == "delayq"
    assert ingest["DELAYQ_MAX_DELAY_SECONDS"] == "604800"
    assert ingest["DELAYQ_HORIZON_SECONDS"] == "900"
    assert deployment.functions["IngestFunction"].timeout_seconds == 60
    assert (
        deployment.functions["TimerFunction"].dead_letter_arn
        == (resources["TimerDeadLetterQueue"].attributes["Arn"])
    )


def test_event_sources_are_parsed_with_lambda_defaults(deployment: Deployment) -> None:
    (ingest,) = deployment.functions["IngestFunction"].events
    (timer,) = deployment.functions["TimerFunction"].events
    (scheduler,) = deployment.functions["SchedulerFunction"].events
    (emitter,) = deployment.functions["EmitterFunction"].events
    (cleanup,) = deployment.functions["CleanupFunction"].events

    assert isinstance(ingest, KafkaEventSpec)
    assert (ingest.name, ingest.kind) == ("IngestMskEventSource", "MSK")
    assert ingest.topics == ("delay-requests",)
    assert ingest.source_arn == "arn:aws:kafka:us-east-1:123456789012:cluster/demo/abc-1"
    assert ingest.consumer_group_id == f"{deployment.stack_name}-ingest"
    assert ingest.batching_window_seconds == 0.5
    assert isinstance(timer, ScheduleEventSpec)
    assert timer.period_seconds == 60
    assert isinstance(scheduler, SqsEventSpec)
    assert (scheduler.batch_size, scheduler.report_batch_item_failures) == (1, True)
    assert scheduler.queue_arn == deployment.resources["TickQueue"].attributes["Arn"]
    assert isinstance(emitter, SqsEventSpec)
    assert emitter.maximum_concurrency == 50
    assert isinstance(cleanup, StreamEventSpec)
    assert cleanup.stream_arn == deployment.resources["MessageTable"].attributes["StreamArn"]
    assert cleanup.on_failure_arn == deployment.resources["CleanupFailureQueue"].attributes["Arn"]
    assert cleanup.filter is not None
    assert cleanup.filter.matches(
        {
            "eventName": "REMOVE",
            "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
        }
    )
    assert not cleanup.filter.matches({"eventName": "REMOVE"})


def test_a_condition_selects_the_self_managed_kafka_mapping(
    fixture_template: Template, endpoint: AwsEndpoint, stack_name: str
) -> None:
    deployment = provision(
        fixture_template,
        stack_name,
        endpoint,
        {"KafkaSource": "SelfManagedKafka", "KafkaBootstrapServers": "b1:9092,b2:9092"},
    )

    (ingest,) = deployment.functions["IngestFunction"].events
    assert isinstance(ingest, KafkaEventSpec)
    assert (ingest.kind, ingest.batch_size) == ("SelfManagedKafka", 50)
    assert ingest.bootstrap_servers == "b1:9092,b2:9092"


def test_outputs_resolve_and_conditions_exclude_resources(
    fixture_template: Template, endpoint: AwsEndpoint, stack_name: str
) -> None:
    deployment = provision(fixture_template, stack_name, endpoint, {"EnableAnalytics": "false"})

    assert "AnalyticsBucket" not in deployment.resources
    assert "AnalyticsBucketName" not in deployment.outputs
    assert deployment.outputs["DelayQueueUrl"] == deployment.resources["DelayQueue"].ref


def test_provisioning_twice_reuses_the_resources(
    fixture_template: Template, deployment: Deployment, endpoint: AwsEndpoint
) -> None:
    again = provision(fixture_template, deployment.stack_name, endpoint)

    assert {k: r.ref for k, r in again.resources.items()} == {
        k: r.ref for k, r in deployment.resources.items()
    }


def test_an_endpoint_refusal_is_a_provision_error(endpoint: AwsEndpoint, stack_name: str) -> None:
    template = loads_template(
        "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n    Properties: {QueueName: 'no spaces!'}\n"
    )

    with pytest.raises(ProvisionError, match="Q: create queue"):
        provision(template, stack_name, endpoint)


def test_a_bad_stack_name_is_refused(fixture_template: Template, endpoint: AwsEndpoint) -> None:
    with pytest.raises(TemplateError, match="stack name"):
        provision(fixture_template, "no spaces allowed", endpoint)


@pytest.mark.skipif(
    not (PROJECT_ROOT / "template.yaml").exists(), reason="template.yaml not written yet"
)
def test_the_real_template_provisions_and_wires_every_function(
    endpoint: AwsEndpoint, stack_name: str
) -> None:
    template = load_template(PROJECT_ROOT / "template.yaml")
    deployment = provision(
        template,
        stack_name,
        endpoint,
        {
            "AllowedTargets": "demo.*",
            "KafkaSource": "SelfManagedKafka",
            "KafkaSecurity": "PLAINTEXT",
            "KafkaBootstrapServers": "127.0.0.1:9092",
        },
    )

    for logical_id, resource_type in EXPECTED_RESOURCES.items():
        assert deployment.resources[logical_id].type == resource_type
    for logical_id, event_type in EXPECTED_FUNCTIONS.items():
        spec = deployment.functions[logical_id]
        assert any(isinstance(e, event_type) for e in spec.events), logical_id
        path, attribute = spec.handler_location(PROJECT_ROOT)
        assert path.is_file(), path
        assert attribute == "handler"
        assert spec.environment["DELAYQ_LOOKAHEAD_SECONDS"] == "840"  # from Globals
    created = set(deployment.resources)
    assert created == {k for k, r in template.resources.items() if r["Type"] in CREATED_TYPES}
    assert "invokes no function" in deployment.skipped["DailyExportSchedule"]
    assert {"IngestRole", "DeliveryReportJob", "DelayQueueAgeAlarm"} <= set(deployment.skipped)
    # The Glue code upload is CloudFormation's business at deploy time: neither the custom
    # resource nor its function (nor the function's published version) runs locally.
    assert "deploy-time action" in deployment.skipped["GlueCode"]
    assert deployment.skipped["GlueCodeFunction"] == "runs at deploy time only, for GlueCode"
    assert "GlueCodeFunction" not in deployment.functions
    assert set(deployment.functions) == set(EXPECTED_FUNCTIONS)


def test_every_resource_type_has_a_rule_and_unknown_types_are_refused() -> None:
    assert resource_rule("AWS::SQS::Queue") == ("create", "")
    assert resource_rule("AWS::Lambda::EventSourceMapping") == ("run", "")
    assert resource_rule("AWS::CloudWatch::Dashboard")[0] == "skip"  # by service
    assert resource_rule("AWS::S3::BucketPolicy")[0] == "skip"  # by type
    assert resource_rule("AWS::CloudFormation::CustomResource")[0] == "skip"
    assert resource_rule("Custom::Anything") == resource_rule("AWS::CloudFormation::CustomResource")
    assert resource_rule("AWS::Lambda::Version")[0] == "skip"
    with pytest.raises(TemplateError, match=r"no rule for AWS::Pipes::Pipe"):
        resource_rule("AWS::Pipes::Pipe")


def test_a_template_with_an_unknown_resource_type_is_refused(
    endpoint: AwsEndpoint, stack_name: str
) -> None:
    template = loads_template("Resources:\n  P:\n    Type: AWS::Pipes::Pipe\n")

    with pytest.raises(TemplateError, match="no rule for AWS::Pipes::Pipe"):
        provision(template, stack_name, endpoint)


def test_event_sources_keep_the_names_of_their_sam_events(deployment: Deployment) -> None:
    names = {
        logical_id: [event.name for event in spec.events]
        for logical_id, spec in deployment.functions.items()
    }

    assert names == {
        "IngestFunction": ["IngestMskEventSource"],  # a mapping resource: its logical id
        "TimerFunction": ["Tick"],
        "SchedulerFunction": ["Ticks"],
        "EmitterFunction": ["Due"],
        "CleanupFunction": ["Expired"],
    }


SCHEDULES = """
Transform: AWS::Serverless-2016-10-31
Resources:
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/timer/
      Handler: app.handler
      Runtime: python3.12
      Events:
        Rule:
          Type: Schedule
          Properties:
            Schedule: rate(5 minutes)
            Input: '{"source": "rule"}'
        Scheduler:
          Type: ScheduleV2
          Properties:
            ScheduleExpression: rate(1 hour)
            State: DISABLED
  Export:
    Type: AWS::Scheduler::Schedule
    Properties:
      ScheduleExpression: rate(1 day)
      FlexibleTimeWindow: {Mode: "OFF"}
      Target:
        Arn: arn:aws:scheduler:::aws-sdk:dynamodb:exportTableToPointInTime
        RoleArn: arn:aws:iam::123456789012:role/export
"""


def test_schedules_that_invoke_a_function_are_run_and_others_are_skipped(
    endpoint: AwsEndpoint, stack_name: str
) -> None:
    deployment = provision(loads_template(SCHEDULES), stack_name, endpoint)

    rule, scheduler = deployment.functions["Fn"].events
    assert isinstance(rule, ScheduleEventSpec)
    assert (rule.name, rule.period_seconds, rule.input, rule.enabled) == (
        "Rule",
        300,
        {"source": "rule"},
        True,
    )
    assert isinstance(scheduler, ScheduleEventSpec)
    assert (scheduler.name, scheduler.period_seconds, scheduler.enabled) == (
        "Scheduler",
        3600,
        False,
    )
    assert "invokes no function" in deployment.skipped["Export"]
    assert "permissions" in deployment.skipped["FnRole"]  # the role SAM made for the function


def test_the_sam_translator_refusal_is_a_template_error(
    endpoint: AwsEndpoint, stack_name: str
) -> None:
    template = loads_template(
        "Transform: AWS::Serverless-2016-10-31\nResources:\n"
        "  Fn:\n    Type: AWS::Serverless::Function\n    Properties: {Handler: app.handler}\n"
    )

    with pytest.raises(TemplateError, match="Invalid Serverless Application"):
        provision(template, stack_name, endpoint)
