"""The wiring of template.yaml: event sources, environment, dead-letter paths, encryption, IAM.

Each test states one property of the stack and fails when the template loses it. The template
is read as written (before the SAM transform), so the checks talk about the resources by the
logical ids that docs/internals.md, the local runner and the operators use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from bench.cost import PAYLOAD_RETENTION_DAYS
from delayq import constants as c
from delayq import telemetry
from delayq.constants import DEFAULT_EMIT_LEAD_MS
from delayq.control_clock import CLOCK_PK_PREFIX
from delayq.settings import Settings
from delayq_reports.options import DeliveryReportOptions
from sim.functions import TIMEOUT_S
from sim.scale import LAMBDA_FULL_VCPU_MB
from sim.sources import stream
from tests.template.conftest import FUNCTIONS, ROOT

# The variables that name a stack resource, and the resource each must point at.
RESOURCE_VARIABLES = {
    c.ENV_TABLE_NAME: {"Ref": "MessageTable"},
    c.ENV_DELAY_QUEUE_URL: {"Ref": "DelayQueue"},
    c.ENV_DELAY_QUEUE_HIGH_URL: {"Ref": "DelayHighQueue"},
    c.ENV_DELAY_QUEUE_LOW_URL: {"Ref": "DelayLowQueue"},
    c.ENV_TICK_QUEUE_URL: {"Ref": "TickQueue"},
    c.ENV_REJECT_QUEUE_URL: {"Ref": "RejectQueue"},
    c.ENV_PAYLOAD_BUCKET: {"Ref": "PayloadBucket"},
    c.ENV_DELAY_DLQ_URL: {"Ref": "DelayDeadLetterQueue"},
}

# The delay queues, one per priority class: every function that queues messages gets all three.
DELAY_QUEUES = {
    c.ENV_DELAY_QUEUE_URL: {"Ref": "DelayQueue"},
    c.ENV_DELAY_QUEUE_HIGH_URL: {"Ref": "DelayHighQueue"},
    c.ENV_DELAY_QUEUE_LOW_URL: {"Ref": "DelayLowQueue"},
}
DELAY_QUEUE_ARNS = [
    {"Fn::GetAtt": ["DelayQueue", "Arn"]},
    {"Fn::GetAtt": ["DelayHighQueue", "Arn"]},
    {"Fn::GetAtt": ["DelayLowQueue", "Arn"]},
]

# Exactly the function-level variables each function gets (least exposure).
FUNCTION_VARIABLES = {
    "IngestFunction": {
        c.ENV_TABLE_NAME: {"Ref": "MessageTable"},
        **DELAY_QUEUES,
        c.ENV_REJECT_QUEUE_URL: {"Ref": "RejectQueue"},
        c.ENV_PAYLOAD_BUCKET: {"Ref": "PayloadBucket"},
        c.ENV_ALLOWED_TARGETS: {"Ref": "AllowedTargets"},
        c.ENV_MAX_PAYLOAD_BYTES: {"Ref": "MaxPayloadBytes"},
        c.ENV_OFFLOAD_THRESHOLD_BYTES: {"Ref": "OffloadThresholdBytes"},
        c.ENV_INGEST_TIMEOUT_SECONDS: "60",
        c.ENV_DIRECT_WINDOW_MS: {"Ref": "DirectWindowMs"},
        c.ENV_TENANT_LIMITS: {"Ref": "TenantLimits"},
        c.ENV_KAFKA_BOOTSTRAP: {"Ref": "KafkaBootstrapServers"},
        c.ENV_KAFKA_SECURITY: {"Ref": "KafkaSecurity"},
        c.ENV_KAFKA_SECRET_ARN: {"Fn::If": ["UsesScram", {"Ref": "KafkaSecretArn"}, ""]},
    },
    "TimerFunction": {
        c.ENV_TICK_QUEUE_URL: {"Ref": "TickQueue"},
    },
    "SchedulerFunction": {
        c.ENV_TABLE_NAME: {"Ref": "MessageTable"},
        **DELAY_QUEUES,
    },
    "EmitterFunction": {
        c.ENV_TABLE_NAME: {"Ref": "MessageTable"},
        **DELAY_QUEUES,
        c.ENV_DELAY_DLQ_URL: {"Ref": "DelayDeadLetterQueue"},
        c.ENV_REJECT_QUEUE_URL: {"Ref": "RejectQueue"},
        c.ENV_PAYLOAD_BUCKET: {"Ref": "PayloadBucket"},
        c.ENV_ALLOWED_TARGETS: {"Ref": "AllowedTargets"},
        c.ENV_MAX_PAYLOAD_BYTES: {"Ref": "MaxPayloadBytes"},
        c.ENV_TENANT_LIMITS: {"Ref": "TenantLimits"},
        c.ENV_KAFKA_BOOTSTRAP: {"Ref": "KafkaBootstrapServers"},
        c.ENV_KAFKA_SECURITY: {"Ref": "KafkaSecurity"},
        c.ENV_KAFKA_SECRET_ARN: {"Fn::If": ["UsesScram", {"Ref": "KafkaSecretArn"}, ""]},
    },
    "CleanupFunction": {
        c.ENV_TABLE_NAME: {"Ref": "MessageTable"},
        **DELAY_QUEUES,
    },
}

# Settings every function shares (Globals), each from the parameter of the same meaning.
GLOBAL_SETTINGS = {
    c.ENV_LOOKAHEAD_SECONDS: "LookaheadSeconds",
    c.ENV_TICK_SECONDS: "TickSeconds",
    c.ENV_SHARDS: "Shards",
    c.ENV_MAX_DELAY_SECONDS: "MaxDelaySeconds",
    c.ENV_TTL_GRACE_SECONDS: "TtlGraceSeconds",
    c.ENV_STRICT_CAPS: "StrictReleaseCaps",
    "LOG_LEVEL": "LogLevel",
}

# Parameter defaults that must equal the code's defaults (delayq.constants).
PARAMETER_DEFAULTS = {
    "DirectWindowMs": c.DEFAULT_DIRECT_WINDOW_MS,
    "LookaheadSeconds": c.DEFAULT_LOOKAHEAD_SECONDS,
    "TickSeconds": c.DEFAULT_TICK_SECONDS,
    "Shards": c.DEFAULT_SHARDS,
    "MaxDelaySeconds": c.DEFAULT_MAX_DELAY_SECONDS,
    "MaxPayloadBytes": c.DEFAULT_MAX_PAYLOAD_BYTES,
    "OffloadThresholdBytes": c.DEFAULT_OFFLOAD_THRESHOLD_BYTES,
    "TtlGraceSeconds": c.DEFAULT_TTL_GRACE_SECONDS,
}

# Queues a function consumes, and the queue that catches what fails there.
SOURCE_QUEUES = {
    "DelayQueue": ("EmitterFunction", "DelayDeadLetterQueue"),
    "DelayHighQueue": ("EmitterFunction", "DelayDeadLetterQueue"),
    "DelayLowQueue": ("EmitterFunction", "DelayDeadLetterQueue"),
    "TickQueue": ("SchedulerFunction", "TickDeadLetterQueue"),
}
# Terminal dead-letter destinations, and what feeds each.
DEAD_LETTER_QUEUES = {
    "DelayDeadLetterQueue",
    "TickDeadLetterQueue",
    "RejectQueue",
    "TimerDeadLetterQueue",
}

# The only actions AWS makes us grant on Resource '*'.
WILDCARD_ACTIONS = {
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
    # X-Ray's write calls take no resource ARN (the functions' roles, with Tracing=Active only).
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
}


# --- helpers ------------------------------------------------------------------------------


def of_type(resources: dict[str, Any], kind: str) -> dict[str, Any]:
    return {name: r for name, r in resources.items() if r["Type"] == kind}


def props(resources: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = resources[name]["Properties"]
    return found


def branches(node: Any) -> Iterator[Any]:
    """Every value a node can take: both sides of each Fn::If, no AWS::NoValue."""
    if isinstance(node, dict) and set(node) == {"Fn::If"}:
        _, then, otherwise = node["Fn::If"]
        yield from branches(then)
        yield from branches(otherwise)
    elif node == {"Ref": "AWS::NoValue"}:
        return
    else:
        yield node


def listed(node: Any) -> list[Any]:
    """A value that may be a scalar, a list, or conditional items, as a flat list."""
    out: list[Any] = []
    for value in branches(node):
        for item in value if isinstance(value, list) else [value]:
            out.extend(branches(item))
    return out


def statements(policy_documents: Iterator[Any]) -> Iterator[dict[str, Any]]:
    for document in policy_documents:
        yield from listed(document["Statement"])


def role_statements(resources: dict[str, Any], role: str) -> list[dict[str, Any]]:
    policies = listed(props(resources, role).get("Policies", []))
    return list(statements(p["PolicyDocument"] for p in policies))


def all_policy_statements(resources: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, resource in resources.items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Role":
            for statement in role_statements(resources, name):
                yield name, statement
        elif "PolicyDocument" in properties:
            for statement in statements(iter([properties["PolicyDocument"]])):
                yield name, statement


def function_timeout(template: dict[str, Any], name: str) -> int:
    timeout = props(template["Resources"], name).get(
        "Timeout", template["Globals"]["Function"]["Timeout"]
    )
    return int(timeout)


def events_of(resources: dict[str, Any], name: str, kind: str) -> list[dict[str, Any]]:
    events = props(resources, name).get("Events", {})
    return [e["Properties"] for e in events.values() if e["Type"] == kind]


def role_of(resources: dict[str, Any], function: str) -> str:
    role = props(resources, function)["Role"]
    assert role["Fn::GetAtt"][1] == "Arn"
    name: str = role["Fn::GetAtt"][0]
    return name


def grants(resources: dict[str, Any], role: str, action: str) -> list[Any]:
    """The resources a role's Allow statements give ``action`` on."""
    found: list[Any] = []
    for statement in role_statements(resources, role):
        if statement["Effect"] == "Allow" and action in listed(statement["Action"]):
            found.extend(listed(statement["Resource"]))
    return found


