"""Helpers shared by the local-stack tests."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from delayq_local.sources import EventSource

FIXTURES = Path(__file__).parent / "fixtures"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
S = TypeVar("S", bound=EventSource)


class Runner:
    """Starts sources for a test; the `running` fixture stops them all afterwards."""

    def __init__(self) -> None:
        self.started: list[EventSource] = []

    def __call__(self, source: S) -> S:
        self.started.append(source)
        return source.start()
