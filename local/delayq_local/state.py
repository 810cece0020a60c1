"""Where a running `delayq local` says what it is: one state file in a fixed place, so that
`delayq send`, `tail` and `redrive` find the stack from any folder.

The file is `$DELAYQ_STATE_FILE` when set, else `$XDG_STATE_HOME/delayq/local-stack.json`,
else `~/.local/state/delayq/local-stack.json`. It exists while the stack runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from delayq import constants as c
from delayq_local.exceptions import LocalStackError

ENV_STATE_FILE: Final = "DELAYQ_STATE_FILE"
# What the AWS CLI and SDKs need to talk to the local endpoint (moto accepts any key).
FAKE_CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def state_file(environ: Mapping[str, str] | None = None) -> Path:
    """The state file's path (see the module's docstring)."""
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_STATE_FILE, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_STATE_HOME", "").strip()
    root = (
        Path(base).expanduser()
        if base
        else Path(env.get("HOME", "~")).expanduser() / (".local/state")
    )
    return root / "delayq" / "local-stack.json"


def read_state(path: Path | None = None) -> Mapping[str, Any]:
    """What the running `delayq local` wrote ({} when none runs)."""
    path = path or state_file()
    if not path.is_file():
        return {}
    try:
        state: Mapping[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LocalStackError(f"{path} is not a readable state file: {e}") from e
    return state


def write_state(state: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the state file (its folder is created)."""
    path = path or state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2) + "\n")
    return path


def allowed_targets(state: Mapping[str, Any]) -> tuple[str, ...]:
    """The running stack's allow-list (patterns), () when unknown."""
    raw = str((state.get("environment") or {}).get(c.ENV_ALLOWED_TARGETS, ""))
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def export_line(state: Mapping[str, Any]) -> str:
    """A shell line that points the AWS CLI, boto3 and `delayq` at the local stack."""
    variables = {
        "AWS_ENDPOINT_URL": state["aws_endpoint"],
        **FAKE_CREDENTIALS,
        "AWS_DEFAULT_REGION": state["region"],
        c.ENV_KAFKA_BOOTSTRAP: state["kafka_bootstrap"],
    }
    return "export " + " ".join(f"{k}={v}" for k, v in variables.items())