def arn_of(name: str) -> dict[str, Any]:
    return {"Fn::GetAtt": [name, "Arn"]}


# --- the functions and the layer ------------------------------------------------------------


def test_globals_run_python312_on_arm64_with_the_layer(template: dict[str, Any]) -> None:
    function = template["Globals"]["Function"]
    assert function["Runtime"] == "python3.12"
    assert function["Architectures"] == ["arm64"]
    assert function["Handler"] == "app.handler"
    assert function["Layers"] == [{"Ref": "DelayQLayer"}]


def test_layer_is_built_from_the_delayq_package(resources: dict[str, Any]) -> None:
    layer = resources["DelayQLayer"]
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "layers/delayq/"
    assert layer["Metadata"]["BuildMethod"] == "python3.12"
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    assert (ROOT / "layers/delayq/requirements.txt").is_file()
    assert (ROOT / "layers/delayq/delayq/__init__.py").is_file()


@pytest.mark.parametrize(("logical_id", "name"), FUNCTIONS.items())
def test_function_code_is_its_handler_directory(
    resources: dict[str, Any], logical_id: str, name: str
) -> None:
    assert resources[logical_id]["Type"] == "AWS::Serverless::Function"
    assert props(resources, logical_id)["CodeUri"] == f"functions/{name}/"
    app = ROOT / "functions" / name / "app.py"
    assert re.search(r"^def handler\(event", app.read_text(), re.MULTILINE), app


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_function_has_its_own_role_and_log_group(
    resources: dict[str, Any], logical_id: str
) -> None:
    function = props(resources, logical_id)
    # An explicit role: SAM attaches no managed policies (they grant on Resource '*').
    assert "Policies" not in function
    role = role_of(resources, logical_id)
    assert resources[role]["Type"] == "AWS::IAM::Role"
    log_group = function["LoggingConfig"]["LogGroup"]["Ref"]
    assert resources[log_group]["Type"] == "AWS::Logs::LogGroup"
    assert grants(resources, role, "logs:PutLogEvents") == [arn_of(log_group)]


