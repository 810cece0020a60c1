"""Provision a template on an AWS endpoint: every resource of the expanded template (the SAM
translator's CloudFormation) gets one rule, by type (`RESOURCE_RULES`):

- `create`: queues, tables and buckets are created on the endpoint from their properties;
  names are the template's (with `AWS::StackName` set to the local stack name) or
  `<stack>-<LogicalId>`;
- `run`: functions, their event source mappings, invoke configurations and schedules become
  local functions and event sources (`delayq_local.specs`);
- `skip`: what the handlers do not need locally (permissions, logs, alarms, dashboards,
  notifications, Glue jobs, the layer...) is not created; its `Ref` and `Fn::GetAtt` resolve to
  placeholder names and ARNs, so that values referring to it can be computed.

A type with no rule is refused with a clear error, so that a new kind of resource in the
template is a decision, never an accident.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from botocore.exceptions import BotoCoreError, ClientError

from delayq_local.aws import AwsEndpoint
from delayq_local.exceptions import ProvisionError, TemplateError
from delayq_local.iam import role_documents
from delayq_local.intrinsics import Resolver
from delayq_local.specs import (
    EventSpec,
    FunctionSpec,
    ScheduleEventSpec,
    function_spec,
    mapping_event,
    schedule_event,
    with_invoke_config,
)
from delayq_local.template import Template

log = logging.getLogger(__name__)

SQS_QUEUE: Final = "AWS::SQS::Queue"
DYNAMODB_TABLE: Final = "AWS::DynamoDB::Table"
S3_BUCKET: Final = "AWS::S3::Bucket"
LAMBDA_FUNCTION: Final = "AWS::Lambda::Function"
EVENT_SOURCE_MAPPING: Final = "AWS::Lambda::EventSourceMapping"
EVENT_INVOKE_CONFIG: Final = "AWS::Lambda::EventInvokeConfig"
EVENTS_RULE: Final = "AWS::Events::Rule"
SCHEDULER_SCHEDULE: Final = "AWS::Scheduler::Schedule"
CUSTOM_RESOURCE: Final = "AWS::CloudFormation::CustomResource"

Rule = Literal["create", "run", "skip"]
# Why a kind of resource is skipped, by service (every type of it) or by type.
SKIPPED_SERVICES: Final[Mapping[str, str]] = {
    "IAM": "permissions: moto does not enforce IAM",
    "Logs": "log groups: the handlers' output goes to the terminal or results/handlers.log",
    "CloudWatch": "alarms and dashboards: no metrics are published locally",
    "SNS": "notifications of alarms",
    "Glue": "report jobs: `delayq report` runs the Spark reports locally",
    "KMS": "keys: moto encrypts nothing",
    "SecretsManager": "Kafka credentials: the local cluster is plain text",
    "EC2": "networking: everything runs on this machine",
}
SKIPPED_TYPES: Final[Mapping[str, str]] = {
    "AWS::SQS::QueuePolicy": "queue policies: moto does not enforce them",
    "AWS::S3::BucketPolicy": "bucket policies: moto does not enforce them",
    "AWS::Lambda::Permission": "invoke permissions: local event sources invoke directly",
    "AWS::Lambda::LayerVersion": "the layer: its package is installed in the virtualenv",
    "AWS::Lambda::Version": "function versions: local functions run the checkout's code",
    "AWS::Lambda::Alias": "function aliases: local functions run the checkout's code",
    CUSTOM_RESOURCE: "a deploy-time action of CloudFormation (the Glue code upload: "
    "`delayq report` runs the reports from the checkout)",
}
RESOURCE_RULES: Final[Mapping[str, Rule]] = {
    SQS_QUEUE: "create",
    DYNAMODB_TABLE: "create",
    S3_BUCKET: "create",
    LAMBDA_FUNCTION: "run",
    EVENT_SOURCE_MAPPING: "run",
    EVENT_INVOKE_CONFIG: "run",
    EVENTS_RULE: "run",
    SCHEDULER_SCHEDULE: "run",
    **dict.fromkeys(SKIPPED_TYPES, "skip"),
}


def resource_rule(resource_type: str) -> tuple[Rule, str]:
    """What the local runner does with a resource type, and why when it skips it."""
    if resource_type in SKIPPED_TYPES:
        return "skip", SKIPPED_TYPES[resource_type]
    if resource_type.startswith("Custom::"):
        return "skip", SKIPPED_TYPES[CUSTOM_RESOURCE]
    if resource_type in RESOURCE_RULES:
        return RESOURCE_RULES[resource_type], ""
    parts = resource_type.split("::")
    if len(parts) == 3 and parts[0] == "AWS" and parts[1] in SKIPPED_SERVICES:
        return "skip", SKIPPED_SERVICES[parts[1]]
    raise TemplateError(
        f"the local runner has no rule for {resource_type}: add one to "
        "delayq_local.provision (create it, run it, or skip it and say why)"
    )


@dataclass(frozen=True)
class ProvisionedResource:
    """A created resource: what `Ref` and `Fn::GetAtt` give, and its resolved properties."""

    logical_id: str
    type: str
    ref: str
    attributes: Mapping[str, str]
    properties: Mapping[str, Any]


@dataclass(frozen=True)
class Deployment:
    """The template as deployed locally: created resources, resolved functions, outputs, and
    what was not created or is not run (logical id: why)."""

    stack_name: str
    region: str
    account: str
    resources: Mapping[str, ProvisionedResource]
    functions: Mapping[str, FunctionSpec]
    outputs: Mapping[str, Any]
    skipped: Mapping[str, str] = field(default_factory=dict)

    def by_arn(self, arn: str) -> ProvisionedResource:
        """The created resource whose `Arn` (or a table's `StreamArn`) is `arn`."""
        for resource in self.resources.values():
            if arn in (resource.attributes.get("Arn"), resource.attributes.get("StreamArn")):
                return resource
        raise ProvisionError(f"no provisioned resource has ARN {arn}")

    def of_type(self, resource_type: str) -> Iterator[ProvisionedResource]:
        """The created resources of one CloudFormation type."""
        return (r for r in self.resources.values() if r.type == resource_type)


def provision(
    template: Template,
    stack_name: str,
    endpoint: AwsEndpoint,
    parameters: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Deployment:
    """Expand the template (SAM), create its queues, tables and buckets, resolve its functions
    and event sources, and skip the rest (see `RESOURCE_RULES`).

    `overrides`: properties set over the template's, by logical id (a fault test shortens
    the queues' visibility timeouts so that a crashed batch comes back within seconds).
    """
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,63}", stack_name):
        raise TemplateError(f"bad stack name {stack_name!r} (letters, digits, hyphens)")
    values = template.parameter_values(parameters)
    expanded = template.expand(parameters, endpoint.region)
    rules = {
        logical_id: resource_rule(str(resource.get("Type")))
        for logical_id, resource in expanded.resources.items()
    }
    rules.update(_deploy_time_functions(expanded.resources))
    account = str(endpoint.client("sts").get_caller_identity()["Account"])
    lookup = _Lookup(expanded, stack_name, endpoint.region, account)
    resolver = Resolver(
        template=expanded,
        parameters=values,
        pseudo={
            "AWS::StackName": stack_name,
            "AWS::Region": endpoint.region,
            "AWS::AccountId": account,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{endpoint.region}:{account}:stack/"
            f"{stack_name}/local",
            "AWS::NotificationARNs": [],
        },
        resources=lookup,
    )
    included = {
        logical_id: resource
        for logical_id, resource in expanded.resources.items()
        if resolver.included(resource)
    }
    for logical_id, resource in included.items():
        function_name = (resource.get("Properties") or {}).get("FunctionName")
        if resource.get("Type") == LAMBDA_FUNCTION and function_name is not None:
            lookup.names[logical_id] = str(resolver.resolve(function_name))
    wanted = {k: r for k, r in included.items() if rules[k][0] == "create"}
    context = _Context(stack_name=stack_name, endpoint=endpoint)
    for logical_id in _creation_order(wanted):
        resource = wanted[logical_id]
        properties = {
            **resolver.resolve(resource.get("Properties") or {}),
            **(overrides or {}).get(logical_id, {}),
        }
        created = _CREATORS[resource["Type"]](context, logical_id, properties)
        lookup.created[logical_id] = created
        log.info("created %s %s: %s", resource["Type"], logical_id, created.ref)

    skipped = {k: rules[k][1] for k in included if rules[k][0] == "skip"}
    running = {k: r for k, r in included.items() if rules[k][0] == "run"}
    functions = {
        logical_id: replace(
            spec, role_policies=_role_policies(expanded, expanded.resources[logical_id], resolver)
        )
        for logical_id, spec in _functions(expanded, running, resolver, lookup, skipped).items()
    }
    if skipped:
        log.info("not created locally: %s", ", ".join(sorted(skipped)))
    outputs = {
        name: resolver.resolve(output.get("Value"))
        for name, output in (expanded.body.get("Outputs") or {}).items()
        if resolver.included(output)
    }
    return Deployment(
        stack_name=stack_name,
        region=endpoint.region,
        account=account,
        resources=dict(lookup.created),
        functions=functions,
        outputs=outputs,
        skipped=skipped,
    )


def _functions(
    template: Template,
    running: Mapping[str, Mapping[str, Any]],
    resolver: Resolver,
    lookup: _Lookup,
    skipped: dict[str, str],
) -> dict[str, FunctionSpec]:
    """The functions, with their event sources and asynchronous invocation settings. Event
    sources keep the SAM event's name when the translator made them from one."""
    functions = {
        logical_id: function_spec(
            logical_id,
            lookup.ref(logical_id),
            lookup.get_att(logical_id, "Arn"),
            resolver.resolve(resource.get("Properties") or {}),
        )
        for logical_id, resource in running.items()
        if resource["Type"] == LAMBDA_FUNCTION
    }
    for logical_id, resource in running.items():
        resource_type = resource["Type"]
        if resource_type == LAMBDA_FUNCTION:
            continue
        props = resolver.resolve(resource.get("Properties") or {})
        name = template.event_names.get(logical_id, logical_id)
        if resource_type == EVENT_INVOKE_CONFIG:
            target = _function_named(functions, str(props.get("FunctionName", "")))
            functions[target] = with_invoke_config(functions[target], props)
            continue
        if resource_type == EVENT_SOURCE_MAPPING:
            targets: list[tuple[str, EventSpec]] = [
                (str(props.get("FunctionName", "")), mapping_event(name, props))
            ]
        else:
            targets = list(_schedules(name, props))
        if not targets:
            skipped[logical_id] = "a schedule or rule that invokes no function of the template"
        for function_name, event in targets:
            target = _function_named(functions, function_name)
            functions[target] = replace(
                functions[target], events=(*functions[target].events, event)
            )
    return functions


def _deploy_time_functions(
    resources: Mapping[str, Mapping[str, Any]],
) -> dict[str, tuple[Rule, str]]:
    """The functions custom resources invoke (their `ServiceToken`): CloudFormation runs them at
    deploy time, and the custom resources are skipped locally, so they are too."""
    found: dict[str, tuple[Rule, str]] = {}
    for logical_id, resource in resources.items():
        kind = str(resource.get("Type"))
        if kind != CUSTOM_RESOURCE and not kind.startswith("Custom::"):
            continue
        token = (resource.get("Properties") or {}).get("ServiceToken")
        target = token.get("Fn::GetAtt", [None])[0] if isinstance(token, dict) else None
        if (resources.get(str(target)) or {}).get("Type") == LAMBDA_FUNCTION:
            found[str(target)] = ("skip", f"runs at deploy time only, for {logical_id}")
    return found


def _role_policies(
    template: Template, function: Mapping[str, Any], resolver: Resolver
) -> tuple[Mapping[str, Any], ...] | None:
    documents = role_documents(template.resources, function, resolver.resolve)
    return None if documents is None else tuple(documents)


def _schedules(name: str, props: Mapping[str, Any]) -> list[tuple[str, ScheduleEventSpec]]:
    """`(function ARN, schedule)` for each function target of an `AWS::Events::Rule` with a
    `ScheduleExpression` or of an `AWS::Scheduler::Schedule`; other targets are not run."""
    expression = props.get("ScheduleExpression")
    if not expression:
        log.warning("%s: a rule without a schedule (an event pattern) is not emulated", name)
        return []
    targets = props.get("Targets") or ([props["Target"]] if "Target" in props else [])
    return [
        (str(t["Arn"]), schedule_event(name, str(expression), props.get("State"), t.get("Input")))
        for t in targets
        if str(t.get("Arn", "")).startswith("arn:aws:lambda:")
    ]


def _function_named(functions: Mapping[str, FunctionSpec], name: str) -> str:
    """The logical id of the function a `FunctionName` or target `Arn` designates."""
    for logical_id, spec in functions.items():
        if name in (spec.name, spec.arn, logical_id):
            return logical_id
    raise TemplateError(f"an event source or schedule targets unknown function {name!r}")


@dataclass
class _Lookup:
    """`Ref`/`GetAtt` of resources: real values once created, placeholders for the others."""

    template: Template
    stack_name: str
    region: str
    account: str
    created: dict[str, ProvisionedResource] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def ref(self, logical_id: str) -> Any:
        if logical_id in self.created:
            return self.created[logical_id].ref
        self._not_yet(logical_id)
        return self.names.get(logical_id) or default_name(self.stack_name, logical_id)

    def get_att(self, logical_id: str, attribute: str) -> Any:
        if logical_id in self.created:
            attributes = self.created[logical_id].attributes
            if attribute not in attributes:
                raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute} is not available")
            return attributes[attribute]
        self._not_yet(logical_id)
        resource_type = str(self.template.resources[logical_id].get("Type"))
        if resource_type == LAMBDA_FUNCTION and attribute == "Arn":
            return f"arn:aws:lambda:{self.region}:{self.account}:function:{self.ref(logical_id)}"
        service = resource_type.split("::")[1].lower() if "::" in resource_type else "local"
        return f"arn:aws:{service}:{self.region}:{self.account}:{logical_id}/{attribute}"

    def _not_yet(self, logical_id: str) -> None:
        if RESOURCE_RULES.get(str(self.template.resources[logical_id].get("Type"))) == "create":
            raise TemplateError(f"{logical_id} is referenced before it exists (or is excluded)")


