"""`delayq init`: the question flow (flags, prompts), the MSK read (botocore Stubber with the
documented response shapes: moto has no GetBootstrapBrokers), the template checks and the
samconfig.toml update."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from delayq_local.cli import main
from delayq_local.deploy_init import (
    Environment,
    InitFlags,
    KafkaClient,
    gather,
    read_msk_cluster,
    security_choices,
    tty_asker,
    update_samconfig,
    write_environment,
)
from delayq_local.exceptions import InitError
from delayq_local.template import Template, load_template, loads_template
from tests.factories import (
    MSK_ARN,
    MSK_BROKERS,
    MSK_GROUPS,
    MSK_IAM_BROKERS,
    MSK_SCRAM_BROKERS,
    MSK_SUBNETS,
    SCRAM_KEY,
    SCRAM_SECRET,
    StubbedKafka,
    msk_provisioned,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template(ROOT / "template.yaml")


def no_kafka(region: str) -> KafkaClient:
    raise AssertionError(f"a self-managed cluster needs no kafka client ({region})")


class ScriptedAsker:
    """Answers questions in order from a script; keeps each question, default and choices."""

    def __init__(self, answers: Sequence[str]) -> None:
        self.answers: Iterator[str] = iter(answers)
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []

    def __call__(self, question: str, default: str, choices: Sequence[str]) -> str:
        self.asked.append((question, default, tuple(choices)))
        return next(self.answers)


# --- the question flow ---------------------------------------------------------------------


def test_flags_and_the_cluster_make_an_msk_iam_environment(template: Template) -> None:
    kafka = StubbedKafka(msk_provisioned(), MSK_BROKERS)
    flags = InitFlags(config_env="prod", msk_cluster_arn=MSK_ARN, allowed_targets="orders.*")
    environment = gather(flags, template, None, kafka)
    assert kafka.regions == ["eu-west-1"]
    kafka.stubber.assert_no_pending_responses()
    assert environment == Environment(
        name="prod",
        stack_name="kafka-delay-queue",
        region="eu-west-1",
        overrides=(
            ("KafkaSource", "MSK"),
            ("MskClusterArn", MSK_ARN),
            ("KafkaSecurity", "MSK_IAM"),
            ("KafkaBootstrapServers", MSK_IAM_BROKERS),
            ("DelayTopic", "delay-requests"),
            ("AllowedTargets", "orders.*"),
            ("SubnetIds", ",".join(MSK_SUBNETS)),
            ("SecurityGroupIds", ",".join(MSK_GROUPS)),
        ),
    )


def test_scram_on_msk_takes_the_scram_brokers_and_needs_the_secret_and_key(
    template: Template,
) -> None:
    flags = InitFlags(
        config_env="prod",
        msk_cluster_arn=MSK_ARN,
        security="SASL_SCRAM_SHA_512",
        secret_arn=SCRAM_SECRET,
        allowed_targets="orders.*",
        subnet_ids=MSK_SUBNETS[0],
    )
    with pytest.raises(InitError, match="--kms-key-arn is needed"):
        gather(flags, template, None, StubbedKafka(msk_provisioned(), MSK_BROKERS))
    keyed = InitFlags(**{**flags.__dict__, "kms_key_arn": SCRAM_KEY})
    overrides = dict(
        gather(keyed, template, None, StubbedKafka(msk_provisioned(), MSK_BROKERS)).overrides
    )
    assert overrides["KafkaBootstrapServers"] == MSK_SCRAM_BROKERS
    assert overrides["KafkaSecretArn"] == SCRAM_SECRET
    assert overrides["KafkaSecretKmsKeyArn"] == SCRAM_KEY
    # A flag wins over the cluster's value.
    assert overrides["SubnetIds"] == MSK_SUBNETS[0]


def test_an_authentication_the_cluster_has_off_is_refused(template: Template) -> None:
    flags = InitFlags(
        config_env="prod",
        msk_cluster_arn=MSK_ARN,
        security="SASL_SCRAM_SHA_512",
        allowed_targets="a",
    )
    with pytest.raises(InitError, match=r"--security: 'SASL_SCRAM_SHA_512' is not one of MSK_IAM$"):
        gather(flags, template, None, StubbedKafka(msk_provisioned(scram=False), MSK_BROKERS))


def test_self_managed_scram_needs_no_vpc_but_tls_does(template: Template) -> None:
    flags = InitFlags(
        config_env="onprem",
        bootstrap_servers="broker-1.example.internal:9096",
        security="SASL_SCRAM_SHA_256",
        secret_arn=SCRAM_SECRET,
        allowed_targets="orders.*,reminders",
    )
    environment = gather(flags, template, None, no_kafka)
    assert environment.region is None
    assert dict(environment.overrides) == {
        "KafkaSource": "SelfManagedKafka",
        "KafkaSecurity": "SASL_SCRAM_SHA_256",
        "KafkaBootstrapServers": "broker-1.example.internal:9096",
        "KafkaSecretArn": SCRAM_SECRET,
        "DelayTopic": "delay-requests",
        "AllowedTargets": "orders.*,reminders",
    }
    tls = InitFlags(**{**flags.__dict__, "security": "SSL", "secret_arn": None})
    with pytest.raises(InitError, match="--subnet-ids is needed"):
        gather(tls, template, None, no_kafka)


def test_a_missing_answer_without_a_terminal_names_its_flag(template: Template) -> None:
    flags = InitFlags(config_env="prod", bootstrap_servers="b:9092", security="PLAINTEXT")
    with pytest.raises(InitError, match="--allowed-targets is needed"):
        gather(flags, template, None, no_kafka)


def test_prompts_ask_only_what_the_flags_leave_out_and_offer_the_cluster(
    template: Template, capsys: pytest.CaptureFixture[str]
) -> None:
    asker = ScriptedAsker(
        ["prod", "SASL_SCRAM_SHA_512", "", SCRAM_SECRET, SCRAM_KEY, "", "*", "orders.*", "", ""]
    )
    environment = gather(
        InitFlags(msk_cluster_arn=MSK_ARN),
        template,
        asker,
        StubbedKafka(msk_provisioned(), MSK_BROKERS),
    )
    questions = [question.split(" (")[0] for question, _, _ in asker.asked]
    assert questions == [
        "Environment name",
        "Authentication",
        "Bootstrap servers",
        "SASL/SCRAM secret ARN",
        "KMS key ARN of the secret",
        "Delay topic",
        "Allowed target topics",
        "Allowed target topics",
        "Subnets for the functions",
        "Security groups for the functions",
    ]
    # The cluster's settings are the defaults Enter takes; its auth modes are the choices.
    assert asker.asked[1][1:] == ("MSK_IAM", ("MSK_IAM", "SASL_SCRAM_SHA_512"))
    assert asker.asked[2][1] == MSK_SCRAM_BROKERS
    assert asker.asked[8][1] == ",".join(MSK_SUBNETS)
    # The refused '*' is explained and asked again.
    assert "AllowedTargets: '*' does not match" in capsys.readouterr().out
    overrides = dict(environment.overrides)
    assert overrides["AllowedTargets"] == "orders.*"
    assert overrides["KafkaBootstrapServers"] == MSK_SCRAM_BROKERS
    assert overrides["SecurityGroupIds"] == ",".join(MSK_GROUPS)


def test_prompts_choose_the_source_and_leave_optional_values_out(template: Template) -> None:
    # Answers: name, source, auth, brokers, secret, no KMS key, topic, targets, no VPC.
    answers = ["dev", "SelfManagedKafka", "SASL_SCRAM_SHA_512", "k:9096", SCRAM_SECRET, ""]
    asker = ScriptedAsker([*answers, "requests", "t", "", ""])
    environment = gather(InitFlags(), template, asker, no_kafka)
    assert asker.asked[1] == ("Kafka source", "MSK", ("MSK", "SelfManagedKafka"))
    assert dict(environment.overrides) == {
        "KafkaSource": "SelfManagedKafka",
        "KafkaSecurity": "SASL_SCRAM_SHA_512",
        "KafkaBootstrapServers": "k:9096",
        "KafkaSecretArn": SCRAM_SECRET,
        "DelayTopic": "requests",
        "AllowedTargets": "t",
    }


# --- the MSK read --------------------------------------------------------------------------


def test_a_serverless_cluster_gives_its_vpc_configs_and_iam() -> None:
    description = {
        "ClusterInfo": {
            "ClusterArn": MSK_ARN,
            "ClusterName": "orders",
            "ClusterType": "SERVERLESS",
            "Serverless": {
                "VpcConfigs": [
                    {"SubnetIds": MSK_SUBNETS[:1], "SecurityGroupIds": MSK_GROUPS},
                    {"SubnetIds": MSK_SUBNETS[1:], "SecurityGroupIds": MSK_GROUPS},
                ],
                "ClientAuthentication": {"Sasl": {"Iam": {"Enabled": True}}},
            },
        }
    }
    kafka = StubbedKafka(description, {"BootstrapBrokerStringSaslIam": MSK_IAM_BROKERS})
    cluster = read_msk_cluster(kafka("eu-west-1"), MSK_ARN)
    assert cluster.subnets == tuple(MSK_SUBNETS)
    assert cluster.security_groups == tuple(MSK_GROUPS)
    assert cluster.securities == ("MSK_IAM",)
    assert cluster.bootstrap == {"MSK_IAM": MSK_IAM_BROKERS}


def test_a_cluster_the_api_does_not_know_is_an_init_error() -> None:
    client = boto3.client("kafka", region_name="eu-west-1")
    with Stubber(client) as stubber:
        stubber.add_client_error(
            "describe_cluster_v2", "NotFoundException", "cluster not found", 404
        )
        with pytest.raises(
            InitError, match=f"cannot read MSK cluster {MSK_ARN}.*NotFoundException"
        ):
            read_msk_cluster(client, MSK_ARN)


def test_a_cluster_without_iam_or_scram_is_refused(template: Template) -> None:
    kafka = StubbedKafka(
        msk_provisioned(iam=False, scram=False), {"BootstrapBrokerStringTls": "b:9094"}
    )
    flags = InitFlags(config_env="prod", msk_cluster_arn=MSK_ARN, allowed_targets="a")
    with pytest.raises(InitError, match="neither IAM nor SASL/SCRAM"):
        gather(flags, template, None, kafka)


# --- the template checks -------------------------------------------------------------------


def test_authentication_choices_are_the_templates_allowed_values(template: Template) -> None:
    allowed = template.parameters["KafkaSecurity"]["AllowedValues"]
    assert security_choices(template, "MSK") == ("MSK_IAM", "SASL_SCRAM_SHA_512")
    assert security_choices(template, "SelfManagedKafka") == tuple(allowed[1:])
    assert allowed[0] == "MSK_IAM"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"allowed_targets": "__consumer_offsets"}, "AllowedTargets: '__consumer_offsets'"),
        ({"delay_topic": "delay requests"}, "DelayTopic: 'delay requests' does not match"),
        ({"subnet_ids": "subnet-0123456789abcdef0,vpc-1"}, "SubnetIds: 'vpc-1' does not match"),
        ({"security_group_ids": "sg-1"}, r"SecurityGroupIds: 'sg-1' does not match security"),
        ({"bootstrap_servers": "broker"}, "KafkaBootstrapServers: 'broker' does not match host"),
        ({"secret_arn": "my-secret"}, "KafkaSecretArn: 'my-secret' does not match the pattern"),
        ({"source": "Confluent"}, "--source: 'Confluent' is not one of MSK, SelfManagedKafka"),
        ({"config_env": "my env"}, "--config-env: 'my env' is not letters"),
        ({"stack_name": "1stack"}, "--stack-name: '1stack' is not a CloudFormation stack name"),
    ],
)
def test_a_wrong_value_names_the_parameter_and_what_is_allowed(
    template: Template, flags: dict[str, str], message: str
) -> None:
    good = {
        "config_env": "onprem",
        "bootstrap_servers": "broker-1:9096",
        "security": "SASL_SCRAM_SHA_512",
        "secret_arn": SCRAM_SECRET,
        "allowed_targets": "orders.*",
        "subnet_ids": MSK_SUBNETS[0],
        "security_group_ids": MSK_GROUPS[0],
    }
    assert gather(InitFlags(**good), template, None, no_kafka).name == "onprem"
    with pytest.raises(InitError, match=message):
        gather(InitFlags(**{**good, **flags}), template, None, no_kafka)


def test_numbers_lists_and_lengths_are_checked_by_their_type() -> None:
    from delayq_local.deploy_init import check_parameter

    template = loads_template(
        "Parameters:\n"
        "  Subnets: {Type: 'List<AWS::EC2::Subnet::Id>'}\n"
        "  Delay: {Type: Number, MinValue: 1, MaxValue: 840}\n"
        "  Days: {Type: Number, AllowedValues: [1, 3]}\n"
        "  Name: {Type: String, MinLength: 2, MaxLength: 3}\n"
        "Resources: {}\n"
    )
    check_parameter(template, "Subnets", "subnet-0a,subnet-0b")
    check_parameter(template, "Delay", "840")
    check_parameter(template, "Days", "3")
    check_parameter(template, "Name", "abc")
    for name, value, message in [
        ("Subnets", "subnet-0a,sg-0b", r"Subnets: 'sg-0b' does not match the pattern \^subnet-"),
        ("Delay", "841", "Delay: 841 is above the maximum 840"),
        ("Delay", "0", "Delay: 0 is below the minimum 1"),
        ("Delay", "soon", "Delay: 'soon' is not a number"),
        ("Days", "2", "Days: '2' is not one of 1, 3"),
        ("Name", "a", "Name: at least 2 characters"),
        ("Name", "abcd", "Name: at most 3 characters"),
        ("Region", "x", "Region is not a parameter of the template"),
    ]:
        with pytest.raises(InitError, match=message):
            check_parameter(template, name, value)


# --- samconfig.toml ------------------------------------------------------------------------

ONPREM = Environment(
    name="onprem",
    stack_name="delayq-onprem",
    region=None,
    overrides=(("KafkaSource", "SelfManagedKafka"), ("AllowedTargets", "orders.*")),
)


def test_a_new_environment_is_appended_and_the_file_kept_byte_for_byte() -> None:
    before = (ROOT / "samconfig.toml").read_text()
    after = update_samconfig(before, ONPREM)
    assert after.startswith(before)
    assert after[len(before) :] == (
        "\n[onprem.deploy.parameters]\n"
        'stack_name = "delayq-onprem"\n'
        'capabilities = "CAPABILITY_IAM"\n'
        "confirm_changeset = true\n"
        "fail_on_empty_changeset = false\n"
        "resolve_s3 = true\n"
        "parameter_overrides = [\n"
        '    "KafkaSource=SelfManagedKafka",\n'
        '    "AllowedTargets=orders.*",\n'
        "]\n"
    )


def test_an_existing_environment_is_replaced_in_place_keeping_the_next_ones_comments() -> None:
    before = (ROOT / "samconfig.toml").read_text()
    msk_iam = Environment("msk-iam", "kafka-delay-queue", "eu-west-1", (("AllowedTargets", "o"),))
    after = update_samconfig(before, msk_iam)
    old, new = tomllib.loads(before), tomllib.loads(after)
    assert {k: v for k, v in new.items() if k != "msk-iam"} == {
        k: v for k, v in old.items() if k != "msk-iam"
    }
    assert new["msk-iam"]["deploy"]["parameters"]["region"] == "eu-west-1"
    assert new["msk-iam"]["deploy"]["parameters"]["parameter_overrides"] == ["AllowedTargets=o"]
    # Every comment but the replaced table's own is still there, in its place.
    kept = [line for line in before.splitlines() if line.startswith("#")]
    assert [line for line in after.splitlines() if line.startswith("#")] == kept
    assert (
        after.index("[msk-iam.")
        < after.index("# --- Amazon MSK, SASL/SCRAM")
        < after.index("[msk-scram.")
    )
    # Writing it again changes nothing.
    assert update_samconfig(after, msk_iam) == after


def test_write_environment_creates_a_file_sam_can_read(tmp_path: Path) -> None:
    path = tmp_path / "samconfig.toml"
    write_environment(path, ONPREM)
    loaded = tomllib.loads(path.read_text())
    assert loaded["version"] == 0.1
    assert loaded["onprem"]["deploy"]["parameters"]["stack_name"] == "delayq-onprem"


def test_a_config_file_that_does_not_parse_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "samconfig.toml"
    path.write_text("[broken\n")
    with pytest.raises(InitError, match="cannot read"):
        write_environment(path, ONPREM)
    assert path.read_text() == "[broken\n"


# --- the command ---------------------------------------------------------------------------


def test_the_command_writes_the_environment_and_prints_how_to_deploy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "samconfig.toml"
    status = main(
        [
            "init",
            f"--template-file={ROOT / 'template.yaml'}",
            f"--config-file={config}",
            "--config-env=onprem",
            "--bootstrap-servers=broker-1.example.internal:9092",
            "--security=PLAINTEXT",
            "--allowed-targets=orders.*",
            "--subnet-ids=subnet-0123456789abcdef0",
            "--security-group-ids=sg-0123456789abcdef0",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert f"sam deploy --config-file {config} --config-env onprem" in out
    overrides = tomllib.loads(config.read_text())["onprem"]["deploy"]["parameters"]
    assert "SubnetIds=subnet-0123456789abcdef0" in overrides["parameter_overrides"]


def test_the_command_exits_2_with_the_reason_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "samconfig.toml"
    status = main(
        [
            "init",
            f"--template-file={ROOT / 'template.yaml'}",
            f"--config-file={config}",
            "--config-env=onprem",
            "--bootstrap-servers=broker-1:9092",
            "--security=MSK_IAM",
        ]
    )
    assert status == 2
    assert (
        "delayq: --security: 'MSK_IAM' is not one of SASL_SCRAM_SHA_512" in capsys.readouterr().err
    )
    assert not config.exists()


def test_the_terminal_asker_shows_choices_and_default_and_stops_at_end_of_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts: list[str] = []

    def typed(prompt: str) -> str:
        prompts.append(prompt)
        return "SSL"

    monkeypatch.setattr("builtins.input", typed)
    assert tty_asker("Authentication", "PLAINTEXT", ("SSL", "PLAINTEXT")) == "SSL"
    assert tty_asker("Delay topic", "", ()) == "SSL"
    assert prompts == ["Authentication (SSL/PLAINTEXT) [PLAINTEXT]: ", "Delay topic: "]

    def ended(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", ended)
    with pytest.raises(InitError, match="input ended"):
        tty_asker("Delay topic", "", ())