def test_tracing_is_a_parameter_off_by_default(template: dict[str, Any]) -> None:
    parameter = template["Parameters"]["Tracing"]
    assert parameter["AllowedValues"] == ["Disabled", "Active"]
    assert parameter["Default"] == "Disabled"
    assert template["Conditions"]["TracingActive"] == {"Fn::Equals": [{"Ref": "Tracing"}, "Active"]}
    function = template["Globals"]["Function"]
    # SAM sets no TracingConfig for Disabled, and TracingConfig Mode Active for Active.
    assert function["Tracing"] == {"Ref": "Tracing"}
    # delayq.tracing wraps the handlers only when this says false.
    assert function["Environment"]["Variables"]["POWERTOOLS_TRACE_DISABLED"] == {
        "Fn::If": ["TracingActive", "false", "true"]
    }


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_a_traced_function_may_write_traces_only_when_tracing_is_active(
    resources: dict[str, Any], logical_id: str
) -> None:
    # SAM adds X-Ray write access only to roles it creates: ours carry it under the condition.
    policies = props(resources, role_of(resources, logical_id))["Policies"]
    tracing = [
        p
        for p in policies
        if isinstance(p, dict) and "Fn::If" in p and p["Fn::If"][0] == "TracingActive"
    ]
    [policy] = tracing
    _, granted, otherwise = policy["Fn::If"]
    assert otherwise == {"Ref": "AWS::NoValue"}
    [statement] = granted["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert set(statement["Action"]) == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert statement["Resource"] == "*"
    # No other statement of the role mentions X-Ray.
    others = [
        s for s in role_statements(resources, role_of(resources, logical_id)) if s is not statement
    ]
    assert not [a for s in others for a in listed(s["Action"]) if a.startswith("xray:")]


def test_the_deploy_time_function_is_never_traced(resources: dict[str, Any]) -> None:
    assert props(resources, "GlueCodeFunction")["Tracing"] == "Disabled"


# --- event sources ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mapping", "condition", "group_config"),
    [
        ("IngestMskEventSource", "IsMsk", "AmazonManagedKafkaEventSourceConfig"),
        (
            "IngestSelfManagedKafkaEventSource",
            "IsSelfManaged",
            "SelfManagedKafkaEventSourceConfig",
        ),
    ],
)
def test_ingest_reads_the_delay_topic_from_msk_or_self_managed_kafka(
    resources: dict[str, Any], mapping: str, condition: str, group_config: str
) -> None:
    resource = resources[mapping]
    assert resource["Type"] == "AWS::Lambda::EventSourceMapping"
    assert resource["Condition"] == condition
    source = resource["Properties"]
    assert source["FunctionName"] == {"Ref": "IngestFunction"}
    assert source["Topics"] == [{"Ref": "DelayTopic"}]
    assert source["StartingPosition"] == {"Ref": "StartingPosition"}
    assert source["BatchSize"] == {"Ref": "IngestBatchSize"}
    assert source[group_config] == {"ConsumerGroupId": {"Ref": "ConsumerGroupId"}}
    # Failed batches are retried from the topic until stored: never dropped to a destination.
    assert "DestinationConfig" not in source
    assert "MaximumRetryAttempts" not in source


def test_msk_source_uses_the_cluster_and_scram_secret_only_for_scram(
    resources: dict[str, Any],
) -> None:
    source = props(resources, "IngestMskEventSource")
    assert source["EventSourceArn"] == {"Ref": "MskClusterArn"}
    condition, scram, otherwise = source["SourceAccessConfigurations"]["Fn::If"]
    assert condition == "MskScram"
    assert scram == [{"Type": "SASL_SCRAM_512_AUTH", "URI": {"Ref": "KafkaSecretArn"}}]
    assert otherwise == {"Ref": "AWS::NoValue"}


def test_self_managed_source_reaches_brokers_through_auth_and_vpc_parameters(
    resources: dict[str, Any],
) -> None:
    source = props(resources, "IngestSelfManagedKafkaEventSource")
    assert source["SelfManagedEventSource"]["Endpoints"]["KafkaBootstrapServers"] == {
        "Fn::Split": [",", {"Ref": "KafkaBootstrapServers"}]
    }
    access = listed(source["SourceAccessConfigurations"])
    types = {a["Type"] for a in access}
    assert types == {
        "SASL_SCRAM_512_AUTH",
        "SASL_SCRAM_256_AUTH",
        "VPC_SUBNET",
        "VPC_SECURITY_GROUP",
    }
    secrets = [a["URI"] for a in access if a["Type"].startswith("SASL_SCRAM")]
    assert secrets == [{"Ref": "KafkaSecretArn"}] * 2
    subnets = [a["URI"]["Fn::Sub"][1]["Id"] for a in access if a["Type"] == "VPC_SUBNET"]
    assert subnets == [{"Fn::Select": [i, {"Ref": "SubnetIds"}]} for i in range(3)]


def test_timer_runs_every_minute_with_an_async_dead_letter_queue(
    resources: dict[str, Any],
) -> None:
    (schedule,) = events_of(resources, "TimerFunction", "Schedule")
    assert schedule["Schedule"] == "rate(1 minute)"
    assert schedule["DeadLetterConfig"]["Arn"] == arn_of("TimerDeadLetterQueue")
    timer = props(resources, "TimerFunction")
    assert timer["DeadLetterQueue"] == {"Type": "SQS", "TargetArn": arn_of("TimerDeadLetterQueue")}
    assert arn_of("TimerDeadLetterQueue") in grants(resources, "TimerRole", "sqs:SendMessage")