@dataclass(frozen=True)
class _Context:
    stack_name: str
    endpoint: AwsEndpoint


def default_name(stack_name: str, logical_id: str) -> str:
    """The name of a resource the template leaves unnamed: `<stack>-<LogicalId>`."""
    return f"{stack_name}-{logical_id}"


def _creation_order(resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Logical ids ordered so that a resource comes after those its properties refer to."""
    depends = {
        logical_id: _references(resource.get("Properties") or {}) & set(resources)
        for logical_id, resource in resources.items()
    }
    ordered: list[str] = []
    visiting: set[str] = set()

    def visit(logical_id: str) -> None:
        if logical_id in ordered:
            return
        if logical_id in visiting:
            raise TemplateError(f"circular reference through {logical_id}")
        visiting.add(logical_id)
        for dependency in sorted(depends[logical_id]):
            visit(dependency)
        visiting.discard(logical_id)
        ordered.append(logical_id)

    for logical_id in sorted(resources):
        visit(logical_id)
    return ordered


def _references(value: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(value, dict):
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                found.add(arg)
            elif key == "Fn::GetAtt" and isinstance(arg, list) and arg:
                found.add(str(arg[0]))
            elif key == "Fn::Sub":
                text = arg if isinstance(arg, str) else arg[0]
                found.update(m.split(".", 1)[0] for m in re.findall(r"\$\{([^}!]*)\}", text))
            found |= _references(arg)
    elif isinstance(value, list):
        for item in value:
            found |= _references(item)
    return found


def _api_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _queue_attribute(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _create_queue(context: _Context, logical_id: str, props: dict[str, Any]) -> ProvisionedResource:
    fifo = _api_bool(props.get("FifoQueue", False))
    name = str(
        props.get("QueueName")
        or default_name(context.stack_name, logical_id) + (".fifo" if fifo else "")
    )
    # Every other CloudFormation property of a queue is an SQS attribute of the same name.
    attributes = {
        key: _queue_attribute(value)
        for key, value in props.items()
        if key not in ("QueueName", "Tags")
    }
    kwargs: dict[str, Any] = {"QueueName": name, "Attributes": attributes}
    tags = {t["Key"]: str(t["Value"]) for t in props.get("Tags") or []}
    if tags:
        kwargs["tags"] = tags
    sqs = context.endpoint.client("sqs")
    try:
        url = sqs.create_queue(**kwargs)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
    except (BotoCoreError, ClientError) as e:
        raise ProvisionError(f"{logical_id}: create queue {name}: {e}") from e
    return ProvisionedResource(
        logical_id=logical_id,
        type=SQS_QUEUE,
        ref=url,
        attributes={"Arn": arn, "QueueName": name, "QueueUrl": url},
        properties=props,
    )


_TABLE_PASS_THROUGH: Final = (
    "AttributeDefinitions",
    "KeySchema",
    "BillingMode",
    "GlobalSecondaryIndexes",
    "LocalSecondaryIndexes",
    "TableClass",
    "Tags",
)
_TABLE_AFTER_CREATE: Final = ("TimeToLiveSpecification", "PointInTimeRecoverySpecification")


def _throughput(value: Mapping[str, Any]) -> dict[str, int]:
    return {key: int(v) for key, v in value.items()}


def _table_request(name: str, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """CreateTable arguments from the table's CloudFormation properties."""
    kwargs: dict[str, Any] = {"TableName": name}
    kwargs.update({key: props[key] for key in _TABLE_PASS_THROUGH if key in props})
    if "DeletionProtectionEnabled" in props:
        kwargs["DeletionProtectionEnabled"] = _api_bool(props["DeletionProtectionEnabled"])
    if "ProvisionedThroughput" in props:
        kwargs["ProvisionedThroughput"] = _throughput(props["ProvisionedThroughput"])
    for index in kwargs.get("GlobalSecondaryIndexes", []):
        if "ProvisionedThroughput" in index:
            index["ProvisionedThroughput"] = _throughput(index["ProvisionedThroughput"])
    if "StreamSpecification" in props:
        kwargs["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": props["StreamSpecification"]["StreamViewType"],
        }
    if "SSESpecification" in props:
        sse = dict(props["SSESpecification"])
        kwargs["SSESpecification"] = {
            "Enabled": _api_bool(sse.pop("SSEEnabled", False)),
            **sse,
        }
    ignored = set(props) - set(kwargs) - {"TableName", *_TABLE_AFTER_CREATE}
    if ignored:
        log.info("%s: not emulated locally: %s", logical_id, ", ".join(sorted(ignored)))
    return kwargs


def _create_table(context: _Context, logical_id: str, props: dict[str, Any]) -> ProvisionedResource:
    name = str(props.get("TableName") or default_name(context.stack_name, logical_id))
    dynamodb = context.endpoint.client("dynamodb")
    try:
        try:
            dynamodb.create_table(**_table_request(name, logical_id, props))
        except ClientError as e:
            if e.response["Error"]["Code"] != "ResourceInUseException":
                raise
            log.info("%s: table %s exists, reusing it", logical_id, name)
        dynamodb.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
        ttl = props.get("TimeToLiveSpecification")
        if ttl and _api_bool(ttl.get("Enabled", False)):
            current = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
            if current.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
                dynamodb.update_time_to_live(
                    TableName=name,
                    TimeToLiveSpecification={
                        "Enabled": True,
                        "AttributeName": ttl["AttributeName"],
                    },
                )
        pitr = props.get("PointInTimeRecoverySpecification")
        if pitr and _api_bool(pitr.get("PointInTimeRecoveryEnabled", False)):
            dynamodb.update_continuous_backups(
                TableName=name,
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
            )
        table = dynamodb.describe_table(TableName=name)["Table"]
    except (BotoCoreError, ClientError) as e:
        raise ProvisionError(f"{logical_id}: create table {name}: {e}") from e
    attributes = {"Arn": table["TableArn"]}
    if table.get("LatestStreamArn"):
        attributes["StreamArn"] = table["LatestStreamArn"]
    return ProvisionedResource(
        logical_id=logical_id,
        type=DYNAMODB_TABLE,
        ref=name,
        attributes=attributes,
        properties=props,
    )


def _create_bucket(
    context: _Context, logical_id: str, props: dict[str, Any]
) -> ProvisionedResource:
    name = str(props.get("BucketName") or default_name(context.stack_name, logical_id)).lower()
    s3 = context.endpoint.client("s3")
    region = context.endpoint.region
    kwargs: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        try:
            s3.create_bucket(**kwargs)
        except ClientError as e:
            if e.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                raise
        if "VersioningConfiguration" in props:
            s3.put_bucket_versioning(
                Bucket=name,
                VersioningConfiguration={"Status": props["VersioningConfiguration"]["Status"]},
            )
        encryption = props.get("BucketEncryption")
        if encryption:
            s3.put_bucket_encryption(
                Bucket=name,
                ServerSideEncryptionConfiguration={
                    "Rules": [
                        _encryption_rule(r) for r in encryption["ServerSideEncryptionConfiguration"]
                    ]
                },
            )
        block = props.get("PublicAccessBlockConfiguration")
        if block:
            s3.put_public_access_block(
                Bucket=name,
                PublicAccessBlockConfiguration={k: _api_bool(v) for k, v in block.items()},
            )
    except (BotoCoreError, ClientError) as e:
        raise ProvisionError(f"{logical_id}: create bucket {name}: {e}") from e
    handled = {
        "BucketName",
        "VersioningConfiguration",
        "BucketEncryption",
        "PublicAccessBlockConfiguration",
    }
    ignored = set(props) - handled
    if ignored:
        log.info("%s: not emulated locally: %s", logical_id, ", ".join(sorted(ignored)))
    return ProvisionedResource(
        logical_id=logical_id,
        type=S3_BUCKET,
        ref=name,
        attributes={
            "Arn": f"arn:aws:s3:::{name}",
            "DomainName": f"{name}.s3.amazonaws.com",
            "RegionalDomainName": f"{name}.s3.{region}.amazonaws.com",
        },
        properties=props,
    )


_CREATORS: Final[Mapping[str, Callable[[_Context, str, dict[str, Any]], ProvisionedResource]]] = {
    SQS_QUEUE: _create_queue,
    DYNAMODB_TABLE: _create_table,
    S3_BUCKET: _create_bucket,
}


def _encryption_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A CloudFormation `ServerSideEncryptionRule` in PutBucketEncryption's shape."""
    api: dict[str, Any] = {}
    if "ServerSideEncryptionByDefault" in rule:
        api["ApplyServerSideEncryptionByDefault"] = rule["ServerSideEncryptionByDefault"]
    if "BucketKeyEnabled" in rule:
        api["BucketKeyEnabled"] = _api_bool(rule["BucketKeyEnabled"])
    return api
