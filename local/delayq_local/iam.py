"""Each function's AWS calls checked against its role in the template, as IAM would check them.

moto never enforces IAM, so a call a role does not grant passes every local test and fails in
AWS (AccessDenied). Here every call a function makes, from its handler or from its event
source (Lambda's pollers and destinations use the function's execution role), is turned into
the IAM requests AWS would evaluate (action, resource ARN, condition keys such as
`dynamodb:LeadingKeys` and `s3:prefix`) and evaluated against the role's identity-based
policies: an explicit Deny wins, else an Allow must match action, resource and every
condition. A refused call is answered as AWS answers it (an AccessDenied error) and recorded:
the local stack reports its denials, and the tests fail on any.

Not modelled: resource-based policies (queue and bucket policies), permission boundaries,
session policies and SCPs; what a condition operator outside `SUPPORTED_OPERATORS` means (a
policy using one is rejected, so the check never passes by ignoring it). A call with no
mapping to IAM requests is refused with a message naming it, so a new call gets a mapping
before it can run.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final
from urllib.parse import urlparse

from botocore.awsrequest import AWSResponse

from delayq_local.exceptions import LocalStackError
from delayq_local.sandbox import current_function, current_poller

log = logging.getLogger(__name__)

_DECISION: Final = "delayq_iam"
_READER: Final = "delayq_iam_reader"
# S3 answers a read of a missing key 404 only to a caller that may list the bucket (no prefix
# in that check); to others 403, so that keys cannot be probed.
_S3_READS: Final = frozenset({"GetObject", "HeadObject"})
_S3_MISSING: Final = frozenset({"NoSuchKey", "404", "NotFound"})
_ACTION_OF_BATCH: Final[Mapping[str, str]] = {
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "s3:HeadObject": "s3:GetObject",
    "s3:ListObjectsV2": "s3:ListBucket",
    "s3:ListObjects": "s3:ListBucket",
    "lambda:Invoke": "lambda:InvokeFunction",
}
# The error code each service answers a refused call with.
_DENIED_CODE: Final[Mapping[str, str]] = {
    "dynamodb": "AccessDeniedException",
    "dynamodb-streams": "AccessDeniedException",
    "lambda": "AccessDeniedException",
    "secrets-manager": "AccessDeniedException",
}
SUPPORTED_OPERATORS: Final = frozenset(
    {
        "StringEquals",
        "StringNotEquals",
        "StringEqualsIgnoreCase",
        "StringNotEqualsIgnoreCase",
        "StringLike",
        "StringNotLike",
        "ArnEquals",
        "ArnLike",
        "ArnNotEquals",
        "ArnNotLike",
        "Bool",
        "Null",
    }
)
_NEGATED: Final = frozenset(
    {
        "StringNotEquals",
        "StringNotEqualsIgnoreCase",
        "StringNotLike",
        "ArnNotEquals",
        "ArnNotLike",
    }
)


class PolicyError(LocalStackError):
    """A policy the checker cannot evaluate faithfully, or a call it cannot map."""


# Policies ----------------------------------------------------------------------------------


@cache
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    """IAM's wildcards: `*` any run of characters (`/` and `:` included), `?` one."""
    body = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _like(pattern: str, value: str, ignore_case: bool = False) -> bool:
    return _glob(pattern, ignore_case).fullmatch(value) is not None


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list | tuple) else [value]
    return tuple(str(item).lower() if isinstance(item, bool) else str(item) for item in items)