def test_scheduler_consumes_the_tick_queue_one_tick_at_a_time(resources: dict[str, Any]) -> None:
    (source,) = events_of(resources, "SchedulerFunction", "SQS")
    assert source["Queue"] == arn_of("TickQueue")
    assert source["BatchSize"] == 1
    assert source["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_scheduler_has_a_whole_vcpu(resources: dict[str, Any]) -> None:
    # One invocation at a time sends every due-second in order: below one vCPU a burst's
    # scheduling time is what everyone due after it waits for (make bench's AWS-scale model).
    memory = resources["SchedulerFunction"]["Properties"]["MemorySize"]
    assert memory == LAMBDA_FULL_VCPU_MB


def test_emitter_batching_window_fits_inside_the_emit_lead(
    resources: dict[str, Any],
) -> None:
    sources = events_of(resources, "EmitterFunction", "SQS")
    assert [s["Queue"] for s in sources] == DELAY_QUEUE_ARNS
    for source in sources:
        assert source["BatchSize"] == 100
        # A message is released DEFAULT_EMIT_LEAD_MS before due; waiting out the batching
        # window (plus polling) must still leave it early, for the emitter to hold, never late.
        assert source["MaximumBatchingWindowInSeconds"] * 1000 < DEFAULT_EMIT_LEAD_MS
        assert source["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_each_priority_class_has_its_own_concurrency_or_provisioned_pollers(
    resources: dict[str, Any],
) -> None:
    sources = events_of(resources, "EmitterFunction", "SQS")
    concurrency = [
        "EmitterMaxConcurrency",
        "EmitterHighMaxConcurrency",
        "EmitterLowMaxConcurrency",
    ]
    for source, parameter in zip(sources, concurrency, strict=True):
        # AWS: maximum concurrency and provisioned mode exclude each other.
        assert source["ScalingConfig"] == {
            "Fn::If": [
                "EmitterProvisioned",
                {"Ref": "AWS::NoValue"},
                {"MaximumConcurrency": {"Ref": parameter}},
            ]
        }
        assert source["ProvisionedPollerConfig"] == {
            "Fn::If": [
                "EmitterProvisioned",
                {
                    "MinimumPollers": {"Ref": "EmitterMinimumPollers"},
                    "MaximumPollers": {"Ref": "EmitterMaximumPollers"},
                },
                {"Ref": "AWS::NoValue"},
            ]
        }


def test_burst_capacity_parameters_stay_within_aws_limits(template: dict[str, Any]) -> None:
    parameters = template["Parameters"]
    # SQS provisioned mode: 2..200 minimum pollers (0 here: standard mode), at most 2,000.
    assert (
        parameters["EmitterMinimumPollers"]["MaxValue"],
        parameters["EmitterMaximumPollers"]["MinValue"],
    ) == (200, 2)
    assert parameters["EmitterMaximumPollers"]["MaxValue"] == 2000
    assert "SqsProvisionedModeNeedsTwoPollers" in template["Rules"]
    # Kafka provisioned mode: 1..200 minimum pollers (0: on-demand), at most 2,000.
    assert parameters["IngestMinimumPollers"]["MaxValue"] == 200
    assert parameters["IngestMaximumPollers"]["MaxValue"] == 2000
    for name in ("IngestMskEventSource", "IngestSelfManagedKafkaEventSource"):
        assert props(template["Resources"], name)["ProvisionedPollerConfig"]["Fn::If"][0] == (
            "IngestProvisioned"
        )
    table = props(template["Resources"], "MessageTable")
    assert table["WarmThroughput"]["Fn::If"][0] == "HasWarmWrites"


def test_cleanup_consumes_only_ttl_removals_of_messages(resources: dict[str, Any]) -> None:
    (source,) = events_of(resources, "CleanupFunction", "DynamoDB")
    assert source["Stream"] == {"Fn::GetAtt": ["MessageTable", "StreamArn"]}
    assert source["BisectBatchOnFunctionError"] is True
    assert source["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    # S3: the whole batch (old images included) is kept; SQS would get coordinates only, and
    # the TTL-deleted items are gone by then.
    assert source["DestinationConfig"]["OnFailure"] == {
        "Type": "S3",
        "Destination": arn_of("PayloadBucket"),
    }
    (only,) = source["FilterCriteria"]["Filters"]
    pattern = json.loads(only["Pattern"])
    assert pattern["eventName"] == ["REMOVE"]
    assert pattern["userIdentity"] == {"type": ["Service"], "principalId": [c.TTL_PRINCIPAL]}
    assert pattern["dynamodb"]["OldImage"]["kind"] == {"S": [c.KIND_MESSAGE]}


def test_the_simulator_reads_the_stream_as_the_cleanup_source_does(
    resources: dict[str, Any],
) -> None:
    # sim/sources/stream.py mirrors these settings: a run with others would check a pipeline
    # that is not the deployed one (e.g. one batch of a shard at a time, kinder than AWS).
    (source,) = events_of(resources, "CleanupFunction", "DynamoDB")
    assert source["BatchSize"] == stream.STREAM_BATCH
    assert source["MaximumBatchingWindowInSeconds"] * 1000 == stream.STREAM_WINDOW_MS
    assert source["ParallelizationFactor"] == stream.STREAM_PARALLELIZATION
    assert source["MaximumRetryAttempts"] == stream.STREAM_RETRIES
    assert props(resources, "CleanupFunction")["Timeout"] == TIMEOUT_S["cleanup"]


@pytest.mark.parametrize(("queue", "consumer"), [(q, f) for q, (f, _) in SOURCE_QUEUES.items()])
def test_queue_visibility_is_six_times_the_consumer_timeout(
    template: dict[str, Any], queue: str, consumer: str
) -> None:
    visibility = props(template["Resources"], queue)["VisibilityTimeout"]
    assert visibility >= 6 * function_timeout(template, consumer)


@pytest.mark.parametrize(("queue", "consumer"), [(q, f) for q, (f, _) in SOURCE_QUEUES.items()])
def test_consumer_may_poll_its_queue_and_nothing_else(
    resources: dict[str, Any], queue: str, consumer: str
) -> None:
    role = role_of(resources, consumer)
    consumed = [arn_of(q) for q, (f, _) in SOURCE_QUEUES.items() if f == consumer]
    assert arn_of(queue) in consumed
    assert grants(resources, role, "sqs:ReceiveMessage") == consumed
    assert grants(resources, role, "sqs:DeleteMessage") == consumed


# --- environment --------------------------------------------------------------------------


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_function_gets_exactly_its_variables(resources: dict[str, Any], logical_id: str) -> None:
    variables = props(resources, logical_id)["Environment"]["Variables"]
    assert variables == FUNCTION_VARIABLES[logical_id]


def test_resource_variables_point_at_their_resources(resources: dict[str, Any]) -> None:
    for logical_id in FUNCTIONS:
        variables = props(resources, logical_id)["Environment"]["Variables"]
        for name, value in variables.items():
            if name in RESOURCE_VARIABLES:
                assert value == RESOURCE_VARIABLES[name], (logical_id, name)


def test_shared_settings_come_from_parameters(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    for name, parameter in GLOBAL_SETTINGS.items():
        assert variables[name] == {"Ref": parameter}
        assert parameter in template["Parameters"]
    assert not set(variables) & set(RESOURCE_VARIABLES), "resource names belong to functions"


def test_every_delayq_variable_is_one_the_code_reads(template: dict[str, Any]) -> None:
    known = {value for name, value in vars(c).items() if name.startswith("ENV_")}
    used = set(template["Globals"]["Function"]["Environment"]["Variables"])
    for logical_id in FUNCTIONS:
        used |= set(props(template["Resources"], logical_id)["Environment"]["Variables"])
    unknown = {v for v in used if v.startswith("DELAYQ_")} - known
    assert not unknown


def test_no_credentials_in_environment_values(resources: dict[str, Any]) -> None:
    for logical_id in FUNCTIONS:
        for name, value in props(resources, logical_id)["Environment"]["Variables"].items():
            assert not re.search(r"PASSWORD|TOKEN|ACCESS_KEY", name), name
            if "SECRET" in name:
                # Only the secret's ARN, read at cold start from Secrets Manager.
                assert name == c.ENV_KAFKA_SECRET_ARN
                assert {"Ref": "KafkaSecretArn"} in list(branches(value))


# --- dead-letter paths ----------------------------------------------------------------------


@pytest.mark.parametrize(("queue", "dead_letters"), [(q, d) for q, (_, d) in SOURCE_QUEUES.items()])
def test_source_queue_redrives_to_its_dead_letter_queue(
    resources: dict[str, Any], queue: str, dead_letters: str
) -> None:
    redrive = props(resources, queue)["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == arn_of(dead_letters)
    assert redrive["maxReceiveCount"] >= 1
    fifo = props(resources, queue).get("FifoQueue", False)
    assert props(resources, dead_letters).get("FifoQueue", False) == fifo


def test_delay_queue_allows_ten_receives_for_re_delays(resources: dict[str, Any]) -> None:
    assert props(resources, "DelayQueue")["RedrivePolicy"]["maxReceiveCount"] == 10


def test_tick_queue_is_fifo_deduplicated_by_the_timer(resources: dict[str, Any]) -> None:
    tick = props(resources, "TickQueue")
    assert tick["FifoQueue"] is True
    assert tick["ContentBasedDeduplication"] is False


def test_every_queue_is_a_source_with_redrive_or_a_dead_letter_queue(
    resources: dict[str, Any],
) -> None:
    queues = set(of_type(resources, "AWS::SQS::Queue"))
    assert queues == set(SOURCE_QUEUES) | DEAD_LETTER_QUEUES


@pytest.mark.parametrize("queue", sorted(DEAD_LETTER_QUEUES))
def test_dead_letter_queue_keeps_14_days_and_alarms_when_not_empty(
    resources: dict[str, Any], queue: str
) -> None:
    assert props(resources, queue)["MessageRetentionPeriod"] == 1_209_600
    assert "RedrivePolicy" not in props(resources, queue)
    alarms = [
        a["Properties"]
        for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("Dimensions")
        == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
        and a["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"
    ]
    assert len(alarms) == 1
    (alarm,) = alarms
    assert alarm["Threshold"] == 0
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]


def test_reject_queue_is_fed_by_ingest_and_emitter_only(resources: dict[str, Any]) -> None:
    senders = {
        f
        for f in FUNCTIONS
        if arn_of("RejectQueue") in grants(resources, role_of(resources, f), "sqs:SendMessage")
    }
    assert senders == {"IngestFunction", "EmitterFunction"}


def test_polled_functions_have_no_function_dead_letter_queue(resources: dict[str, Any]) -> None:
    # A function DLQ applies to asynchronous invocations only: on a polled source it does
    # nothing and hides the real failure path.
    for logical_id in FUNCTIONS:
        if logical_id != "TimerFunction":
            assert "DeadLetterQueue" not in props(resources, logical_id), logical_id


def test_stream_failures_can_be_written_to_the_payload_bucket(resources: dict[str, Any]) -> None:
    assert grants(resources, "CleanupRole", "sqs:SendMessage") == DELAY_QUEUE_ARNS
    assert grants(resources, "CleanupRole", "s3:PutObject") == [
        {"Fn::Sub": "${PayloadBucket.Arn}/aws/lambda/*"}
    ]
    assert grants(resources, "CleanupRole", "s3:ListBucket") == [arn_of("PayloadBucket")]


def test_the_emitter_may_send_retries_dead_letters_and_rejects(resources: dict[str, Any]) -> None:
    # Every partial failure re-queues on the delay queue or dead-letters with a reason.
    assert grants(resources, "EmitterRole", "sqs:SendMessage") == [
        *DELAY_QUEUE_ARNS,
        arn_of("DelayDeadLetterQueue"),
        arn_of("RejectQueue"),
    ]


def test_the_cleanup_errors_alarm(resources: dict[str, Any]) -> None:
    alarm = props(resources, "CleanupErrorsAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/Lambda", "Errors")
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "CleanupFunction"}}]


def test_a_blocked_delay_topic_partition_alarms(resources: dict[str, Any]) -> None:
    alarm = props(resources, "IngestOffsetLagAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/Lambda", "OffsetLag")
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "IngestFunction"}}]


