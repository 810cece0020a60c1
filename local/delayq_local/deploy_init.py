"""`delayq init`: the few answers a cluster needs, checked against the template's parameters and
written as one samconfig.toml environment that `sam deploy --config-env NAME` deploys as is.

Every question is also a flag. A missing answer is asked only when an `Asker` is given (the
command gives one when stdin is a TTY); otherwise it is an error naming the flag. Given an MSK
cluster ARN, the cluster's subnets, security groups, authentication modes and bootstrap brokers
are read with the `kafka` API and proposed as the defaults.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from delayq_local.exceptions import InitError
from delayq_local.template import Template, load_template

DEFAULT_STACK_NAME: Final = "kafka-delay-queue"
MSK: Final = "MSK"
SELF_MANAGED: Final = "SelfManagedKafka"
SCRAM_512: Final = "SASL_SCRAM_SHA_512"
# What the template's Rules let each source use: MSK_IAM needs MSK (MskIamNeedsMsk), MSK has no
# SCRAM-SHA-256 (MskNeedsCluster), and on MSK this stack supports IAM and SCRAM only.
MSK_SECURITY: Final = ("MSK_IAM", SCRAM_512)
MSK_ONLY_SECURITY: Final = ("MSK_IAM",)
SCRAM: Final = ("SASL_SCRAM_SHA_512", "SASL_SCRAM_SHA_256")
# get_bootstrap_brokers' field for each KafkaSecurity an MSK cluster can use here.
BOOTSTRAP_FIELDS: Final = {
    "MSK_IAM": ("BootstrapBrokerStringSaslIam", "BootstrapBrokerStringPublicSaslIam"),
    SCRAM_512: ("BootstrapBrokerStringSaslScram", "BootstrapBrokerStringPublicSaslScram"),
}
# The element pattern of CloudFormation's AWS-specific list types.
AWS_LIST_ITEMS: Final = {
    "List<AWS::EC2::Subnet::Id>": r"^subnet-[0-9a-f]+$",
    "List<AWS::EC2::SecurityGroup::Id>": r"^sg-[0-9a-f]+$",
}
ENVIRONMENT_NAME: Final = re.compile(r"^[A-Za-z0-9_-]+$")
STACK_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
MSK_ARN_REGION: Final = re.compile(r"^arn:aws[a-z-]*:kafka:(?P<region>[a-z0-9-]+):")
# A config file init creates starts as SAM's own do.
NEW_CONFIG: Final = "version = 0.1\n"
TABLE_HEADER: Final = re.compile(r"^\[(?P<environment>[A-Za-z0-9_-]+)\.[^\]]*\]\s*(#.*)?$")


class Asker(Protocol):
    """Asks one question; returns the answer as typed ("" for none)."""

    def __call__(self, question: str, default: str, choices: Sequence[str]) -> str: ...


class KafkaClient(Protocol):
    """The two `kafka` API calls init makes (a boto3 `kafka` client)."""

    def describe_cluster_v2(self, *, ClusterArn: str) -> Mapping[str, Any]: ...  # noqa: N803

    def get_bootstrap_brokers(self, *, ClusterArn: str) -> Mapping[str, Any]: ...  # noqa: N803


@dataclass(frozen=True)
class InitFlags:
    """The answers given on the command line; None: not given."""

    config_env: str | None = None
    stack_name: str = DEFAULT_STACK_NAME
    source: str | None = None
    msk_cluster_arn: str | None = None
    bootstrap_servers: str | None = None
    security: str | None = None
    secret_arn: str | None = None
    kms_key_arn: str | None = None
    delay_topic: str | None = None
    allowed_targets: str | None = None
    subnet_ids: str | None = None
    security_group_ids: str | None = None


@dataclass(frozen=True)
class MskCluster:
    """What an MSK cluster tells init: its client network, the auth modes it has on, and the
    bootstrap string per KafkaSecurity."""

    subnets: tuple[str, ...]
    security_groups: tuple[str, ...]
    securities: tuple[str, ...]
    bootstrap: Mapping[str, str]


@dataclass(frozen=True)
class Environment:
    """One samconfig environment: its name, stack name, region (None: the CLI's) and the
    parameter overrides in the order they are written."""

    name: str
    stack_name: str
    region: str | None
    overrides: tuple[tuple[str, str], ...]


def read_msk_cluster(kafka: KafkaClient, arn: str) -> MskCluster:
    """Read a provisioned or serverless cluster's settings; API errors become `InitError`."""
    try:
        info = kafka.describe_cluster_v2(ClusterArn=arn)["ClusterInfo"]
        brokers = kafka.get_bootstrap_brokers(ClusterArn=arn)
    except (ClientError, BotoCoreError) as e:
        raise InitError(f"cannot read MSK cluster {arn}: {e}") from e
    if info.get("ClusterType") == "SERVERLESS":
        serverless = info.get("Serverless", {})
        vpcs = serverless.get("VpcConfigs", [])
        subnets = [s for vpc in vpcs for s in vpc.get("SubnetIds", [])]
        groups = [g for vpc in vpcs for g in vpc.get("SecurityGroupIds", [])]
        authentication = serverless.get("ClientAuthentication", {})
    else:
        provisioned = info.get("Provisioned", {})
        nodes = provisioned.get("BrokerNodeGroupInfo", {})
        subnets = nodes.get("ClientSubnets", [])
        groups = nodes.get("SecurityGroups", [])
        authentication = provisioned.get("ClientAuthentication", {})
    sasl = authentication.get("Sasl", {})
    enabled = {
        "MSK_IAM": sasl.get("Iam", {}).get("Enabled", False),
        SCRAM_512: sasl.get("Scram", {}).get("Enabled", False),
    }
    bootstrap = {
        security: next((brokers[f] for f in fields if brokers.get(f)), "")
        for security, fields in BOOTSTRAP_FIELDS.items()
    }
    return MskCluster(
        subnets=tuple(dict.fromkeys(subnets)),
        security_groups=tuple(dict.fromkeys(groups)),
        securities=tuple(s for s in MSK_SECURITY if enabled[s]),
        bootstrap={s: b for s, b in bootstrap.items() if b},
    )


def check_parameter(template: Template, name: str, value: str) -> None:
    """Raise `InitError` naming the parameter and what it allows unless CloudFormation would
    take ``value`` for it (Type, AllowedValues, AllowedPattern, lengths, MinValue/MaxValue)."""
    spec = template.parameters.get(name)
    if spec is None:
        raise InitError(f"{name} is not a parameter of the template")
    kind = str(spec.get("Type", "String"))
    allowed = spec.get("AllowedValues")
    if allowed is not None and value not in [str(v) for v in allowed]:
        raise InitError(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")
    if kind == "Number":
        _check_number(name, spec, value)
    items = (
        value.split(",") if kind == "CommaDelimitedList" or kind.startswith("List<") else [value]
    )
    pattern = spec.get("AllowedPattern", AWS_LIST_ITEMS.get(kind))
    wanted = spec.get("ConstraintDescription", f"the pattern {pattern}")
    for item in items:
        if pattern is not None and re.fullmatch(str(pattern), item.strip()) is None:
            raise InitError(f"{name}: {item.strip()!r} does not match {wanted}")
    if "MinLength" in spec and len(value) < int(spec["MinLength"]):
        raise InitError(f"{name}: at least {spec['MinLength']} characters")
    if "MaxLength" in spec and len(value) > int(spec["MaxLength"]):
        raise InitError(f"{name}: at most {spec['MaxLength']} characters")


def _check_number(name: str, spec: Mapping[str, Any], value: str) -> None:
    try:
        number = float(value)
    except ValueError as e:
        raise InitError(f"{name}: {value!r} is not a number") from e
    if "MinValue" in spec and number < float(spec["MinValue"]):
        raise InitError(f"{name}: {value} is below the minimum {spec['MinValue']}")
    if "MaxValue" in spec and number > float(spec["MaxValue"]):
        raise InitError(f"{name}: {value} is above the maximum {spec['MaxValue']}")


def security_choices(template: Template, source: str) -> tuple[str, ...]:
    """The template's KafkaSecurity AllowedValues that ``source`` may use (see MSK_SECURITY)."""
    allowed = [str(v) for v in template.parameters["KafkaSecurity"]["AllowedValues"]]
    if source == MSK:
        return tuple(v for v in allowed if v in MSK_SECURITY)
    return tuple(v for v in allowed if v not in MSK_ONLY_SECURITY)


class _Questions:
    """Answers from the flags, else from the asker, else the proposed default, else an error;
    each answer for a template parameter is checked before it is taken."""

    def __init__(self, template: Template, asker: Asker | None) -> None:
        self.template = template
        self.asker = asker

    def answer(
        self,
        given: str | None,
        flag: str,
        question: str,
        *,
        default: str = "",
        choices: Sequence[str] = (),
        parameter: str | None = None,
        required: bool = True,
    ) -> str:
        if given is not None:
            return self._checked(given.strip(), flag, parameter, choices)
        if self.asker is None:
            if default or not required:
                return self._checked(default, flag, parameter, choices)
            raise InitError(f"{flag} is needed ({question}); no terminal to ask on")
        while True:
            typed = self.asker(question, default, choices).strip() or default
            if not typed and required:
                print(f"  {question}: an answer is needed")
                continue
            try:
                return self._checked(typed, flag, parameter, choices)
            except InitError as e:
                print(f"  {e}")

    def _checked(self, value: str, flag: str, parameter: str | None, choices: Sequence[str]) -> str:
        if choices and value not in choices:
            raise InitError(f"{flag}: {value!r} is not one of {', '.join(choices)}")
        if parameter is not None and value:
            check_parameter(self.template, parameter, value)
        return value


def gather(
    flags: InitFlags,
    template: Template,
    asker: Asker | None,
    kafka: Callable[[str], KafkaClient],
) -> Environment:
    """Ask what is missing from ``flags`` and build the environment; ``kafka(region)`` gives the
    client that reads an MSK cluster. Raises `InitError` for a missing or invalid answer."""
    q = _Questions(template, asker)
    name = q.answer(flags.config_env, "--config-env", "Environment name (samconfig.toml)")
    if not ENVIRONMENT_NAME.match(name):
        raise InitError(f"--config-env: {name!r} is not letters, digits, '-' and '_'")
    if not STACK_NAME.match(flags.stack_name):
        raise InitError(f"--stack-name: {flags.stack_name!r} is not a CloudFormation stack name")
    inferred = MSK if flags.msk_cluster_arn else (SELF_MANAGED if flags.bootstrap_servers else "")
    sources = tuple(str(v) for v in template.parameters["KafkaSource"]["AllowedValues"])
    source = q.answer(
        flags.source or (inferred or None),
        "--source",
        "Kafka source",
        default=MSK,
        choices=sources,
        parameter="KafkaSource",
    )
    overrides: dict[str, str] = {"KafkaSource": source}
    region: str | None = None
    cluster = MskCluster((), (), security_choices(template, source), {})
    if source == MSK:
        arn = q.answer(
            flags.msk_cluster_arn, "--msk-cluster-arn", "MSK cluster ARN", parameter="MskClusterArn"
        )
        match = MSK_ARN_REGION.match(arn)
        region = match.group("region") if match else None
        cluster = read_msk_cluster(kafka(region or ""), arn)
        if not cluster.securities:
            raise InitError(f"{arn} has neither IAM nor SASL/SCRAM authentication turned on")
        overrides["MskClusterArn"] = arn
    security = q.answer(
        flags.security,
        "--security",
        "Authentication",
        default=cluster.securities[0] if source == MSK else "",
        choices=cluster.securities,
        parameter="KafkaSecurity",
    )
    overrides["KafkaSecurity"] = security
    overrides["KafkaBootstrapServers"] = q.answer(
        flags.bootstrap_servers,
        "--bootstrap-servers",
        "Bootstrap servers (host:port,...)",
        default=cluster.bootstrap.get(security, ""),
        parameter="KafkaBootstrapServers",
    )
    if security in SCRAM:
        overrides["KafkaSecretArn"] = q.answer(
            flags.secret_arn,
            "--secret-arn",
            "SASL/SCRAM secret ARN (Secrets Manager)",
            parameter="KafkaSecretArn",
        )
        overrides["KafkaSecretKmsKeyArn"] = q.answer(
            flags.kms_key_arn,
            "--kms-key-arn",
            "KMS key ARN of the secret" + (" (empty: none)" if source != MSK else ""),
            parameter="KafkaSecretKmsKeyArn",
            required=source == MSK,
        )
    default_topic = str(template.parameters["DelayTopic"].get("Default", ""))
    overrides["DelayTopic"] = q.answer(
        flags.delay_topic,
        "--delay-topic",
        "Delay topic",
        default=default_topic,
        parameter="DelayTopic",
    )
    overrides["AllowedTargets"] = q.answer(
        flags.allowed_targets,
        "--allowed-targets",
        "Allowed target topics (comma-separated, fnmatch patterns)",
        parameter="AllowedTargets",
    )
    # The functions produce to MSK brokers from the VPC; a self-managed event source without
    # SASL has no access configuration but its VPC (KafkaSecurity: SSL and PLAINTEXT need subnets).
    in_vpc = source == MSK or security not in SCRAM
    overrides["SubnetIds"] = q.answer(
        flags.subnet_ids,
        "--subnet-ids",
        "Subnets for the functions" + ("" if in_vpc else " (empty: no VPC)"),
        default=",".join(cluster.subnets),
        parameter="SubnetIds",
        required=in_vpc,
    )
    overrides["SecurityGroupIds"] = q.answer(
        flags.security_group_ids,
        "--security-group-ids",
        "Security groups for the functions" + ("" if in_vpc else " (empty: none)"),
        default=",".join(cluster.security_groups),
        parameter="SecurityGroupIds",
        required=in_vpc,
    )
    return Environment(
        name=name,
        stack_name=flags.stack_name,
        region=region,
        overrides=tuple((k, v) for k, v in overrides.items() if v),
    )


def render(environment: Environment) -> str:
    """The environment's `[NAME.deploy.parameters]` table, in the style of the examples."""
    lines = [
        f"[{environment.name}.deploy.parameters]",
        f"stack_name = {json.dumps(environment.stack_name)}",
    ]
    if environment.region is not None:
        # The Kafka event source must be in the MSK cluster's region.
        lines.append(f"region = {json.dumps(environment.region)}")
    lines += [
        'capabilities = "CAPABILITY_IAM"',
        "confirm_changeset = true",
        "fail_on_empty_changeset = false",
        "resolve_s3 = true",
        "parameter_overrides = [",
        *(f"    {json.dumps(f'{k}={v}')}," for k, v in environment.overrides),
        "]",
    ]
    return "\n".join(lines) + "\n"


def update_samconfig(text: str, environment: Environment) -> str:
    """``text`` with the environment's tables replaced by its new one (or it appended); other
    environments and every comment outside its tables stay byte for byte."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    headers = [i for i, line in enumerate(lines) if TABLE_HEADER.match(line)]
    kept: list[str] = []
    insert_at: int | None = None
    starts = [*headers, len(lines)]
    cursor = 0
    for start, end in itertools.pairwise(starts):
        match = TABLE_HEADER.match(lines[start])
        if match is None or match.group("environment") != environment.name:
            continue
        # Comments and blank lines closing the span introduce the next table (or end the file).
        stop = end
        while stop > start + 1 and _is_trivia(lines[stop - 1]):
            stop -= 1
        kept += lines[cursor:start]
        insert_at = len(kept) if insert_at is None else insert_at
        cursor = stop
    kept += lines[cursor:]
    block = render(environment)
    if insert_at is None:
        return "".join(kept) + ("\n" if kept and kept[-1].strip() else "") + block
    return "".join(kept[:insert_at]) + block + "".join(kept[insert_at:])


def _is_trivia(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def write_environment(path: Path, environment: Environment) -> None:
    """Write (or update) the environment in ``path``, after checking that SAM will read back
    exactly it and every other environment unchanged."""
    try:
        before = path.read_text(encoding="utf-8") if path.exists() else NEW_CONFIG
        old = tomllib.loads(before)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InitError(f"cannot read {path}: {e}") from e
    after = update_samconfig(before, environment)
    new = tomllib.loads(after)
    written = new[environment.name]["deploy"]["parameters"]["parameter_overrides"]
    others_kept = {k: v for k, v in old.items() if k != environment.name} == {
        k: v for k, v in new.items() if k != environment.name
    }
    if written != [f"{k}={v}" for k, v in environment.overrides] or not others_kept:
        raise InitError(f"{path}: the update would not read back as written; nothing changed")
    try:
        path.write_text(after, encoding="utf-8")
    except OSError as e:
        raise InitError(f"cannot write {path}: {e}") from e


def summary(environment: Environment, path: Path) -> list[str]:
    """What init tells the operator: the environment written and the commands that deploy it."""
    return [
        f"wrote [{environment.name}.deploy.parameters] to {path}",
        f"  stack_name = {environment.stack_name}"
        + (f", region = {environment.region}" if environment.region else ""),
        *(f"  {k}={v}" for k, v in environment.overrides),
        "every other parameter keeps the template's default; deploy with",
        f"  sam build && sam deploy --config-file {path} --config-env {environment.name}",
    ]


def tty_asker(question: str, default: str, choices: Sequence[str]) -> str:
    """Ask on the terminal, showing the choices and the default taken by Enter."""
    options = f" ({'/'.join(choices)})" if choices else ""
    shown = f" [{default}]" if default else ""
    try:
        return input(f"{question}{options}{shown}: ")
    except EOFError as e:
        raise InitError("input ended before every question was answered") from e


def boto3_kafka(region: str) -> KafkaClient:
    """A boto3 `kafka` client in ``region`` ("" for boto3's default)."""
    import boto3  # noqa: PLC0415 (only `init` with an MSK cluster needs it)

    client: KafkaClient = boto3.client("kafka", region_name=region or None)
    return client


def register(commands: Any) -> None:
    """Add `init` to the `delayq` parser."""
    init = commands.add_parser(
        "init",
        help="write a samconfig.toml environment for your cluster in a few questions",
        description="Asks only what a cluster needs (each question is also a flag; asked only "
        "when missing and stdin is a terminal), checks every value against the template's "
        "parameters and writes [ENV.deploy.parameters] for `sam deploy --config-env ENV`. "
        "Other environments and comments in the file are kept. With --msk-cluster-arn the "
        "cluster's subnets, security groups, authentication and brokers are read (kafka "
        "DescribeClusterV2, GetBootstrapBrokers) and proposed as defaults. Exit 2: a missing or "
        "invalid answer.",
    )
    init.add_argument("--config-env", help="the environment's name in the config file")
    init.add_argument("--config-file", type=Path, default=Path("samconfig.toml"))
    init.add_argument("--template-file", type=Path, default=Path("template.yaml"))
    init.add_argument("--stack-name", default=DEFAULT_STACK_NAME)
    init.add_argument("--source", help=f"KafkaSource: {MSK} or {SELF_MANAGED}")
    init.add_argument("--msk-cluster-arn", help="the MSK cluster (implies --source MSK)")
    init.add_argument("--bootstrap-servers", help="host:port,... (MSK: read from the cluster)")
    init.add_argument("--security", help="KafkaSecurity (MSK: one the cluster has turned on)")
    init.add_argument("--secret-arn", help="the SASL/SCRAM secret in Secrets Manager")
    init.add_argument("--kms-key-arn", help="the secret's customer managed KMS key")
    init.add_argument("--delay-topic", help="the topic producers write delay requests to")
    init.add_argument("--allowed-targets", help="target topics, comma-separated, fnmatch ok")
    init.add_argument("--subnet-ids", help="subnet-...,... (MSK: read from the cluster)")
    init.add_argument("--security-group-ids", help="sg-...,... (MSK: read from the cluster)")
    init.set_defaults(command=_init)


def flags_of(args: Any) -> InitFlags:
    """The `init` command line as `InitFlags`."""
    return InitFlags(
        config_env=args.config_env,
        stack_name=args.stack_name,
        source=args.source,
        msk_cluster_arn=args.msk_cluster_arn,
        bootstrap_servers=args.bootstrap_servers,
        security=args.security,
        secret_arn=args.secret_arn,
        kms_key_arn=args.kms_key_arn,
        delay_topic=args.delay_topic,
        allowed_targets=args.allowed_targets,
        subnet_ids=args.subnet_ids,
        security_group_ids=args.security_group_ids,
    )


def run_init(
    args: Any,
    *,
    asker: Asker | None,
    kafka: Callable[[str], KafkaClient] = boto3_kafka,
) -> Environment:
    """Gather the answers for the parsed `init` command line, write the environment and print
    the summary; returns what it wrote."""
    template = load_template(args.template_file)
    environment = gather(flags_of(args), template, asker, kafka)
    write_environment(args.config_file, environment)
    print("\n".join(summary(environment, args.config_file)))
    return environment


def _init(args: Any) -> int:
    run_init(args, asker=tty_asker if sys.stdin.isatty() else None)
    return 0
