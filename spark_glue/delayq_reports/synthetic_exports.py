"""Synthetic DynamoDB exports for tests: item builders (the `msg`, `cancel` and `watermark`
layouts of docs/internals.md) and a writer of the export layout, manifests included.

Statistics items come from `delayq.stats.DeliveryStats` itself, so the tests read what the
emitter writes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

Item = Mapping[str, Mapping[str, Any]]
DEFAULT_EXPORT_ID = "01700000000000-a1b2c3d4"
TTL_GRACE_SECONDS = 86_400


def message_item(
    delay_id: str,
    *,
    due_ms: int,
    target: str,
    shard: int = 0,
    size: int = 100,
    tenant: str | None = None,
) -> dict[str, dict[str, str]]:
    """A stored pending message (`kind` msg) with a `size`-byte value."""
    due_second = due_ms // 1000
    src = f"delay-requests-0-{delay_id}"
    # The store's sort key: the id, then a tag of the record (delayq.store.sort_key).
    tag = base64.urlsafe_b64encode(hashlib.blake2b(src.encode(), digest_size=6).digest())
    item = {
        "pk": {"S": f"{due_second}#{shard}"},
        "sk": {"S": f"{delay_id}#{tag.decode('ascii')}"},
        "kind": {"S": "msg"},
        "due_ms": {"N": str(due_ms)},
        "target": {"S": target},
        "value": {"B": base64.b64encode(b"v" * size).decode("ascii")},
        "src": {"S": src},
        "size": {"N": str(size)},
        "expires_at": {"N": str(due_second + TTL_GRACE_SECONDS)},
    }
    if tenant is not None:
        item["tenant"] = {"S": tenant}
    return item


def cancel_item(delay_id: str, *, cancelled_ms: int, shard: int = 0) -> dict[str, dict[str, str]]:
    """A cancel record for `delay_id`."""
    return {
        "pk": {"S": f"cancel#{shard}"},
        "sk": {"S": delay_id},
        "kind": {"S": "cancel"},
        "cancelled_ms": {"N": str(cancelled_ms)},
        "expires_at": {"N": str(cancelled_ms // 1000 + 8 * TTL_GRACE_SECONDS)},
    }


def watermark_item(second: int, *, updated_ms: int | None = None) -> dict[str, dict[str, str]]:
    """The scheduler's watermark: the last due-second fully handed to SQS."""
    return {
        "pk": {"S": "meta#watermark"},
        "sk": {"S": "-"},
        "kind": {"S": "watermark"},
        "second": {"N": str(second)},
        "updated_ms": {"N": str(second * 1000 if updated_ms is None else updated_ms)},
    }


def write_export(
    directory: str | Path,
    items: Sequence[Item],
    *,
    export_id: str = DEFAULT_EXPORT_ID,
    files: int = 1,
    manifests: bool = True,
    export_time_ms: int | None = None,
    s3_prefix: str = "exports",
) -> Path:
    """Write `items` as ``<directory>/AWSDynamoDB/<export_id>/`` and return that directory.

    Items are spread round-robin over `files` data files (``data/<n>.json.gz``); with
    `manifests`, ``manifest-summary.json`` and ``manifest-files.json`` are written as DynamoDB
    writes them (keys relative to the bucket, under `s3_prefix`). A ``_started`` marker is
    always written, as DynamoDB does.
    """
    root = Path(directory) / "AWSDynamoDB" / export_id
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "_started").write_bytes(b"")
    chunks: list[list[Item]] = [list(items[i::files]) for i in range(files)]
    file_lines = []
    for number, chunk in enumerate(chunks):
        name = f"{number:04d}-{export_id[-8:]}.json.gz"
        body = "".join(json.dumps({"Item": item}, separators=(",", ":")) + "\n" for item in chunk)
        data = gzip.compress(body.encode("utf-8"), mtime=0)
        (root / "data" / name).write_bytes(data)
        file_lines.append(
            {
                "itemCount": len(chunk),
                "md5Checksum": base64.b64encode(hashlib.md5(data).digest()).decode(),  # noqa: S324 -- the manifest's checksum format, not security
                "etag": hashlib.md5(data).hexdigest(),  # noqa: S324 -- as above
                "dataFileS3Key": f"{s3_prefix}/AWSDynamoDB/{export_id}/data/{name}",
            }
        )
    if manifests:
        when = datetime.fromtimestamp((export_time_ms or 0) / 1000, UTC)
        summary = {
            "version": "2020-06-30",
            "exportArn": f"arn:aws:dynamodb:us-east-1:123456789012:table/delayq/export/{export_id}",
            "startTime": when.isoformat().replace("+00:00", "Z"),
            "endTime": when.isoformat().replace("+00:00", "Z"),
            "tableArn": "arn:aws:dynamodb:us-east-1:123456789012:table/delayq",
            "tableId": "00000000-0000-0000-0000-000000000000",
            "exportTime": when.isoformat().replace("+00:00", "Z"),
            "s3Bucket": "analytics",
            "s3Prefix": s3_prefix,
            "s3SseAlgorithm": "AES256",
            "s3SseKmsKeyId": None,
            "manifestFilesS3Key": f"{s3_prefix}/AWSDynamoDB/{export_id}/manifest-files.json",
            "billedSizeBytes": 0,
            "itemCount": len(items),
            "outputFormat": "DYNAMODB_JSON",
            "exportType": "FULL_EXPORT",
        }
        if export_time_ms is None:
            del summary["exportTime"]
        (root / "manifest-summary.json").write_text(json.dumps(summary), encoding="utf-8")
        (root / "manifest-files.json").write_text(
            "".join(json.dumps(line) + "\n" for line in file_lines), encoding="utf-8"
        )
    return root