# --- storage ----------------------------------------------------------------------------------


def test_table_layout_matches_the_store(resources: dict[str, Any]) -> None:
    table = props(resources, "MessageTable")
    assert table["KeySchema"] == [
        {"AttributeName": c.ATTR_PK, "KeyType": "HASH"},
        {"AttributeName": c.ATTR_SK, "KeyType": "RANGE"},
    ]
    assert {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]} == {
        c.ATTR_PK: "S",
        c.ATTR_SK: "S",
    }
    assert table["TimeToLiveSpecification"] == {"AttributeName": c.ATTR_TTL, "Enabled": True}
    assert table["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_table_is_on_demand_by_default_with_a_provisioned_option(
    template: dict[str, Any],
) -> None:
    table = props(template["Resources"], "MessageTable")
    assert table["BillingMode"] == {"Ref": "TableBillingMode"}
    mode = template["Parameters"]["TableBillingMode"]
    assert mode["Default"] == "PAY_PER_REQUEST"
    assert set(mode["AllowedValues"]) == {"PAY_PER_REQUEST", "PROVISIONED"}
    condition, throughput, otherwise = table["ProvisionedThroughput"]["Fn::If"]
    assert condition == "IsProvisioned"
    assert set(throughput) == {"ReadCapacityUnits", "WriteCapacityUnits"}
    assert otherwise == {"Ref": "AWS::NoValue"}


def test_payload_bucket_expires_payloads_rejects_and_failed_batches(
    resources: dict[str, Any],
) -> None:
    rules = props(resources, "PayloadBucket")["LifecycleConfiguration"]["Rules"]
    expiring = {r["Prefix"]: r["ExpirationInDays"] for r in rules if "ExpirationInDays" in r}
    assert expiring == {
        "payloads/": {"Fn::FindInMap": ["PayloadRetention", {"Ref": "MaxDelaySeconds"}, "Days"]},
        "rejected/": {"Ref": "RejectedRetentionDays"},
        "aws/lambda/": {"Ref": "RejectedRetentionDays"},
    }


def test_payloads_outlive_every_copy_of_their_message(template: dict[str, Any]) -> None:
    retention = template["Mappings"]["PayloadRetention"]
    allowed = template["Parameters"]["MaxDelaySeconds"]["AllowedValues"]
    assert {str(v) for v in allowed} == set(retention)
    assert template["Parameters"]["TtlGraceSeconds"]["MaxValue"] <= 86400
    assert props(template["Resources"], "DelayDeadLetterQueue")["MessageRetentionPeriod"] == (
        c.SQS_MAX_RETENTION_SECONDS
    )
    tail = c.MAX_RELEASE_SPREAD_SECONDS + c.LIFE_AFTER_RELEASE_SECONDS
    for max_delay, row in retention.items():
        assert row["Days"] * 86400 >= int(max_delay) + tail, max_delay


def test_the_cost_model_prices_the_default_payload_retention(template: dict[str, Any]) -> None:
    default = str(template["Parameters"]["MaxDelaySeconds"]["Default"])
    assert template["Mappings"]["PayloadRetention"][default]["Days"] == PAYLOAD_RETENTION_DAYS


def test_no_function_deletes_a_payload(resources: dict[str, Any]) -> None:
    # Every copy of a message (duplicates, retries, dead letters) must find its value.
    for function in FUNCTIONS:
        assert grants(resources, role_of(resources, function), "s3:DeleteObject") == [], function


def test_payload_access_is_split_by_prefix(resources: dict[str, Any]) -> None:
    payloads = {"Fn::Sub": "${PayloadBucket.Arn}/payloads/*"}
    rejected = {"Fn::Sub": "${PayloadBucket.Arn}/rejected/*"}
    assert grants(resources, "IngestRole", "s3:PutObject") == [payloads, rejected]
    # CopyObject's source: a long-rescheduled copy gets an object of its own.
    assert grants(resources, "IngestRole", "s3:GetObject") == [payloads]
    assert grants(resources, "EmitterRole", "s3:GetObject") == [payloads]
    assert grants(resources, "EmitterRole", "s3:PutObject") == [rejected]
    assert grants(resources, "SchedulerRole", "s3:GetObject") == []


