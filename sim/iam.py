"""IAM in the simulation: every call a function makes is checked against that function's role
in ``template.yaml``, by the same evaluator the local stack uses (:mod:`delayq_local.iam`).

The template is expanded (SAM) and its roles resolved with the physical names the simulation
gives its resources (``<stack>-<LogicalId>``, as CloudFormation names unnamed resources), so a
grant that names the wrong queue, or a call no statement covers, is refused here as AWS would
refuse it, with an ``AccessDenied`` the function sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from delayq_local.iam import Account, Denial, IamGuard, Policy, requests_for, role_documents
from delayq_local.intrinsics import Resolver
from delayq_local.provision import default_name
from delayq_local.template import Template, load_template

TEMPLATE: Final = Path(__file__).resolve().parent.parent / "template.yaml"
STACK: Final = "delayq"
REGION: Final = "us-east-1"
ACCOUNT: Final = "123456789012"  # testkit.aws.FakeSqs's account

# The parameters without a default (a self-managed cluster: no MSK ARN to name).
PARAMETERS: Final = {"AllowedTargets": "orders.*,reminders", "KafkaBootstrapServers": "sim:9092"}
# The simulation's functions by their template logical ids.
FUNCTIONS: Final = {
    "ingest": "IngestFunction",
    "timer": "TimerFunction",
    "scheduler": "SchedulerFunction",
    "emitter": "EmitterFunction",
    "cleanup": "CleanupFunction",
}


@dataclass(frozen=True)
class _Names:
    """``Ref`` and ``Fn::GetAtt`` of the template's resources under CloudFormation's default
    physical names (what the simulation creates)."""

    template: Template

    def _type(self, logical_id: str) -> str:
        return str(self.template.resources[logical_id].get("Type"))

    def _name(self, logical_id: str) -> str:
        props = self.template.resources[logical_id].get("Properties") or {}
        fifo = str(props.get("FifoQueue", "")).lower() == "true"
        return default_name(STACK, logical_id) + (".fifo" if fifo else "")

    def ref(self, logical_id: str) -> Any:
        name = self._name(logical_id)
        if self._type(logical_id) == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"
        return name

    def get_att(self, logical_id: str, attribute: str) -> Any:
        kind, name = self._type(logical_id), self._name(logical_id)
        arns = {
            "AWS::SQS::Queue": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
            "AWS::S3::Bucket": f"arn:aws:s3:::{name}",
            "AWS::Lambda::Function": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}",
        }
        special = {
            "QueueName": name,
            "QueueUrl": self.ref(logical_id),
            "StreamArn": f"{arns.get(kind, '')}/stream/sim",
        }
        if attribute == "Arn" and kind in arns:
            return arns[kind]
        if attribute in special:
            return special[attribute]
        service = kind.split("::")[1].lower() if "::" in kind else "local"
        return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{logical_id}/{attribute}"


class SimGuard(IamGuard):
    """The local stack's guard, with its decisions on Query calls remembered where they
    cannot depend on the call's key.

    Nearly every call of a run is the scheduler's Query of one second's partition. A Query is
    evaluated as one request: ``dynamodb:Query`` on the table (or index), with the partition
    key its key condition binds as ``dynamodb:LeadingKeys``. When no statement of the role
    that matches that action and resource has a condition, the key cannot change the
    decision: an allowed Query of a table is then remembered as allowed (by function, table
    and index), after the guard's own check of the first one. Every call is still checked
    (a Query's key condition must still bind the partition key) and counted; anything else,
    a refusal included, goes through :meth:`IamGuard.check` unchanged.
    """

    def __init__(self, policies: Mapping[str, Policy], where: Account) -> None:
        super().__init__(policies, where)
        # (function, table, index) -> whether every such Query is allowed, whatever its key.
        self._queries: dict[tuple[str, str, Any], bool] = {}

    def check(
        self, function: str, service: str, operation: str, params: Mapping[str, Any]
    ) -> Denial | None:
        """As :meth:`IamGuard.check`."""
        if operation != "Query" or service != "dynamodb" or function not in self.policies:
            return super().check(function, service, operation, params)
        try:
            key = (function, str(params["TableName"]), params.get("IndexName"))
            self.where.query_leading_key(params)  # raises where the guard would refuse
            allowed = self._queries.get(key)
        except Exception:  # noqa: BLE001 -- the guard's own check says why
            allowed = False
        if not allowed:
            denial = super().check(function, service, operation, params)
            if allowed is None:
                self._queries[key] = denial is None and self._keyless(function, params)
            return denial
        with self._lock:
            self._checked += 1
        return None

    def _keyless(self, function: str, params: Mapping[str, Any]) -> bool:
        """Whether no statement that could apply to this Query has a condition."""
        policy = self.policies[function]
        return not any(
            statement.conditions
            for request in requests_for("dynamodb", "Query", params, self.where)
            for statement in policy.statements
            if statement.matches(request.action, request.resource)
        )


@dataclass(frozen=True)
class Roles:
    """The functions' roles as a guard, and the names the simulation must use."""

    guard: IamGuard
    names: Mapping[str, str]  # logical id -> Ref (table and bucket names, queue URLs)


@cache
def _resolved() -> tuple[Template, _Names, Resolver]:
    """The expanded template, its names, and a resolver of its intrinsics (parsed once)."""
    template = load_template(TEMPLATE).expand(PARAMETERS, REGION)
    names = _Names(template)
    resolver = Resolver(
        template=template,
        parameters=template.parameter_values(PARAMETERS),
        pseudo={
            "AWS::StackName": STACK,
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/sim",
            "AWS::NotificationARNs": [],
        },
        resources=names,
    )
    return template, names, resolver


def parameter(name: str) -> Any:
    """A template parameter's value as deployed with its default (``PARAMETERS`` aside)."""
    return _resolved()[2].parameters[name]


def resolved_property(logical_id: str, name: str) -> Any:
    """A resource's property of the template, its intrinsics resolved (``FindInMap`` too)."""
    template, _, resolver = _resolved()
    return resolver.resolve((template.resources[logical_id].get("Properties") or {}).get(name))


@cache
def _documents() -> tuple[dict[str, list[Mapping[str, Any]]], dict[str, str]]:
    template, names, resolver = _resolved()
    policies: dict[str, list[Mapping[str, Any]]] = {}
    for function, logical_id in FUNCTIONS.items():
        documents = role_documents(
            template.resources, template.resources[logical_id], resolver.resolve
        )
        if documents is None:
            raise ValueError(f"{logical_id}: its role is not a role of the template")
        policies[function] = documents
    refs = {
        logical_id: str(names.ref(logical_id))
        for logical_id, resource in template.resources.items()
        if resource.get("Type") in ("AWS::SQS::Queue", "AWS::DynamoDB::Table", "AWS::S3::Bucket")
    }
    return policies, refs


@cache
def _policies() -> dict[str, Policy]:
    """The roles' policies, parsed once per process (a policy only memoises its matching)."""
    return {function: Policy.of(documents) for function, documents in _documents()[0].items()}


def roles() -> Roles:
    """A fresh guard (its denials are this run's) over the template's roles."""
    refs = _documents()[1]
    table = refs["MessageTable"]
    return Roles(SimGuard(_policies(), Account(REGION, ACCOUNT, {table: "pk"})), refs)
