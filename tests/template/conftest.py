"""The template, parsed once: CloudFormation short tags (!Ref, !GetAtt, ...) become their long
forms through cfn-lint's YAML decoder, which also keeps each node's line for the checks that
look at comments next to a value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
# The five functions, by logical id, and their handler directory under functions/.
FUNCTIONS = {
    "IngestFunction": "ingest",
    "TimerFunction": "timer",
    "SchedulerFunction": "scheduler",
    "EmitterFunction": "emitter",
    "CleanupFunction": "cleanup",
}


@pytest.fixture(scope="session")
def template() -> dict[str, Any]:
    loaded: dict[str, Any] = cfn_yaml.load(str(TEMPLATE))
    return loaded


@pytest.fixture(scope="session")
def resources(template: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = template["Resources"]
    return found


@pytest.fixture(scope="session")
def template_lines() -> list[str]:
    return TEMPLATE.read_text().splitlines()
