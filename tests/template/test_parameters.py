"""The template's parameters as an operator meets them: described, grouped, used only where they
matter, and preset per kind of cluster by the example environments of samconfig.toml.

Conditions and rules are evaluated here as CloudFormation evaluates them (Ref, Condition,
Fn::Equals/Not/And/Or, Fn::Join/Split/Select), on parameter values given as strings.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import pytest

from tests.template.conftest import ROOT

SAMCONFIG = ROOT / "samconfig.toml"
PLACEHOLDER = re.compile(r"^<FILL-IN:(?P<example>[^<>]+)>$")
# The example environments, and the conditions each must select.
ENVIRONMENTS = {
    "msk-iam": {"IsMsk", "UsesMskIam", "HasVpc"},
    "msk-scram": {"IsMsk", "UsesScram", "MskScram", "UsesSecretKmsKey", "HasVpc"},
    "self-managed": {"IsSelfManaged", "UsesScram", "SelfManagedScram512", "SelfManagedInVpc"},
}
# Parameters that matter only under a condition, and it: every use must be under it.
CONDITIONAL = {
    "TableReadCapacity": "IsProvisioned",
    "TableWriteCapacity": "IsProvisioned",
    "TableWarmWriteUnitsPerSecond": "HasWarmWrites",
    "AlarmEmail": "HasAlarmEmail",
    "EmitterMinimumPollers": "EmitterProvisioned",
    "EmitterMaximumPollers": "EmitterProvisioned",
    "EmitterMaxConcurrency": "!EmitterProvisioned",
    "EmitterHighMaxConcurrency": "!EmitterProvisioned",
    "EmitterLowMaxConcurrency": "!EmitterProvisioned",
    "IngestMinimumPollers": "IngestProvisioned",
    "IngestMaximumPollers": "IngestProvisioned",
    "MskClusterArn": "IsMsk",
    "KafkaSecretArn": "UsesScram",
    "KafkaSecretKmsKeyArn": "UsesSecretKmsKey",
    "SubnetIds": "HasVpc",
    "SecurityGroupIds": "HasVpc",
}


# --- evaluation ---------------------------------------------------------------------------


def parameter_value(spec: Mapping[str, Any], raw: str) -> str | list[str]:
    return raw.split(",") if spec["Type"] == "CommaDelimitedList" else raw


def values_of(template: dict[str, Any], given: Mapping[str, str]) -> dict[str, str | list[str]]:
    """Every parameter's value: given, else its default (a parameter without either is absent)."""
    values: dict[str, str | list[str]] = {}
    for name, spec in template["Parameters"].items():
        if name in given:
            values[name] = parameter_value(spec, given[name])
        elif "Default" in spec:
            values[name] = parameter_value(spec, str(spec["Default"]))
    return values


class Evaluator:
    def __init__(self, template: dict[str, Any], values: Mapping[str, Any]) -> None:
        self.conditions = template["Conditions"]
        self.values = values
        self.known: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name.startswith("!"):
            return not self.condition(name[1:])
        if name not in self.known:
            self.known[name] = bool(self.eval(self.conditions[name]))
        return self.known[name]

    def eval(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.eval(item) for item in node]
        if not isinstance(node, dict):
            return node
        [(function, argument)] = node.items()
        assert function in self.FUNCTIONS, f"not evaluated here: {function}"
        return self.FUNCTIONS[function](self, argument)

    def _join(self, argument: list[Any]) -> str:
        separator, items = argument
        return str(separator).join(str(item) for item in self.eval(items))

    def _split(self, argument: list[Any]) -> list[str]:
        separator, text = argument
        return str(self.eval(text)).split(separator)

    def _select(self, argument: list[Any]) -> Any:
        index, items = argument
        return self.eval(items)[int(index)]

    def _equals(self, argument: list[Any]) -> bool:
        left, right = self.eval(argument)
        return str(left) == str(right)

    FUNCTIONS: ClassVar[dict[str, Callable[[Evaluator, Any], Any]]] = {
        "Ref": lambda self, name: self.values[name],
        "Condition": lambda self, name: self.condition(name),
        "Fn::Equals": _equals,
        "Fn::Not": lambda self, argument: not self.eval(argument[0]),
        "Fn::And": lambda self, argument: all(self.eval(argument)),
        "Fn::Or": lambda self, argument: any(self.eval(argument)),
        "Fn::Join": _join,
        "Fn::Split": _split,
        "Fn::Select": _select,
    }