@dataclass(frozen=True)
class Condition:
    """One operator and key of a statement's `Condition` block, with its policy values."""

    operator: str
    key: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, operator: str, key: str, values: Any) -> Condition:
        """Check the operator is one this module evaluates faithfully."""
        base = operator.split(":", 1)[1] if ":" in operator else operator
        qualifier = operator.split(":", 1)[0] if ":" in operator else ""
        if qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise PolicyError(f"condition operator {operator} is not supported")
        base = base.removesuffix("IfExists")
        if base not in SUPPORTED_OPERATORS:
            raise PolicyError(f"condition operator {operator} is not supported")
        parsed = _strings(values)
        if not parsed:
            raise PolicyError(f"condition {operator} {key} has no value")
        return cls(operator, key, parsed)

    def holds(self, context: Mapping[str, tuple[str, ...]]) -> bool:
        """IAM's evaluation, with missing keys as AWS treats them."""
        qualifier, _, base = self.operator.rpartition(":")
        if_exists = base.endswith("IfExists")
        base = base.removesuffix("IfExists")
        present = {k.lower(): v for k, v in context.items()}.get(self.key.lower())
        if base == "Null":
            return (not present) == (self.values[0].lower() == "true")
        negated = base in _NEGATED
        if qualifier == "ForAllValues":
            return all(self._one(base, v) != negated for v in present or ())
        if qualifier == "ForAnyValue":
            return any(self._one(base, v) != negated for v in present or ())
        if not present:
            return if_exists or negated
        return any(self._one(base, v) for v in present) != negated

    def _one(self, base: str, value: str) -> bool:
        """Whether one request value matches any policy value (positive form)."""
        if base.startswith("Arn"):
            # ArnEquals is ArnLike: each of the six colon-separated parts is matched apart,
            # with wildcards inside a part only.
            return any(_arn_like(pattern, value) for pattern in self.values)
        if base in ("StringEquals", "StringNotEquals"):
            return value in self.values
        if base in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
            return value.lower() in {v.lower() for v in self.values}
        if base == "Bool":
            return value.lower() in {v.lower() for v in self.values}
        return any(_like(pattern, value) for pattern in self.values)


def _arn_like(pattern: str, value: str) -> bool:
    wanted, given = pattern.split(":", 5), value.split(":", 5)
    return len(wanted) == len(given) == 6 and all(
        _like(w, g) for w, g in zip(wanted, given, strict=True)
    )


@dataclass(frozen=True)
class Statement:
    """One statement of an identity-based policy."""

    effect: str
    actions: tuple[str, ...] = ()
    not_actions: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    not_resources: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()
    sid: str = ""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Statement:
        """A statement as the policy document writes it."""
        effect = str(raw.get("Effect", ""))
        if effect not in ("Allow", "Deny"):
            raise PolicyError(f"statement {raw.get('Sid', '')!r}: Effect {effect!r}")
        if "Principal" in raw or "NotPrincipal" in raw:
            raise PolicyError(f"statement {raw.get('Sid', '')!r}: a role policy has no Principal")
        for pair in (("Action", "NotAction"), ("Resource", "NotResource")):
            if (pair[0] in raw) == (pair[1] in raw):
                raise PolicyError(
                    f"statement {raw.get('Sid', '')!r}: give exactly one of {' or '.join(pair)}"
                )
        conditions = tuple(
            Condition.parse(operator, key, values)
            for operator, block in (raw.get("Condition") or {}).items()
            for key, values in block.items()
        )
        return cls(
            effect=effect,
            actions=_strings(raw.get("Action")),
            not_actions=_strings(raw.get("NotAction")),
            resources=_strings(raw.get("Resource")),
            not_resources=_strings(raw.get("NotResource")),
            conditions=conditions,
            sid=str(raw.get("Sid", "")),
        )

    def matches(self, action: str, resource: str) -> bool:
        """Whether the statement's action and resource (or their Not forms) match."""
        if self.actions:
            action_matches = any(_like(a, action, True) for a in self.actions)
        else:
            action_matches = not any(_like(a, action, True) for a in self.not_actions)
        if not action_matches:
            return False
        if self.resources:
            return any(_like(r, resource) for r in self.resources)
        return not any(_like(r, resource) for r in self.not_resources)

    def holds(self, context: Mapping[str, tuple[str, ...]]) -> bool:
        """Whether every condition holds for these condition keys."""
        return all(condition.holds(context) for condition in self.conditions)


