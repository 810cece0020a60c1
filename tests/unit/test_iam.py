"""IAM's evaluation as AWS documents it (delayq_local.iam): explicit Deny wins, wildcards,
condition operators with missing keys and multi-valued keys, and calls mapped to requests."""

from __future__ import annotations

from typing import Any

import pytest

from delayq_local.iam import Account, Condition, Policy, PolicyError, Request, requests_for

TABLE_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/t-Messages"
WHERE = Account("us-east-1", "123456789012", {"t-Messages": "pk"})


def policy(*statements: dict[str, Any]) -> Policy:
    return Policy.of([{"Version": "2012-10-17", "Statement": list(statements)}])


def allows(p: Policy, action: str, resource: str, **context: tuple[str, ...]) -> bool:
    return p.decide(Request(action, resource, context))[0]


def test_an_action_and_a_resource_must_both_match() -> None:
    p = policy({"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:*:*:q-*"})

    assert allows(p, "sqs:SendMessage", "arn:aws:sqs:us-east-1:1:q-delay")
    assert allows(p, "SQS:sendmessage", "arn:aws:sqs:us-east-1:1:q-delay")  # actions: any case
    assert not allows(p, "sqs:SendMessage", "arn:aws:sqs:us-east-1:1:Q-delay")  # ARNs: exact
    assert not allows(p, "sqs:DeleteMessage", "arn:aws:sqs:us-east-1:1:q-delay")


def test_an_explicit_deny_wins_over_any_allow() -> None:
    p = policy(
        {"Effect": "Allow", "Action": "kafka-cluster:*", "Resource": "*"},
        {
            "Sid": "NoInternal",
            "Effect": "Deny",
            "Action": "kafka-cluster:WriteData",
            "Resource": "arn:aws:kafka:*:*:topic/c/u/__*",
        },
    )

    assert allows(p, "kafka-cluster:WriteData", "arn:aws:kafka:r:1:topic/c/u/orders")
    allowed, why = p.decide(Request("kafka-cluster:WriteData", "arn:aws:kafka:r:1:topic/c/u/__x"))
    assert (allowed, why) == (False, "explicitly denied by NoInternal")


def test_nothing_is_allowed_by_default() -> None:
    assert policy().decide(Request("s3:GetObject", "arn:aws:s3:::b/k")) == (
        False,
        "no identity-based policy allows it",
    )


def test_for_all_values_needs_every_value_to_match_and_holds_for_none() -> None:
    condition = Condition.parse("ForAllValues:StringLike", "dynamodb:LeadingKeys", ["cancel#*"])

    assert condition.holds({"dynamodb:LeadingKeys": ("cancel#1", "cancel#2")})
    assert not condition.holds({"dynamodb:LeadingKeys": ("cancel#1", "meta#watermark")})
    # AWS: ForAllValues is true when the request has no value for the key.
    assert condition.holds({})


def test_for_any_value_needs_one_value_and_fails_without_any() -> None:
    condition = Condition.parse("ForAnyValue:StringEquals", "aws:TagKeys", ["team"])

    assert condition.holds({"aws:TagKeys": ("owner", "team")})
    assert not condition.holds({"aws:TagKeys": ("owner",)})
    assert not condition.holds({})


def test_a_missing_key_fails_a_condition_unless_if_exists_or_negated() -> None:
    assert not Condition.parse("StringLike", "s3:prefix", ["payloads/*"]).holds({})
    assert Condition.parse("StringLikeIfExists", "s3:prefix", ["payloads/*"]).holds({})
    assert Condition.parse("StringNotEquals", "s3:prefix", ["x"]).holds({})
    assert Condition.parse("StringLike", "S3:Prefix", ["payloads/*"]).holds(
        {"s3:prefix": ("payloads/a",)}
    )


def test_null_and_bool_conditions() -> None:
    assert Condition.parse("Null", "s3:prefix", "true").holds({})
    assert not Condition.parse("Null", "s3:prefix", "true").holds({"s3:prefix": ("a",)})
    assert Condition.parse("Bool", "aws:SecureTransport", True).holds(
        {"aws:SecureTransport": ("true",)}
    )


@pytest.mark.parametrize(
    "operator", ["NumericLessThan", "DateGreaterThan", "IpAddress", "ForEach:StringLike"]
)
def test_an_operator_that_is_not_evaluated_is_rejected_not_ignored(operator: str) -> None:
    with pytest.raises(PolicyError, match="not supported"):
        Condition.parse(operator, "aws:SourceIp", ["10.0.0.0/8"])