def failed_rules(template: dict[str, Any], values: Mapping[str, Any]) -> list[str]:
    evaluator = Evaluator(template, values)
    failed = []
    for name, rule in template["Rules"].items():
        if "RuleCondition" in rule and not evaluator.eval(rule["RuleCondition"]):
            continue
        failed += [
            f"{name}: {a['AssertDescription']}"
            for a in rule["Assertions"]
            if not evaluator.eval(a["Assert"])
        ]
    return failed


def uses(template: dict[str, Any], parameter: str) -> list[tuple[str, tuple[str, ...]]]:
    """Where a parameter is referenced (Ref or ${} in Fn::Sub), with the conditions in force
    there: the resource's or output's Condition, and each Fn::If branch ("!C": else-branch)."""
    found: list[tuple[str, tuple[str, ...]]] = []

    def walk(node: Any, context: tuple[str, ...], where: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, context, where)
        elif isinstance(node, dict):
            if set(node) == {"Fn::If"}:
                condition, then, otherwise = node["Fn::If"]
                walk(then, (*context, condition), where)
                walk(otherwise, (*context, f"!{condition}"), where)
                return
            if node.get("Ref") == parameter or (
                "Fn::Sub" in node and f"${{{parameter}}}" in str(node["Fn::Sub"])
            ):
                found.append((where, context))
            for value in node.values():
                walk(value, context, where)

    for section in ("Resources", "Outputs"):
        for name, item in template.get(section, {}).items():
            walk(item, (item["Condition"],) if "Condition" in item else (), name)
    walk(template["Globals"], (), "Globals")
    return found


def condition_inputs(template: dict[str, Any]) -> list[str]:
    return sorted(set(re.findall(r"'Ref': '(\w+)'", str(template["Conditions"]))))


def assignments(template: dict[str, Any]) -> Iterator[dict[str, str]]:
    """Every combination of values that can change a condition: each allowed value, or the
    default and another value (lists: empty, one, two and three entries)."""
    choices = []
    for name in condition_inputs(template):
        spec = template["Parameters"][name]
        if "AllowedValues" in spec:
            options = [str(v) for v in spec["AllowedValues"]]
        elif spec["Type"] == "CommaDelimitedList":
            options = ["", "a", "a,b", "a,b,c"]
        else:
            options = [str(spec["Default"]), "2" if spec["Type"] == "Number" else "x"]
        choices.append([(name, option) for option in options])
    for combination in itertools.product(*choices):
        yield dict(combination)


# --- every parameter ----------------------------------------------------------------------


def test_every_parameter_is_described_and_in_one_console_group(template: dict[str, Any]) -> None:
    groups = template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
    grouped = [name for group in groups for name in group["Parameters"]]
    assert len(grouped) == len(set(grouped)), "a parameter is in two groups"
    assert set(grouped) == set(template["Parameters"])
    for name, spec in template["Parameters"].items():
        assert len(str(spec.get("Description", ""))) >= 20, name


def test_the_condition_evaluation_follows_the_template(template: dict[str, Any]) -> None:
    # The evaluator itself, on conditions whose meaning is plain.
    def conditions(**given: str) -> Evaluator:
        return Evaluator(template, values_of(template, given))

    assert conditions(TableBillingMode="PROVISIONED").condition("IsProvisioned")
    assert not conditions().condition("IsProvisioned")
    assert conditions(SubnetIds="subnet-1,subnet-2").condition("HasSubnet2")
    assert not conditions(SubnetIds="subnet-1").condition("HasSubnet2")
    assert not conditions(SubnetIds="subnet-1").condition("!HasVpc")
    assert conditions(KafkaSource="SelfManagedKafka", SubnetIds="s").condition("SelfManagedInVpc")
    assert failed_rules(template, values_of(template, {})) == [
        "MskNeedsCluster: KafkaSource MSK needs MskClusterArn."
    ]


@pytest.fixture(scope="module")
def every_assignment(template: dict[str, Any]) -> list[Evaluator]:
    """An evaluator per assignment (each remembers the conditions it has evaluated)."""
    return [Evaluator(template, values_of(template, given)) for given in assignments(template)]


@pytest.mark.parametrize(("parameter", "condition"), CONDITIONAL.items())
def test_a_parameter_is_used_only_where_its_condition_holds(
    template: dict[str, Any], every_assignment: list[Evaluator], parameter: str, condition: str
) -> None:
    found = uses(template, parameter)
    assert found, f"{parameter} is not used"
    contexts = {context for _, context in found}
    assert len(every_assignment) > 1000
    for evaluator in every_assignment:
        for context in contexts:
            if all(evaluator.condition(c) for c in context):
                assert evaluator.condition(condition), (parameter, context, evaluator.values)


