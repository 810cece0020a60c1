"""The reports package's exception hierarchy."""

from __future__ import annotations


class ReportError(Exception):
    """Base class of every error this package raises."""


class OptionsError(ReportError):
    """A job argument is missing or invalid."""


class ExportLayoutError(ReportError):
    """The path does not hold a readable DynamoDB export (or holds one this package cannot read)."""