@pytest.mark.parametrize(
    ("role", "action", "leading_keys"),
    [
        (
            "IngestRole",
            "dynamodb:GetItem",
            [
                c.WATERMARK_PK,
                f"{c.PENDING_PK_PREFIX}*",
                f"{c.RATE_PK_PREFIX}*",
                f"{c.QUOTA_PK_PREFIX}*",
            ],
        ),
        (
            "IngestRole",
            "dynamodb:UpdateItem",
            [
                f"{c.CANCEL_PK_PREFIX}*",
                f"{CLOCK_PK_PREFIX}*",
                c.WATERMARK_PK,
                f"{c.RATE_PK_PREFIX}*",
                f"{c.QUOTA_PK_PREFIX}*",
                f"{c.PENDING_PK_PREFIX}*",
            ],
        ),
        ("SchedulerRole", "dynamodb:UpdateItem", [c.WATERMARK_PK]),
        ("CleanupRole", "dynamodb:GetItem", [c.WATERMARK_PK]),
        (
            "EmitterRole",
            "dynamodb:BatchGetItem",
            [f"{c.CANCEL_PK_PREFIX}*", f"{CLOCK_PK_PREFIX}*", f"{c.RATE_PK_PREFIX}*"],
        ),
        ("EmitterRole", "dynamodb:PutItem", [f"{c.STATS_PK_PREFIX}*"]),
        ("EmitterRole", "dynamodb:UpdateItem", [f"{c.RATE_PK_PREFIX}*", f"{CLOCK_PK_PREFIX}*"]),
        ("EmitterRole", "dynamodb:GetItem", [f"{c.RATE_PK_PREFIX}*", f"{CLOCK_PK_PREFIX}*"]),
    ],
)
def test_item_level_access_is_limited_to_its_partition_keys(
    resources: dict[str, Any], role: str, action: str, leading_keys: list[str]
) -> None:
    (statement,) = [
        s
        for s in role_statements(resources, role)
        if s["Effect"] == "Allow" and action in listed(s["Action"])
    ]
    assert statement["Resource"] == arn_of("MessageTable")
    (operator,) = statement["Condition"]
    assert operator.startswith("ForAllValues:String")
    assert statement["Condition"][operator]["dynamodb:LeadingKeys"] == leading_keys


def test_ingest_may_read_the_stored_messages_a_reschedule_moves(
    resources: dict[str, Any],
) -> None:
    # Their partition keys are due-seconds: a grant limited to marker keys would refuse them.
    (statement,) = [
        s
        for s in role_statements(resources, "IngestRole")
        if s["Effect"] == "Allow" and "dynamodb:BatchGetItem" in listed(s["Action"])
    ]
    assert statement["Resource"] == arn_of("MessageTable")
    assert "Condition" not in statement


def test_only_ingest_the_scheduler_and_the_emitter_update_items(
    resources: dict[str, Any],
) -> None:
    # The scheduler moves the watermark; ingest creates it and writes cancel markers; the
    # emitter claims release slots for late capped messages (its grant: rate# keys only).
    writers = {
        f for f in FUNCTIONS if grants(resources, role_of(resources, f), "dynamodb:UpdateItem")
    }
    assert writers == {"IngestFunction", "SchedulerFunction", "EmitterFunction"}


def test_lookahead_leaves_the_ingest_timeout_below_the_horizon(template: dict[str, Any]) -> None:
    # The settings refuse lookahead + ingest timeout > horizon; the template cannot produce it.
    ingest = props(template["Resources"], "IngestFunction")
    timeout = ingest["Timeout"]
    assert ingest["Environment"]["Variables"][c.ENV_INGEST_TIMEOUT_SECONDS] == str(timeout)
    lookahead = template["Parameters"]["LookaheadSeconds"]["MaxValue"]
    assert lookahead + timeout <= c.SQS_MAX_DELAY_SECONDS
    assert "HorizonSeconds" not in template["Parameters"]  # always SQS's 900 s in AWS


def test_shards_stay_within_what_the_progress_item_holds(template: dict[str, Any]) -> None:
    assert template["Parameters"]["Shards"]["MaxValue"] == c.MAX_SHARDS


# --- encryption ---------------------------------------------------------------------------------


def test_every_queue_is_encrypted(resources: dict[str, Any]) -> None:
    for name, queue in of_type(resources, "AWS::SQS::Queue").items():
        properties = queue["Properties"]
        assert properties.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in properties, (
            name
        )


def test_table_is_encrypted(resources: dict[str, Any]) -> None:
    for table in of_type(resources, "AWS::DynamoDB::Table").values():
        assert table["Properties"]["SSESpecification"]["SSEEnabled"] is True


@pytest.mark.parametrize("bucket", ["PayloadBucket", "AnalyticsBucket"])
def test_bucket_is_encrypted_private_and_tls_only(resources: dict[str, Any], bucket: str) -> None:
    properties = props(resources, bucket)
    (rule,) = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in {"aws:kms", "AES256"}
    assert set(properties["PublicAccessBlockConfiguration"].values()) == {True}
    (policy,) = [
        p["Properties"]["PolicyDocument"]
        for p in of_type(resources, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": bucket}
    ]
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert [s["Condition"] for s in deny] == [{"Bool": {"aws:SecureTransport": "false"}}]


def test_every_bucket_has_a_tls_only_policy(resources: dict[str, Any]) -> None:
    buckets = set(of_type(resources, "AWS::S3::Bucket"))
    covered = {
        p["Properties"]["Bucket"]["Ref"]
        for p in of_type(resources, "AWS::S3::BucketPolicy").values()
    }
    assert buckets == covered


def test_every_queue_denies_plain_http(resources: dict[str, Any]) -> None:
    covered: set[str] = set()
    for policy in of_type(resources, "AWS::SQS::QueuePolicy").values():
        document = policy["Properties"]["PolicyDocument"]
        if any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in document["Statement"]
        ):
            covered |= {q["Ref"] for q in policy["Properties"]["Queues"]}
    assert covered == set(of_type(resources, "AWS::SQS::Queue"))


# --- IAM -----------------------------------------------------------------------------------------


def test_wildcard_resources_are_only_network_interfaces_and_commented(
    resources: dict[str, Any], template_lines: list[str]
) -> None:
    wildcards = [
        (owner, s)
        for owner, s in all_policy_statements(resources)
        if s["Effect"] == "Allow" and "*" in listed(s["Resource"])
    ]
    assert wildcards, "the ENI statements are expected here; did the walk break?"
    for owner, statement in wildcards:
        assert set(listed(statement["Action"])) <= WILDCARD_ACTIONS, (owner, statement["Sid"])
        line = template_lines[statement["Resource"].start_mark.line]
        assert "# wildcard required: " in line, (owner, line)
    written = [line for line in template_lines if re.search(r"Resource: [\"']\*[\"']", line)]
    assert len(written) == len(wildcards)