def test_batch_calls_are_evaluated_as_their_single_actions() -> None:
    [request] = requests_for(
        "sqs",
        "SendMessageBatch",
        {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/t-Delay", "Entries": []},
        WHERE,
    )

    assert request == Request("sqs:SendMessage", "arn:aws:sqs:us-east-1:123456789012:t-Delay")


def test_dynamodb_calls_carry_their_partition_keys() -> None:
    [batch] = requests_for(
        "dynamodb",
        "BatchGetItem",
        {"RequestItems": {"t-Messages": {"Keys": [{"pk": {"S": "cancel#2"}, "sk": {"S": "a"}}]}}},
        WHERE,
    )
    [query] = requests_for(
        "dynamodb",
        "Query",
        {
            "TableName": "t-Messages",
            "KeyConditionExpression": "#p = :p AND #s BETWEEN :a AND :b",
            "ExpressionAttributeNames": {"#p": "pk", "#s": "sk"},
            "ExpressionAttributeValues": {":p": {"S": "b#7"}, ":a": {"N": "1"}, ":b": {"N": "2"}},
        },
        WHERE,
    )

    assert batch == Request(
        "dynamodb:BatchGetItem", TABLE_ARN, {"dynamodb:LeadingKeys": ("cancel#2",)}
    )
    assert query == Request("dynamodb:Query", TABLE_ARN, {"dynamodb:LeadingKeys": ("b#7",)})


def test_a_transaction_is_each_of_its_item_actions() -> None:
    requests = requests_for(
        "dynamodb",
        "TransactWriteItems",
        {
            "TransactItems": [
                {"Put": {"TableName": "t-Messages", "Item": {"pk": {"S": "a"}}}},
                {"ConditionCheck": {"TableName": "t-Messages", "Key": {"pk": {"S": "b"}}}},
            ]
        },
        WHERE,
    )

    assert [r.action for r in requests] == ["dynamodb:PutItem", "dynamodb:ConditionCheckItem"]


def test_s3_listing_carries_its_prefix_and_stream_reads_their_stream() -> None:
    [listing] = requests_for("s3", "ListObjectsV2", {"Bucket": "b", "Prefix": "payloads/x"}, WHERE)
    stream = f"{TABLE_ARN}/stream/2026-11-25T00:00:00.000"
    [records] = requests_for(
        "dynamodb-streams", "GetRecords", {"ShardIterator": f"{stream}|1|AAAA"}, WHERE
    )

    assert listing == Request("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ("payloads/x",)})
    assert records == Request("dynamodb:GetRecords", stream)


@pytest.mark.parametrize(
    ("service", "operation", "params"),
    [
        ("sns", "Publish", {}),
        ("dynamodb", "Query", {"TableName": "t-Messages", "KeyConditionExpression": "x > :a"}),
        ("dynamodb", "GetItem", {"TableName": "other", "Key": {"pk": {"S": "a"}}}),
        ("dynamodb-streams", "GetRecords", {"ShardIterator": "opaque"}),
    ],
)
def test_a_call_that_cannot_be_mapped_is_an_error(
    service: str, operation: str, params: dict[str, Any]
) -> None:
    with pytest.raises(PolicyError):
        requests_for(service, operation, params, WHERE)


def test_arn_operators_match_each_part_apart() -> None:
    like = Condition.parse("ArnLike", "aws:SourceArn", ["arn:aws:lambda:*:123:function:f-*"])
    equals = Condition.parse("ArnEquals", "aws:SourceArn", ["arn:aws:lambda:*:123:function:*"])
    lambda_arn = "arn:aws:lambda:us-east-1:123:function:f-1"

    assert like.holds({"aws:SourceArn": (lambda_arn,)})
    assert equals.holds({"aws:SourceArn": (lambda_arn,)})  # ArnEquals takes wildcards too
    # A wildcard does not reach across the colon-separated parts.
    assert not like.holds({"aws:SourceArn": ("arn:aws:lambda:us-east-1:999:123:function:f-1",)})
    assert not like.holds({"aws:SourceArn": ("not-an-arn",)})


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:*"},
        {"Effect": "Allow", "Action": "s3:*", "NotAction": "s3:Get*", "Resource": "*"},
    ],
)
def test_a_statement_needs_one_action_and_one_resource_element(statement: dict[str, Any]) -> None:
    with pytest.raises(PolicyError, match="exactly one of"):
        policy(statement)


def test_a_condition_without_a_value_is_rejected() -> None:
    with pytest.raises(PolicyError, match="has no value"):
        Condition.parse("Null", "s3:prefix", [])


def test_secrets_manager_calls_are_mapped_under_botocores_service_name() -> None:
    [request] = requests_for(
        "secrets-manager",
        "GetSecretValue",
        {"SecretId": "arn:aws:secretsmanager:r:1:secret:k"},
        WHERE,
    )

    assert request == Request(
        "secretsmanager:GetSecretValue", "arn:aws:secretsmanager:r:1:secret:k"
    )
