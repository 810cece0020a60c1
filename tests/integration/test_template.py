"""The CloudFormation YAML loader and the intrinsic resolver."""

from __future__ import annotations

from typing import Any

import pytest

from delayq_local import TemplateError, loads_template
from delayq_local.intrinsics import Resolver
from delayq_local.template import Template

pytestmark = pytest.mark.integration

TEXT = """
AWSTemplateFormatVersion: 2010-09-09
Parameters:
  Env: {Type: String, Default: dev, AllowedValues: [dev, prod]}
  Brokers: {Type: CommaDelimitedList, Default: "a:9092,b:9092"}
Conditions:
  IsProd: !Equals [!Ref Env, prod]
  IsDev: !Not [!Condition IsProd]
Mappings:
  Sizes: {dev: {Shards: 4}, prod: {Shards: 16}}
Resources:
  Queue: {Type: AWS::SQS::Queue}
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      Ref: !Ref Queue
      Arn: !GetAtt Queue.Arn
      ArnLong: !GetAtt [Queue, Arn]
      Sub: !Sub "${AWS::StackName}-${Env}-${Queue.QueueName}-${!Literal}"
      SubVars: !Sub ["${X}/${Y}", {X: !Ref Env, Y: fixed}]
      Join: !Join [",", !Ref Brokers]
      Select: !Select [1, !Ref Brokers]
      Split: !Split [":", "h:1"]
      If: !If [IsProd, big, small]
      Gone: !If [IsDev, !Ref "AWS::NoValue", kept]
      List: [one, !Ref "AWS::NoValue", two]
      Map: !FindInMap [Sizes, !Ref Env, Shards]
      And: !And [!Condition IsDev, !Equals [a, a]]
      Or: !Or [!Condition IsProd, !Equals [a, b]]
"""


class FakeResources:
    def ref(self, logical_id: str) -> Any:
        return f"url-of-{logical_id}"

    def get_att(self, logical_id: str, attribute: str) -> Any:
        return f"{attribute}-of-{logical_id}"


def resolver(template: Template, **overrides: str) -> Resolver:
    return Resolver(
        template=template,
        parameters=template.parameter_values(overrides),
        pseudo={"AWS::StackName": "stk", "AWS::Region": "us-east-1"},
        resources=FakeResources(),
    )


def test_short_tags_load_as_long_forms_and_dates_stay_strings() -> None:
    template = loads_template(TEXT)

    properties = template.resources["Fn"]["Properties"]
    assert template.body["AWSTemplateFormatVersion"] == "2010-09-09"
    assert properties["Ref"] == {"Ref": "Queue"}
    assert properties["Arn"] == {"Fn::GetAtt": ["Queue", "Arn"]}
    assert properties["ArnLong"] == {"Fn::GetAtt": ["Queue", "Arn"]}
    assert properties["Gone"] == {"Fn::If": ["IsDev", {"Ref": "AWS::NoValue"}, "kept"]}


def test_intrinsics_resolve_against_parameters_pseudo_and_resources() -> None:
    resolved = resolver(loads_template(TEXT)).resolve(
        loads_template(TEXT).resources["Fn"]["Properties"]
    )

    assert resolved == {
        "Ref": "url-of-Queue",
        "Arn": "Arn-of-Queue",
        "ArnLong": "Arn-of-Queue",
        "Sub": "stk-dev-QueueName-of-Queue-${Literal}",
        "SubVars": "dev/fixed",
        "Join": "a:9092,b:9092",
        "Select": "b:9092",
        "Split": ["h", "1"],
        "If": "small",
        "List": ["one", "two"],
        "Map": 4,
        "And": True,
        "Or": False,
    }


def test_parameter_overrides_win_and_change_conditions() -> None:
    template = loads_template(TEXT)

    resolved = resolver(template, Env="prod").resolve(template.resources["Fn"]["Properties"])

    assert resolved["If"] == "big"
    assert resolved["Gone"] == "kept"
    assert resolved["Map"] == 16


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"Env": "qa"}, "not one of"), ({"Nope": "x"}, "unknown template parameters")],
)
def test_bad_parameter_values_are_rejected(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        loads_template(TEXT).parameter_values(overrides)


def test_a_parameter_without_default_needs_a_value() -> None:
    template = loads_template("Parameters: {P: {Type: String}}\nResources: {}\n")

    with pytest.raises(TemplateError, match="no Default"):
        template.parameter_values()
    assert template.parameter_values({"P": "given"}) == {"P": "given"}


@pytest.mark.parametrize(
    "value",
    [
        {"Fn::ImportValue": "x"},
        {"Ref": "Missing"},
        {"Fn::GetAtt": ["Missing", "Arn"]},
        {"Fn::If": ["NoSuchCondition", 1, 2]},
    ],
)
def test_unsupported_or_unknown_references_raise(value: dict[str, Any]) -> None:
    with pytest.raises(TemplateError):
        resolver(loads_template(TEXT)).resolve(value)


def test_text_without_resources_is_not_a_template() -> None:
    with pytest.raises(TemplateError, match="no Resources"):
        loads_template("just: text\n")