def test_no_allow_grants_every_action_of_a_service(resources: dict[str, Any]) -> None:
    for owner, statement in all_policy_statements(resources):
        if statement["Effect"] == "Allow":
            for action in listed(statement["Action"]):
                assert action != "*", owner
                assert not action.endswith(":*"), (owner, action)


def test_only_kafka_facing_roles_read_the_scram_secret(resources: dict[str, Any]) -> None:
    readers = {
        role
        for role in of_type(resources, "AWS::IAM::Role")
        if grants(resources, role, "secretsmanager:GetSecretValue")
    }
    assert readers == {"IngestRole", "EmitterRole"}
    for role in readers:
        assert grants(resources, role, "secretsmanager:GetSecretValue") == [
            {"Ref": "KafkaSecretArn"}
        ]


def test_checkov_skips_give_a_reason(template_lines: list[str]) -> None:
    skips = [line.strip() for line in template_lines if line.strip().startswith("# checkov:")]
    assert skips
    for line in skips:
        match = re.fullmatch(r"# checkov:skip=(CKV2?_AWS_\d+): (.+)", line)
        assert match, line
        assert len(match.group(2)) >= 30, line


# --- parameters, alarms, reports, outputs -----------------------------------------------


def test_strict_release_caps_default_to_the_code_default(template: dict[str, Any]) -> None:
    parameter = template["Parameters"]["StrictReleaseCaps"]
    assert parameter["Default"] == Settings().strict_caps == 1
    assert parameter["AllowedValues"] == [0, 1]


@pytest.mark.parametrize(("parameter", "default"), PARAMETER_DEFAULTS.items())
def test_parameter_default_matches_the_code(
    template: dict[str, Any], parameter: str, default: int
) -> None:
    assert template["Parameters"][parameter]["Default"] == default


def test_operator_parameters_exist(template: dict[str, Any]) -> None:
    expected = {
        "AllowedTargets",
        "LogLevel",
        "KafkaSource",
        "KafkaSecurity",
        "KafkaBootstrapServers",
        "DelayTopic",
        "ConsumerGroupId",
        "IngestBatchSize",
        "StartingPosition",
        "MskClusterArn",
        "KafkaSecretArn",
        "SubnetIds",
        "SecurityGroupIds",
        "TableBillingMode",
        *GLOBAL_SETTINGS.values(),
        *PARAMETER_DEFAULTS,
    }
    assert expected <= set(template["Parameters"])
    assert template["Parameters"]["KafkaSource"]["AllowedValues"] == ["MSK", "SelfManagedKafka"]
    assert template["Parameters"]["LogLevel"]["Default"] == "INFO"


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("orders.*,reminders", True),
        ("reminders", True),
        ("orders.timeout,orders.retry,team-?.jobs", True),
        ("*", False),
        ("orders.*,*", False),
        ("*,reminders", False),
        ("**", False),
        ("?*", False),
        ("*?", False),
        ("[a-z]*", False),
        ("__consumer_offsets", False),
        ("orders.*,__*", False),
        ("_private.*", True),
        ("", False),
        ("orders.*,", False),
        ("orders timeout", False),
    ],
)
def test_allow_list_is_required_and_never_allows_everything(
    template: dict[str, Any], value: str, accepted: bool
) -> None:
    parameter = template["Parameters"]["AllowedTargets"]
    assert "Default" not in parameter
    assert bool(re.fullmatch(parameter["AllowedPattern"], value)) is accepted


def test_kafka_consistency_rules(template: dict[str, Any]) -> None:
    rules = template["Rules"]
    assert rules["MskNeedsCluster"]["RuleCondition"] == {
        "Fn::Equals": [{"Ref": "KafkaSource"}, "MSK"]
    }
    assert {"Fn::Not": [{"Fn::Equals": [{"Ref": "KafkaSecretArn"}, ""]}]} in [
        a["Assert"] for a in rules["ScramNeedsSecret"]["Assertions"]
    ]


@pytest.mark.parametrize(
    ("alarm", "metric"),
    [("WatermarkLagAlarm", "WatermarkLagSeconds"), ("EmitLatenessAlarm", "LatenessMs")],
)
def test_metric_alarms_watch_what_the_handlers_publish(
    resources: dict[str, Any], alarm: str, metric: str
) -> None:
    properties = props(resources, alarm)
    assert properties["Namespace"] == telemetry.NAMESPACE
    assert properties["MetricName"] == metric
    published = (ROOT / "layers/delayq/delayq/telemetry.py").read_text()
    assert f'name="{metric}"' in published
    # Powertools adds the service dimension from POWERTOOLS_SERVICE_NAME.
    assert properties["Dimensions"] == [{"Name": "service", "Value": {"Ref": "AWS::StackName"}}]


def test_service_name_matches_the_alarm_dimension(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["POWERTOOLS_SERVICE_NAME"] == {"Ref": "AWS::StackName"}


def test_emit_lateness_alarm_is_on_p99(resources: dict[str, Any]) -> None:
    assert props(resources, "EmitLatenessAlarm")["ExtendedStatistic"] == "p99"


def test_delay_queue_age_is_watched(resources: dict[str, Any]) -> None:
    alarm = props(resources, "DelayQueueAgeAlarm")
    assert alarm["MetricName"] == "ApproximateAgeOfOldestMessage"
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["DelayQueue", "QueueName"]}}
    ]


@pytest.mark.parametrize(
    ("job", "script", "report"),
    [
        ("DeliveryReportJob", "spark_glue/jobs/delivery_report.py", "delivery"),
        ("BacklogForecastJob", "spark_glue/jobs/backlog_forecast.py", "backlog"),
    ],
)
def test_glue_job_runs_its_script_on_the_exports(
    resources: dict[str, Any], job: str, script: str, report: str
) -> None:
    properties = props(resources, job)
    assert properties["GlueVersion"] == "5.0"
    assert properties["Command"]["Name"] == "glueetl"
    assert properties["Command"]["ScriptLocation"] == script
    assert (ROOT / script).is_file(), "sam deploy uploads this file: it must exist"
    arguments = properties["DefaultArguments"]
    assert arguments["--export_path"] == {"Fn::Sub": "s3://${AnalyticsBucket}/exports/"}
    assert arguments["--output_path"] == {"Fn::Sub": f"s3://${{AnalyticsBucket}}/reports/{report}/"}
    assert arguments["--extra-py-files"] == {
        "Fn::Sub": "s3://${AnalyticsBucket}/glue/delayq_reports.zip"
    }


GLUE_CODE_KEY = "glue/delayq_reports.zip"


