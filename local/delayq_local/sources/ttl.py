"""TTL expiry for endpoints that never expire items (moto).

Every `period_seconds` the emulator scans the table for items whose TTL attribute (epoch seconds)
is in the past, deletes each one (conditionally, so an item rewritten meanwhile survives), and
hands the stream source a `REMOVE` record as DynamoDB writes it for a TTL deletion: with
`userIdentity` `{type: Service, principalId: dynamodb.amazonaws.com}` and the old image. The
endpoint's own `REMOVE` record for that delete carries no `userIdentity`, so a filter for TTL
removals drops it, and the injected one is what the function sees.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from botocore.exceptions import ClientError

from delayq.constants import TTL_PRINCIPAL
from delayq_local.sources.base import EventSource
from delayq_local.sources.streams import StreamEventSource, event_value

log = logging.getLogger(__name__)

_VIEWS_WITH_OLD_IMAGE: Final = ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")


class TtlEmulator(EventSource):
    """Expires one table's items on a period, and reports the removals to its stream source."""

    def __init__(
        self,
        dynamodb: Any,
        table_name: str,
        ttl_attribute: str,
        key_names: Sequence[str],
        *,
        period_seconds: float = 5.0,
        max_per_sweep: int = 500,
        streams: Sequence[StreamEventSource] = (),
        stream_view_type: str = "NEW_AND_OLD_IMAGES",
        region: str,
    ) -> None:
        super().__init__(f"ttl:{table_name}", None)
        self.table_name = table_name
        self.ttl_attribute = ttl_attribute
        self._dynamodb = dynamodb
        self._keys = tuple(key_names)
        self._period = period_seconds
        self._max_per_sweep = max_per_sweep
        self._streams = tuple(streams)
        self._view = stream_view_type
        self._region = region

    def _work(self, index: int) -> None:
        while self._active():
            self.sweep()
            self._sleep(self._period)

    def sweep(self) -> int:
        """Delete expired items now (at most `max_per_sweep`, as DynamoDB too deletes them
        gradually); return how many were deleted."""
        now = int(time.time())
        removed: list[dict[str, Any]] = []
        for item in self._expired(now):
            if len(removed) >= self._max_per_sweep or self._stop.is_set():
                break
            old = self._delete(item, now)
            if old is not None:
                removed.append(self._remove_record(old))
        self.stats.add("sweeps")
        self.stats.add("expired", len(removed))
        for stream in self._streams:
            stream.inject(removed)
        return len(removed)

    def _expired(self, now: int) -> Iterator[Mapping[str, Any]]:
        paginator = self._dynamodb.get_paginator("scan")
        pages = paginator.paginate(
            TableName=self.table_name,
            # Only numbers are TTL values; the type test first also spares moto a str < number.
            FilterExpression="attribute_type(#ttl, :number) AND #ttl < :now",
            ProjectionExpression=", ".join(f"#k{i}" for i in range(len(self._keys))),
            ExpressionAttributeNames={
                "#ttl": self.ttl_attribute,
                **{f"#k{i}": k for i, k in enumerate(self._keys)},
            },
            ExpressionAttributeValues={":now": {"N": str(now)}, ":number": {"S": "N"}},
        )
        for page in pages:
            yield from page.get("Items", [])

    def _delete(self, key: Mapping[str, Any], now: int) -> Mapping[str, Any] | None:
        try:
            response = self._dynamodb.delete_item(
                TableName=self.table_name,
                Key=dict(key),
                ConditionExpression="attribute_type(#ttl, :number) AND #ttl < :now",
                ExpressionAttributeNames={"#ttl": self.ttl_attribute},
                ExpressionAttributeValues={":now": {"N": str(now)}, ":number": {"S": "N"}},
                ReturnValues="ALL_OLD",
            )
        except ClientError as e:
            if e.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            raise
        attributes: Mapping[str, Any] | None = response.get("Attributes")
        return attributes

    def _remove_record(self, old: Mapping[str, Any]) -> dict[str, Any]:
        image = {k: event_value(v) for k, v in old.items()}
        dynamodb: dict[str, Any] = {
            "ApproximateCreationDateTime": int(time.time()),
            "Keys": {k: image[k] for k in self._keys},
            "SizeBytes": len(repr(image)),
            "StreamViewType": self._view,
        }
        if self._view in _VIEWS_WITH_OLD_IMAGE:
            dynamodb["OldImage"] = image
        return {
            "eventID": uuid.uuid4().hex,
            "eventName": "REMOVE",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": self._region,
            "dynamodb": dynamodb,
            "userIdentity": {"type": "Service", "principalId": TTL_PRINCIPAL},
        }
