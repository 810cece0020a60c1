"""The simulation's IAM guard decides every call exactly as the local stack's guard does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from delayq_local.iam import Account, Denial, IamGuard, Policy, guard_of
from sim.iam import ACCOUNT, REGION, SimGuard, _documents, roles

TABLE = roles().names["MessageTable"]
ARN = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"


def query(pk: str, **extra: Any) -> dict[str, Any]:
    """The scheduler's Query of one partition (``delayq.store``)."""
    return {
        "TableName": TABLE,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": pk}},
        "ConsistentRead": True,
        "Limit": 100,
        **extra,
    }


# Calls in order, each made twice in a row: the second of each is answered from the cache
# where one applies.
CALLS: list[tuple[str, str, str, Mapping[str, Any]]] = [
    ("scheduler", "dynamodb", "Query", query("b#1#1795248000")),
    ("scheduler", "dynamodb", "Query", query("b#2#1795248000")),
    ("scheduler", "dynamodb", "Query", query("b#1#1795248001")),
    ("scheduler", "dynamodb", "Query", query("b#2#1795248000", IndexName="by-due")),
    ("scheduler", "dynamodb", "Query", {**query("x"), "KeyConditionExpression": "sk = :pk"}),
    ("scheduler", "dynamodb", "Query", {"KeyConditionExpression": "pk = :pk"}),
    ("scheduler", "dynamodb", "Query", {**query("x"), "IndexName": ["unhashable"]}),
    ("scheduler", "dynamodb", "Query", {**query("x"), "TableName": "other"}),
    ("timer", "dynamodb", "Query", query("b#1#1795248000")),
    ("nobody", "dynamodb", "Query", query("b#1#1795248000")),
    ("emitter", "dynamodb", "Query", query("b#3#1795248002")),
    ("scheduler", "dynamodb", "GetItem", {"TableName": TABLE, "Key": {"pk": {"S": "w"}}}),
    ("scheduler", "dynamodb", "Query", query("b#1#1795248003")),
]


def decisions(guard: IamGuard) -> tuple[list[Denial | None], int, list[Denial]]:
    answers = [guard.check(*call) for call in CALLS for _ in range(2)]
    return answers, guard.checked, guard.denials


def guards(policies: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[IamGuard, SimGuard]:
    where = Account(REGION, ACCOUNT, {TABLE: "pk"})
    return guard_of(policies, where), SimGuard(
        {k: Policy.of(v) for k, v in policies.items()}, where
    )


def test_the_template_roles_are_decided_as_the_local_guard_decides_them() -> None:
    plain, cached = guards(_documents()[0])
    expected = decisions(plain)
    assert decisions(cached) == expected
    answers, checked, denials = expected
    assert answers[0] is None  # the scheduler's Query is allowed
    assert checked == len(CALLS) * 2 - 2  # a function without a role is not checked
    assert len(denials) > 4  # the refusals are recorded on every call, not only the first
    # The scheduler's Queries of the table were remembered as allowed whatever their key.
    assert cached._queries[("scheduler", TABLE, None)] is True


def test_the_role_the_simulation_uses_is_the_cached_guard() -> None:
    assert isinstance(roles().guard, SimGuard)


@pytest.mark.parametrize("effect", ["Allow", "Deny"])
def test_a_grant_that_depends_on_the_key_is_decided_on_every_key(effect: str) -> None:
    # The role lets the scheduler read shard 1 only (or everything but shard 1): the cache
    # must not carry a decision over from one key to another.
    condition = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["b#1#*"]}}
    statements = [
        {"Effect": effect, "Action": "dynamodb:Query", "Resource": ARN, "Condition": condition}
    ]
    if effect == "Deny":
        statements.append({"Effect": "Allow", "Action": "dynamodb:*", "Resource": ARN})
    plain, cached = guards({"scheduler": [{"Version": "2012-10-17", "Statement": statements}]})
    expected = decisions(plain)
    assert decisions(cached) == expected
    allowed = [answer is None for answer in expected[0][:6]]  # shard 1, 2, then 1 again
    shard_one = effect == "Allow"
    assert allowed == [shard_one] * 2 + [not shard_one] * 2 + [shard_one] * 2
    assert cached._queries[("scheduler", TABLE, None)] is False  # never remembered as allowed