def test_the_glue_code_ships_with_every_deploy(resources: dict[str, Any]) -> None:
    resource = resources["GlueCode"]
    assert resource["Type"] == "AWS::CloudFormation::CustomResource"
    properties = resource["Properties"]
    assert properties["ServiceToken"] == arn_of("GlueCodeFunction")
    assert properties["Bucket"] == {"Ref": "AnalyticsBucket"}
    assert properties["Key"] == GLUE_CODE_KEY
    # A lost answer fails the deploy in minutes, not after CloudFormation's default hour.
    assert 60 <= properties["ServiceTimeout"] <= 600
    # New code publishes a new version; the property changes with it, so CloudFormation sends
    # an Update (a new zip) on every deploy that changes the package, and only then.
    assert properties["CodeVersion"] == {"Ref": "GlueCodeFunction.Version"}
    assert props(resources, "GlueCodeFunction")["AutoPublishAlias"]


def test_the_glue_code_function_holds_the_package_it_zips(resources: dict[str, Any]) -> None:
    function = props(resources, "GlueCodeFunction")
    code = ROOT / function["CodeUri"]
    module, _, attribute = function["Handler"].rpartition(".")
    source = (code / f"{module}.py").read_text()
    assert re.search(rf"^def {attribute}\(event", source, re.MULTILINE)
    assert (code / "glue_zip.py").is_file()
    assert (code / "delayq_reports" / "jobs.py").is_file()
    assert function["Timeout"] * 5 <= props(resources, "GlueCode")["ServiceTimeout"]


@pytest.mark.parametrize("job", ["DeliveryReportJob", "BacklogForecastJob"])
def test_glue_jobs_load_the_code_glue_code_puts(resources: dict[str, Any], job: str) -> None:
    assert resources[job]["DependsOn"] == "GlueCode"
    arguments = props(resources, job)["DefaultArguments"]
    assert arguments["--extra-py-files"] == {
        "Fn::Sub": f"s3://${{AnalyticsBucket}}/{GLUE_CODE_KEY}"
    }
    # The jobs may read it.
    assert {"Fn::Sub": "${AnalyticsBucket.Arn}/glue/*"} in grants(
        resources, "GlueJobRole", "s3:GetObject"
    )


def test_the_glue_code_role_may_put_that_one_object_only(resources: dict[str, Any]) -> None:
    function = props(resources, "GlueCodeFunction")
    role = role_of(resources, "GlueCodeFunction")
    log_group = function["LoggingConfig"]["LogGroup"]["Ref"]
    assert resources[log_group]["Type"] == "AWS::Logs::LogGroup"
    allowed = {
        action: listed(s["Resource"])
        for s in role_statements(resources, role)
        if s["Effect"] == "Allow"
        for action in listed(s["Action"])
    }
    assert allowed == {
        "logs:CreateLogStream": [arn_of(log_group)],
        "logs:PutLogEvents": [arn_of(log_group)],
        "s3:PutObject": [{"Fn::Sub": f"${{AnalyticsBucket.Arn}}/{GLUE_CODE_KEY}"}],
    }
    # An explicit role: SAM attaches no managed policies.
    assert "Policies" not in function


def test_the_delivery_report_marks_the_lateness_alarm_threshold(
    template: dict[str, Any], resources: dict[str, Any]
) -> None:
    arguments = props(resources, "DeliveryReportJob")["DefaultArguments"]
    assert arguments["--lateness_p99_alarm_ms"] == {"Ref": "LatenessP99AlarmMs"}
    assert props(resources, "EmitLatenessAlarm")["Threshold"] == {"Ref": "LatenessP99AlarmMs"}
    # A run without the argument (such as a local one) marks the template's default.
    default = template["Parameters"]["LatenessP99AlarmMs"]["Default"]
    assert DeliveryReportOptions("/x", "/y").lateness_p99_alarm_ms == int(default)


def test_reports_run_daily_after_a_daily_export(resources: dict[str, Any]) -> None:
    trigger = props(resources, "DailyReportTrigger")
    assert trigger["Type"] == "SCHEDULED"
    assert trigger["Schedule"] == {"Ref": "ReportSchedule"}
    assert {a["JobName"]["Ref"] for a in trigger["Actions"]} == {
        "DeliveryReportJob",
        "BacklogForecastJob",
    }
    export = props(resources, "DailyExportSchedule")["Target"]
    assert export["Arn"]["Fn::Sub"].endswith(":aws-sdk:dynamodb:exportTableToPointInTime")
    assert '"S3Prefix": "exports"' in export["Input"]["Fn::Sub"]


def test_every_output_is_described(template: dict[str, Any]) -> None:
    outputs = template["Outputs"]
    for name, output in outputs.items():
        assert output.get("Description"), name
    needed = {
        "MessageTableName",
        "DelayQueueUrl",
        "TickQueueUrl",
        "RejectQueueUrl",
        "PayloadBucketName",
        "AnalyticsBucketName",
        "AlarmTopicArn",
    }
    assert needed <= set(outputs)


def _dashboard(resources: dict[str, Any]) -> dict[str, Any]:
    """The dashboard body as CloudFormation would render it (placeholders for the values)."""
    body = resources["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    rendered = re.sub(
        r"\$\{([^}]+)\}", lambda m: "1000" if m.group(1).endswith(("Ms", "Seconds")) else "x", body
    )
    parsed: dict[str, Any] = json.loads(rendered)
    return parsed


def test_the_dashboard_body_is_json_with_every_alarm(resources: dict[str, Any]) -> None:
    dashboard = _dashboard(resources)
    body = resources["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    alarms = {k for k, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    [alarm_widget] = [w for w in dashboard["widgets"] if w["type"] == "alarm"]
    assert len(alarm_widget["properties"]["alarms"]) == len(alarms)
    assert set(re.findall(r"\$\{(\w+)\.Arn\}", body)) == alarms
    for name in re.findall(r"\$\{(\w+)\.QueueName\}", body):
        assert resources[name]["Type"] == "AWS::SQS::Queue", name


def test_the_dashboard_shows_only_metrics_the_handlers_publish(resources: dict[str, Any]) -> None:
    telemetry = (ROOT / "layers" / "delayq" / "delayq" / "telemetry.py").read_text()
    published = set(re.findall(r'name="(\w+)"', telemetry)) | {
        # report_ingest publishes each key of its summary as Ingest<Key>.
        f"Ingest{key.capitalize()}"
        for key in re.findall(r'^\s+"(\w+)": (?:len\()?result\.', telemetry, re.M)
    }
    body = resources["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    ours = set(re.findall(r'\["KafkaDelayQueue", "(\w+)"', body))
    ours |= set(re.findall(r'\[".", "(\w+)", ".", "."\]', body))
    ours |= set(re.findall(r'MetricName=\\"(\w+)\\"', body))
    assert {"LatenessMs", "LatenessByTargetMs", "Emitted", "WatermarkLagSeconds"} <= ours
    assert ours <= published, ours - published
