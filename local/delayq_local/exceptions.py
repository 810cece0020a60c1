"""The local runner's exception hierarchy."""

from __future__ import annotations


class LocalStackError(Exception):
    """Base class of every error the local runner raises."""


class TemplateError(LocalStackError):
    """The template cannot be read, or uses a construct the local runner does not support."""


class ProvisionError(LocalStackError):
    """A resource could not be created on the AWS endpoint."""


class KafkaMockError(LocalStackError):
    """librdkafka's mock cluster could not be loaded, created or driven."""


class HandlerLoadError(LocalStackError):
    """A function's handler module could not be imported from its file."""


class InitError(LocalStackError):
    """`delayq init` cannot write the environment: a missing or invalid answer, an unreadable
    cluster or config file."""
