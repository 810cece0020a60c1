"""Times as operators read them (the CLI's output)."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["iso_ms"]


def iso_ms(epoch_ms: int) -> str:
    """Epoch milliseconds as ISO 8601 in UTC, to the millisecond (what operators read)."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")
