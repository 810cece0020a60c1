"""The layer's adapters as the handlers build them (``delayq.runtime``), over a given client:
for in-memory clients, recording proxies and the simulator's faulty clients."""

from __future__ import annotations

from concurrent.futures import Executor

from delayq.retry import Backoff
from delayq.settings import Settings
from delayq.store import MessageStore
from testkit.aws import as_dynamodb_client


def message_store(
    client: object, settings: Settings, backoff: Backoff, executor: Executor | None = None
) -> MessageStore:
    """The message table adapter with the settings' table, shards and periods."""
    return MessageStore(
        as_dynamodb_client(client),
        settings.table_name,
        shards=settings.shards,
        ttl_grace_seconds=settings.ttl_grace_seconds,
        max_delay_seconds=settings.max_delay_seconds,
        backoff=backoff,
        executor=executor,
        index_all=bool(settings.id_index),
    )