@dataclass(frozen=True)
class Request:
    """One request IAM evaluates: an action on a resource, with its condition keys."""

    action: str
    resource: str
    context: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        keys = "".join(f" {k}={list(v)}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource}{keys}"


@dataclass(frozen=True)
class Policy:
    """A role's identity-based policies, as one list of statements."""

    statements: tuple[Statement, ...]
    # The statements whose action and resource match, by (action, resource): a role makes the
    # same few calls again and again, and matching the wildcards is the checker's main cost.
    # Conditions (leading keys differ per call) are evaluated on every request.
    _matching: dict[tuple[str, str], tuple[Statement, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def of(cls, documents: Iterable[Mapping[str, Any]]) -> Policy:
        """From policy documents (`{"Version": ..., "Statement": [...]}`)."""
        statements: list[Statement] = []
        for document in documents:
            raw = document.get("Statement") or []
            for statement in [raw] if isinstance(raw, Mapping) else raw:
                statements.append(Statement.parse(statement))
        return cls(tuple(statements))

    def decide(self, request: Request) -> tuple[bool, str]:
        """(allowed, why): an explicit Deny wins, else an Allow must apply."""
        key = (request.action, request.resource)
        matching = self._matching.get(key)
        if matching is None:
            matching = self._matching[key] = tuple(
                s for s in self.statements if s.matches(request.action, request.resource)
            )
        applying = [s for s in matching if s.holds(request.context)]
        denying = [s for s in applying if s.effect == "Deny"]
        if denying:
            return False, f"explicitly denied by {denying[0].sid or 'a Deny statement'}"
        allowing = [s for s in applying if s.effect == "Allow"]
        if allowing:
            return True, f"allowed by {allowing[0].sid or 'an Allow statement'}"
        return False, "no identity-based policy allows it"


# Calls as IAM requests ---------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """Where the calls go: the ARNs of names and URLs are built in this account and region.

    `partition_keys`: the partition-key attribute of each table, by table name (the values
    of `dynamodb:LeadingKeys`).
    """

    region: str
    account: str
    partition_keys: Mapping[str, str] = field(default_factory=dict)

    def queue_arn(self, url_or_name: str) -> str:
        """A queue's ARN from its URL (`.../<account>/<name>`) or name."""
        if url_or_name.startswith("arn:"):
            return url_or_name
        parts = [p for p in urlparse(url_or_name).path.split("/") if p]
        account, name = (parts[-2], parts[-1]) if len(parts) >= 2 else (self.account, parts[-1])
        return f"arn:aws:sqs:{self.region}:{account}:{name}"

    def table_arn(self, table: str, index: str | None = None) -> str:
        """A table's (or an index's) ARN from its name or ARN."""
        arn = _named(table, f"arn:aws:dynamodb:{self.region}:{self.account}:table/")
        return f"{arn}/index/{index}" if index else arn

    def leading_keys(self, table: str, keys: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
        """The partition-key values of items or keys (AttributeValue maps) of `table`."""
        name = self.partition_keys.get(table.rsplit("/", 1)[-1])
        if name is None:
            raise PolicyError(f"the partition key of table {table} is unknown")
        values: list[str] = []
        for key in keys:
            if name not in key:
                raise PolicyError(f"a key of table {table} has no partition key {name}")
            ((_, value),) = key[name].items()
            values.append(str(value))
        return tuple(sorted(set(values)))

    def query_leading_key(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The partition-key value a Query's key condition binds."""
        table = str(params["TableName"])
        name = self.partition_keys.get(table.rsplit("/", 1)[-1])
        names = params.get("ExpressionAttributeNames") or {}
        values = params.get("ExpressionAttributeValues") or {}
        for left, placeholder in _equalities(str(params.get("KeyConditionExpression", ""))):
            if names.get(left, left) == name and placeholder in values:
                ((_, value),) = values[placeholder].items()
                return (str(value),)
        raise PolicyError(f"no partition-key equality in Query of {table}")


@cache
def _equalities(expression: str) -> tuple[tuple[str, str], ...]:
    """The `name = :placeholder` terms of a key condition expression."""
    return tuple(re.findall(r"([#\w.]+)\s*=\s*(:\w+)", expression))


_Mapper = Callable[[str, Mapping[str, Any], "Account"], list[Request]]


def requests_for(
    service: str, operation: str, params: Mapping[str, Any], where: Account
) -> list[Request]:
    """The IAM requests one API call is evaluated as (several for batches over tables)."""
    mapper = _MAPPERS.get(service)
    if mapper is None:
        raise PolicyError(f"no IAM mapping for {service}.{operation}: add one to delayq_local.iam")
    return mapper(operation, params, where)


def _action(service: str, operation: str) -> str:
    action = f"{service}:{operation}"
    return _ACTION_OF_BATCH.get(action, action)


def _sqs(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    queue = params.get("QueueUrl") or params.get("QueueName")
    if not queue:
        raise PolicyError(f"no IAM mapping for sqs.{operation} (no queue)")
    return [Request(_action("sqs", operation), where.queue_arn(str(queue)))]


def _dynamodb(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    leading = "dynamodb:LeadingKeys"
    if operation in ("GetItem", "UpdateItem", "DeleteItem", "PutItem"):
        table = str(params["TableName"])
        key = params.get("Item") if operation == "PutItem" else params.get("Key")
        keys = where.leading_keys(table, [key or {}])
        return [Request(f"dynamodb:{operation}", where.table_arn(table), {leading: keys})]
    if operation == "Query":
        table = str(params["TableName"])
        arn = where.table_arn(table, params.get("IndexName"))
        return [Request("dynamodb:Query", arn, {leading: where.query_leading_key(params)})]
    if operation == "BatchGetItem":
        return [
            Request(
                "dynamodb:BatchGetItem",
                where.table_arn(table),
                {leading: where.leading_keys(table, request.get("Keys") or [])},
            )
            for table, request in (params.get("RequestItems") or {}).items()
        ]
    if operation == "BatchWriteItem":
        return [
            Request(
                "dynamodb:BatchWriteItem",
                where.table_arn(table),
                {
                    leading: where.leading_keys(
                        table,
                        [
                            (w.get("PutRequest") or {}).get("Item")
                            or (w.get("DeleteRequest") or {}).get("Key")
                            or {}
                            for w in writes
                        ],
                    )
                },
            )
            for table, writes in (params.get("RequestItems") or {}).items()
        ]
    if operation in ("TransactWriteItems", "TransactGetItems"):
        return _transaction(operation, params, where)
    if operation in ("DescribeTable", "Scan"):
        return [Request(f"dynamodb:{operation}", where.table_arn(str(params["TableName"])))]
    raise PolicyError(f"no IAM mapping for dynamodb.{operation}: add one to delayq_local.iam")


def _transaction(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    """A transaction is evaluated as each of its item operations (AWS: a TransactWriteItems
    needs PutItem, UpdateItem, DeleteItem or ConditionCheckItem for each item)."""
    actions = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem"}
    actions |= {"ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}
    requests: list[Request] = []
    for item in params.get("TransactItems") or []:
        ((kind, body),) = item.items()
        table = str(body["TableName"])
        key = body.get("Item") if kind == "Put" else body.get("Key")
        requests.append(
            Request(
                f"dynamodb:{actions[kind]}",
                where.table_arn(table),
                {"dynamodb:LeadingKeys": where.leading_keys(table, [key or {}])},
            )
        )
    return requests


def _dynamodb_streams(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    if operation == "ListStreams":
        return [Request("dynamodb:ListStreams", "*")]
    arn = params.get("StreamArn")
    if arn is None and operation == "GetRecords":
        # A shard iterator starts with its stream's ARN (`<stream arn>|1|...`).
        arn = str(params.get("ShardIterator", "")).split("|", 1)[0]
    if not arn or not str(arn).startswith("arn:"):
        raise PolicyError(f"no stream ARN in dynamodbstreams.{operation}")
    return [Request(f"dynamodb:{operation}", str(arn))]


def _s3(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    bucket = str(params.get("Bucket", ""))
    if operation in ("ListObjectsV2", "ListObjects"):
        prefix = params.get("Prefix")
        context = {"s3:prefix": (str(prefix),)} if prefix is not None else {}
        return [Request(_action("s3", operation), f"arn:aws:s3:::{bucket}", context)]
    if operation in ("GetObject", "HeadObject", "PutObject", "DeleteObject"):
        return [Request(_action("s3", operation), f"arn:aws:s3:::{bucket}/{params['Key']}")]
    if operation == "DeleteObjects":
        keys = (params.get("Delete") or {}).get("Objects") or []
        return [Request("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{k['Key']}") for k in keys]
    raise PolicyError(f"no IAM mapping for s3.{operation}: add one to delayq_local.iam")


def _named(name: str, prefix: str) -> str:
    """`name` if it is an ARN already, else `prefix` + `name`."""
    return name if name.startswith("arn:") else f"{prefix}{name}"


def _lambda(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    prefix = f"arn:aws:lambda:{where.region}:{where.account}:function:"
    return [Request(_action("lambda", operation), _named(str(params["FunctionName"]), prefix))]


def _secrets(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
    prefix = f"arn:aws:secretsmanager:{where.region}:{where.account}:secret:"
    return [Request(f"secretsmanager:{operation}", _named(str(params["SecretId"]), prefix))]


def _account_wide(service: str) -> _Mapper:
    """Services whose calls here take no resource ARN (IAM evaluates them against `*`)."""

    def mapper(operation: str, params: Mapping[str, Any], where: Account) -> list[Request]:
        return [Request(f"{service}:{operation}", "*")]

    return mapper


_MAPPERS: Final[Mapping[str, _Mapper]] = {
    "sqs": _sqs,
    "dynamodb": _dynamodb,
    "dynamodb-streams": _dynamodb_streams,
    "s3": _s3,
    "lambda": _lambda,
    "secrets-manager": _secrets,
    "cloudwatch": _account_wide("cloudwatch"),
}


# The check on every call -------------------------------------------------------------------


@dataclass(frozen=True)
class Denial:
    """A call IAM would refuse."""

    function: str
    call: str
    request: str
    reason: str

    def __str__(self) -> str:
        return f"{self.function}: {self.call} needs {self.request}: {self.reason}"


class IamGuard:
    """Checks the calls of functions with a role (`policies`, by logical id) before they are
    sent. Calls made on no function's behalf (the stack itself, tests, operators) pass."""

    def __init__(self, policies: Mapping[str, Policy], where: Account) -> None:
        self.policies = dict(policies)
        self.where = where
        self._denials: list[Denial] = []
        self._checked = 0
        self._lock = threading.Lock()
        self._emitters: list[Any] = []

    @property
    def denials(self) -> list[Denial]:
        """The calls refused so far."""
        with self._lock:
            return list(self._denials)

    @property
    def checked(self) -> int:
        """How many calls were checked."""
        with self._lock:
            return self._checked

    def check(
        self, function: str, service: str, operation: str, params: Mapping[str, Any]
    ) -> Denial | None:
        """None if `function`'s role allows the call (or it has no role here), else why not."""
        policy = self.policies.get(function)
        if policy is None:
            return None
        call = f"{service}.{operation}"
        denial: Denial | None
        try:
            requests = requests_for(service, operation, params, self.where)
        except (PolicyError, KeyError, ValueError, TypeError, AttributeError) as e:
            denial = Denial(function, call, "an IAM request", f"cannot be checked: {e}")
        else:
            denial = None
            for request in requests:
                allowed, why = policy.decide(request)
                if not allowed:
                    denial = Denial(function, call, request.describe(), why)
                    break
        with self._lock:
            self._checked += 1
            if denial is not None:
                self._denials.append(denial)
        if denial is not None:
            log.error("IAM would refuse %s", denial)
        return denial

    # On botocore's events ------------------------------------------------------------------

    def install(self, events: Any) -> IamGuard:
        """Check the calls of clients made from this event emitter (a session's or a
        client's `meta.events`)."""
        if any(events is known for known in self._emitters):
            return self
        events.register("before-parameter-build", self._decide, unique_id=self._id("decide"))
        events.register("before-call", self._refuse, unique_id=self._id("refuse"))
        events.register("after-call", self._missing_key, unique_id=self._id("missing"))
        self._emitters.append(events)
        return self

    def remove(self) -> None:
        """Stop checking."""
        for events in self._emitters:
            events.unregister("before-parameter-build", unique_id=self._id("decide"))
            events.unregister("before-call", unique_id=self._id("refuse"))
            events.unregister("after-call", unique_id=self._id("missing"))
        self._emitters.clear()

    def _id(self, handler: str) -> str:
        return f"delayq-iam-{handler}-{id(self)}"

    def _decide(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        function = current_function() or current_poller()
        if not function:
            return
        service = model.service_model.service_id.hyphenize()
        denial = self.check(function, service, model.name, params)
        if denial is not None:
            context[_DECISION] = (service, denial)
        elif service == "s3" and model.name in _S3_READS:
            context[_READER] = (function, str(params.get("Bucket", "")))

    def _missing_key(self, parsed: Any, context: dict[str, Any], **_: Any) -> None:
        """A missing key's 404 becomes S3's 403 when the reader may not list the bucket."""
        reader: tuple[str, str] | None = context.get(_READER)
        error = parsed.get("Error", {}) if isinstance(parsed, dict) else {}
        if reader is None or error.get("Code") not in _S3_MISSING:
            return
        function, bucket = reader
        listing = Request("s3:ListBucket", f"arn:aws:s3:::{bucket}")
        allowed, why = self.policies[function].decide(listing)
        if allowed:
            return
        denial = Denial(function, "s3.GetObject of a missing key", listing.describe(), why)
        with self._lock:
            self._denials.append(denial)
        log.error("IAM would refuse %s", denial)
        error.update(Code="AccessDenied", Message=f"Access Denied ({denial})")
        parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403

    def _refuse(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, Any] | None:
        decided: tuple[str, Denial] | None = context.get(_DECISION)
        if decided is None:
            return None
        service, denial = decided
        code = _DENIED_CODE.get(service, "AccessDenied")
        message = f"not authorized to perform {denial.request} ({denial.reason})"
        parsed = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        }
        return AWSResponse("", 403, {}, None), parsed


def role_documents(
    template_resources: Mapping[str, Mapping[str, Any]],
    function: Mapping[str, Any],
    resolve: Any,
) -> list[Mapping[str, Any]] | None:
    """The policy documents of a function's role, resolved; None when its role is not a role
    of the template or has managed policies (whose content the template does not hold)."""
    role = (function.get("Properties") or {}).get("Role")
    if not (isinstance(role, Mapping) and list(role) == ["Fn::GetAtt"]):
        return None
    role_id = role["Fn::GetAtt"][0]
    resource = template_resources.get(role_id) or {}
    if resource.get("Type") != "AWS::IAM::Role":
        return None
    properties = resolve(resource.get("Properties") or {})
    if properties.get("ManagedPolicyArns"):
        log.warning("%s has managed policies: its calls are not checked", role_id)
        return None
    documents = [p["PolicyDocument"] for p in properties.get("Policies") or []]
    for other in template_resources.values():
        if other.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            attached = (other.get("Properties") or {}).get("Roles") or []
            if {"Ref": role_id} in attached:
                documents.append(resolve(other["Properties"])["PolicyDocument"])
    return documents


def guard_of(policies: Mapping[str, Sequence[Mapping[str, Any]]], where: Account) -> IamGuard:
    """A guard over the functions' policy documents (by logical id)."""
    return IamGuard({k: Policy.of(v) for k, v in policies.items()}, where)
