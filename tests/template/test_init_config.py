"""A samconfig.toml environment written by `delayq init` is one SAM reads and the template takes:
`sam validate --lint` (the SAM CLI `make template-check` installs into .tools/sam) passes with it,
SAM's own config reader hands `sam deploy --config-env` exactly what init wrote, and the values
satisfy the template's Rules and select the conditions of the matching example environment.

`make test` runs this tier after `template-check`, which installs the SAM CLI; without it the
test fails (run `make tools`), it is not skipped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from delayq_local.deploy_init import Environment, InitFlags, gather, write_environment
from delayq_local.template import load_template
from tests.factories import MSK_ARN as ARN
from tests.factories import (
    MSK_BROKERS,
    MSK_SUBNETS,
    SCRAM_KEY,
    SCRAM_SECRET,
    StubbedKafka,
    msk_provisioned,
)
from tests.template.conftest import ROOT, TEMPLATE
from tests.template.test_parameters import ENVIRONMENTS, Evaluator, failed_rules, values_of

SAM_VENV = ROOT / ".tools" / "sam" / "bin"
# As mk/template.mk runs the SAM CLI: no telemetry, a region for its own configuration only.
SAM_ENV = {"SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}
# The answers for each kind of cluster, named after the example environment it matches.
KINDS = {
    "msk-iam": InitFlags(config_env="orders-iam", msk_cluster_arn=ARN, allowed_targets="o.*"),
    "msk-scram": InitFlags(
        config_env="orders-scram",
        msk_cluster_arn=ARN,
        security="SASL_SCRAM_SHA_512",
        secret_arn=SCRAM_SECRET,
        kms_key_arn=SCRAM_KEY,
        allowed_targets="orders.*,reminders",
    ),
    "self-managed": InitFlags(
        config_env="onprem",
        bootstrap_servers="broker-1.example.internal:9096,broker-2.example.internal:9096",
        security="SASL_SCRAM_SHA_512",
        secret_arn=SCRAM_SECRET,
        allowed_targets="orders.*",
        subnet_ids=",".join(MSK_SUBNETS),
        security_group_ids="sg-0123456789abcdef0",
    ),
}


def sam_tool(name: str) -> Path:
    """A program of the SAM CLI venv; fails (never skips) when `make tools` has not run."""
    path = SAM_VENV / name
    assert path.is_file(), f"{path} is missing: run `make tools` (make test installs it)"
    return path


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 (our own tool paths and arguments)
        command,
        cwd=cwd,
        env={**os.environ, **SAM_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def written(kind: str, config: Path) -> Environment:
    """What `delayq init` writes to ``config`` for ``kind`` (the MSK cluster stubbed)."""
    kafka = StubbedKafka(msk_provisioned(), MSK_BROKERS)
    environment = gather(KINDS[kind], load_template(TEMPLATE), None, kafka)
    write_environment(config, environment)
    return environment


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Environment]]:
    """samconfig.toml, copied, with one environment of each kind added by init."""
    path = tmp_path_factory.mktemp("init") / "samconfig.toml"
    path.write_text((ROOT / "samconfig.toml").read_text())
    return path, {kind: written(kind, path) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_sam_validate_lint_passes_with_the_written_environment(
    config: tuple[Path, dict[str, Environment]], kind: str
) -> None:
    path, environments = config
    sam = sam_tool("sam")
    name = environments[kind].name
    chosen = ["--config-file", str(path), "--config-env", name]
    result = run(
        [str(sam), "validate", "--lint", "--template-file", str(TEMPLATE), *chosen],
        cwd=path.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is a valid SAM Template" in result.stdout + result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_sam_deploy_reads_what_init_wrote(
    config: tuple[Path, dict[str, Environment]], kind: str
) -> None:
    path, environments = config
    environment = environments[kind]
    reader = (
        "import json, sys\n"
        "from samcli.lib.config.samconfig import SamConfig\n"
        "config = SamConfig(sys.argv[1], sys.argv[2])\n"
        "print(json.dumps(config.get_all(['deploy'], 'parameters', env=sys.argv[3])))\n"
    )
    result = run(
        [str(sam_tool("python")), "-c", reader, str(path.parent), path.name, environment.name],
        cwd=path.parent,
    )
    assert result.returncode == 0, result.stderr
    deploy: dict[str, Any] = json.loads(result.stdout)
    assert deploy["parameter_overrides"] == [f"{k}={v}" for k, v in environment.overrides]
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert deploy["stack_name"] == environment.stack_name
    assert deploy.get("region") == environment.region


@pytest.mark.parametrize("kind", KINDS)
def test_the_written_values_pass_the_rules_and_select_the_examples_conditions(
    template: dict[str, Any], config: tuple[Path, dict[str, Environment]], kind: str
) -> None:
    values = values_of(template, dict(config[1][kind].overrides))
    assert failed_rules(template, values) == []
    evaluator = Evaluator(template, values)
    assert {c for c in ENVIRONMENTS[kind] if evaluator.condition(c)} == ENVIRONMENTS[kind]
