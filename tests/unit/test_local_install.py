"""`make demo` installs requirements/local.lock only: the local stack's dependencies, pinned as in
requirements/dev.lock, without Spark or the test and lint tools; the demo's code path must not
import them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from delayq_local import LocalStackError
from delayq_local import reports as local_reports

ROOT = Path(__file__).resolve().parents[2]
NOT_FOR_THE_DEMO = {"pyspark", "py4j", "pytest", "hypothesis", "ruff", "mypy", "cfn-lint"}


def pins(name: str) -> dict[str, str]:
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    found = {}
    for line in lines:
        if line and not line.startswith("#"):
            package, _, version = line.partition("==")
            found[package.lower().replace("_", "-")] = version
    return found


def test_the_local_lock_is_the_dev_lock_restricted_to_the_local_stack() -> None:
    local, dev = pins("local.lock"), pins("dev.lock")

    assert {p: v for p, v in local.items() if dev.get(p) != v} == {}
    assert NOT_FOR_THE_DEMO & set(local) == set()
    assert set(dev) >= NOT_FOR_THE_DEMO


def test_the_demo_command_imports_no_spark_and_no_tool() -> None:
    script = (
        "import json, sys, delayq_local.cli, delayq_local.demo; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(  # noqa: S603 (this interpreter, a fixed script)
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )

    imported = set(json.loads(done.stdout))
    assert imported & {"pyspark", "py4j", "pytest", "cfnlint", "mypy"} == set()


def test_the_reports_say_how_to_install_spark_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)  # as reports calls it

    with pytest.raises(LocalStackError, match="make venv"):
        local_reports.require_spark()
