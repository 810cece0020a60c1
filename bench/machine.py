"""The machine a figure was measured on: Python, CPU model, cores, load."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """Everything a reader needs to compare a figure with their own run."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average": load,
    }


def one_line(info: dict[str, Any]) -> str:
    """``Python 3.11.7 on AMD EPYC (2 CPUs, load 1.2)``."""
    load = info.get("load_average") or ["?"]
    return (
        f"{info['implementation']} {info['python']} on {info['cpu_model']} "
        f"({info['cpus']} CPUs, {info['machine']}, load {load[0]})"
    )