def test_the_billing_mode_skips_the_capacities_it_does_not_use(template: dict[str, Any]) -> None:
    # The case that prompted the check: on-demand billing reads no capacity at all.
    table = template["Resources"]["MessageTable"]["Properties"]
    assert table["ProvisionedThroughput"]["Fn::If"][0] == "IsProvisioned"
    assert table["ProvisionedThroughput"]["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    assert CONDITIONAL["TableReadCapacity"] == CONDITIONAL["TableWriteCapacity"] == "IsProvisioned"


# --- samconfig.toml -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def samconfig() -> dict[str, Any]:
    with SAMCONFIG.open("rb") as file:
        return tomllib.load(file)


def overrides(samconfig: dict[str, Any], environment: str) -> dict[str, str]:
    """parameter_overrides as SAM reads a list of "Name=value" strings."""
    entries = samconfig[environment]["deploy"]["parameters"]["parameter_overrides"]
    assert isinstance(entries, list)
    pairs = [entry.split("=", 1) for entry in entries]
    assert all(len(pair) == 2 for pair in pairs), entries
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"{environment} sets a parameter twice"
    return dict(pairs)


def filled(given: Mapping[str, str]) -> dict[str, str]:
    """The environment with each placeholder replaced by its example, as a user would."""
    return {
        name: (m.group("example") if (m := PLACEHOLDER.match(value)) else value)
        for name, value in given.items()
    }


def accepted(spec: Mapping[str, Any], raw: str) -> bool:
    """Whether CloudFormation takes the value (a list's pattern applies to each entry)."""
    entries = parameter_value(spec, raw)
    items = entries if isinstance(entries, list) else [entries]
    if "AllowedValues" in spec and raw not in [str(v) for v in spec["AllowedValues"]]:
        return False
    pattern = spec.get("AllowedPattern")
    return pattern is None or all(re.fullmatch(pattern, item) for item in items)


def test_the_example_environments_exist_with_the_default_deploy_settings(
    samconfig: dict[str, Any],
) -> None:
    default = samconfig["default"]["deploy"]["parameters"]
    for environment in ENVIRONMENTS:
        deploy = samconfig[environment]["deploy"]["parameters"]
        # SAM reads the chosen environment only: nothing falls back to [default].
        for setting in ("capabilities", "confirm_changeset", "resolve_s3"):
            assert deploy[setting] == default[setting], (environment, setting)
        assert deploy["stack_name"] == samconfig["default"]["global"]["parameters"]["stack_name"]


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_an_environment_sets_only_template_parameters_and_every_required_one(
    template: dict[str, Any], samconfig: dict[str, Any], environment: str
) -> None:
    given = overrides(samconfig, environment)
    parameters = template["Parameters"]
    assert set(given) <= set(parameters)
    required = {name for name, spec in parameters.items() if "Default" not in spec}
    assert required <= set(given)
    # With the placeholders filled, the rules (MSK needs a cluster, SCRAM a secret...) hold
    # and the environment selects its kind of cluster.
    values = values_of(template, filled(given))
    assert failed_rules(template, values) == []
    evaluator = Evaluator(template, values)
    assert {c for c in ENVIRONMENTS[environment] if evaluator.condition(c)} == ENVIRONMENTS[
        environment
    ]


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_placeholders_are_marked_refused_as_they_stand_and_show_a_valid_example(
    template: dict[str, Any], samconfig: dict[str, Any], environment: str
) -> None:
    given = overrides(samconfig, environment)
    placeholders = {name for name, value in given.items() if PLACEHOLDER.match(value)}
    # What cannot be defaulted is left to the user: the cluster, the brokers, the allow-list,
    # secrets and the network.
    assert {"AllowedTargets", "KafkaBootstrapServers", "SubnetIds", "SecurityGroupIds"} <= (
        placeholders
    )
    for name, value in given.items():
        spec = template["Parameters"][name]
        if name in placeholders:
            assert not accepted(spec, value), f"{environment}: {name} placeholder would deploy"
            assert accepted(spec, filled({name: value})[name]), f"{environment}: {name} example"
        else:
            assert accepted(spec, value), f"{environment}: {name}={value}"
