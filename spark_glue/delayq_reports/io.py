"""Reading DynamoDB exports and writing report outputs, on local paths and on ``s3://``.

Export layout (DynamoDB ``ExportTableToPointInTime``, DYNAMODB_JSON format)::

    <prefix>/AWSDynamoDB/<export-id>/manifest-summary.json   one JSON object
    <prefix>/AWSDynamoDB/<export-id>/manifest-files.json     one {"dataFileS3Key": ...} per line
    <prefix>/AWSDynamoDB/<export-id>/data/<name>.json.gz     one {"Item": {...}} per line

`locate_export` accepts the export directory itself, ``<prefix>/AWSDynamoDB`` or ``<prefix>``.
When several exports are found it takes the newest (manifest export time, else file times).
The manifests are optional: moto writes only ``data/<name>.gz``. When ``manifest-files.json``
exists it is authoritative, and a data file it lists but that is missing is an error.

Listing and small files go through a `Store` (the local file system, or S3 through a boto3
client passed in); Spark reads the data files and writes tables itself, so in Glue the data
never passes through the driver. Local Spark has no S3 file system: `stage_export` copies an
``s3://`` export to a local directory first.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError
from pyspark.sql import Column, DataFrame, SparkSession

from delayq_reports.exceptions import ExportLayoutError, ReportError
from delayq_reports.schema import EXPORT_LINE

EXPORTS_DIR = "AWSDynamoDB"
DATA_DIR = "data"
MANIFEST_SUMMARY = "manifest-summary.json"
MANIFEST_FILES = "manifest-files.json"
SUPPORTED_FORMAT = "DYNAMODB_JSON"
SUPPORTED_TYPE = "FULL_EXPORT"


@dataclass(frozen=True)
class Entry:
    """One file in a listing."""

    path: str
    size: int
    modified_ms: int


class Store(Protocol):
    """Where exports are read from and small outputs written to."""

    def list(self, prefix: str) -> list[Entry]:
        """Every file under the directory `prefix`, recursively; paths start with `prefix`."""

    def read_bytes(self, path: str) -> bytes:
        """The content of one file."""

    def write_bytes(self, path: str, data: bytes, content_type: str) -> None:
        """Create or replace one file."""

    def spark_path(self, path: str) -> str:
        """The URI Spark uses for `path`."""


def join(base: str, *parts: str) -> str:
    """`base` and `parts` joined with single slashes (works for local paths and s3:// URIs)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])


def is_s3(path: str) -> bool:
    """True for an ``s3://`` URI."""
    return path.startswith("s3://")


class LocalStore:
    """The local file system."""

    def list(self, prefix: str) -> list[Entry]:
        """Every file under `prefix` (none if it does not exist)."""
        base = prefix.rstrip("/") or "/"
        entries = []
        for directory, _, names in os.walk(base):
            for name in names:
                full = os.path.join(directory, name)
                stat = os.stat(full)
                entries.append(Entry(full, stat.st_size, stat.st_mtime_ns // 1_000_000))
        return sorted(entries, key=lambda e: e.path)

    def read_bytes(self, path: str) -> bytes:
        """The content of one file."""
        return Path(path).read_bytes()

    def write_bytes(self, path: str, data: bytes, content_type: str) -> None:
        """Create or replace one file, creating its directory."""
        del content_type  # only object stores keep it
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def spark_path(self, path: str) -> str:
        """A ``file://`` URI, so that a cluster's default file system does not apply."""
        return Path(path).resolve().as_uri()


class S3Store:
    """Amazon S3 (or an S3 endpoint such as moto) through a boto3 S3 client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def list(self, prefix: str) -> list[Entry]:
        """Every object under the ``s3://bucket/key`` prefix, read as a directory."""
        bucket, key = _split_s3(prefix)
        key_prefix = key.rstrip("/") + "/" if key else ""
        entries = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=key_prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    modified_ms = int(obj["LastModified"].timestamp() * 1000)
                    entries.append(Entry(f"s3://{bucket}/{obj['Key']}", obj["Size"], modified_ms))
        except (ClientError, BotoCoreError) as e:
            raise ReportError(f"cannot list {prefix}: {e}") from e
        return entries

    def read_bytes(self, path: str) -> bytes:
        """The content of one object."""
        bucket, key = _split_s3(path)
        try:
            body: bytes = self._client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as e:
            raise ReportError(f"cannot read {path}: {e}") from e
        return body

    def write_bytes(self, path: str, data: bytes, content_type: str) -> None:
        """Create or replace one object."""
        bucket, key = _split_s3(path)
        try:
            self._client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        except (ClientError, BotoCoreError) as e:
            raise ReportError(f"cannot write {path}: {e}") from e

    def spark_path(self, path: str) -> str:
        """Unchanged: Glue's Spark reads and writes ``s3://`` itself."""
        return path


def store_for(path: str, s3_client: Any = None) -> Store:
    """The store for `path`: S3 (needs `s3_client`) for ``s3://``, else the local file system."""
    if not is_s3(path):
        return LocalStore()
    if s3_client is None:
        raise ReportError(f"{path} is on S3 but no S3 client was given")
    return S3Store(s3_client)


@dataclass(frozen=True)
class Export:
    """One located export: its directory, data files and what its manifests say."""

    root: str
    export_id: str
    data_files: tuple[str, ...]
    manifests: tuple[str, ...] = ()
    item_count: int | None = None
    export_time_ms: int | None = None


def locate_export(store: Store, path: str) -> Export:
    """Find the export at `path`: the export directory, its ``AWSDynamoDB`` parent, or a prefix
    above that. Raises `ExportLayoutError` when there is none or its manifests do not match."""
    base = path.rstrip("/")
    groups: dict[str, list[Entry]] = {}
    for entry in store.list(base):
        root = _export_root(base, entry.path)
        if root is not None:
            groups.setdefault(root, []).append(entry)
    if not groups:
        raise ExportLayoutError(
            f"no DynamoDB export under {path} "
            f"(expected {EXPORTS_DIR}/<export-id>/{DATA_DIR}/*.json.gz)"
        )
    exports = [_export(store, root, entries) for root, entries in groups.items()]
    return max(exports, key=lambda e: (_newest(e, groups[e.root]), e.root))


def stage_export(source: Store, export: Export, local_dir: str) -> Export:
    """Copy `export` (manifests and data files) under `local_dir` and locate the copy there."""
    local = LocalStore()
    root = join(local_dir, EXPORTS_DIR, export.export_id)
    for path in (*export.manifests, *export.data_files):
        target = join(root, relative_to(export.root, path))
        local.write_bytes(target, source.read_bytes(path), "application/octet-stream")
    return locate_export(local, root)


def read_export(spark: SparkSession, store: Store, export: Export) -> DataFrame:
    """The export's lines as a DataFrame with the `schema.EXPORT_LINE` schema.

    Malformed JSON fails the job (FAILFAST) rather than turning into empty rows.
    """
    if not export.data_files:
        return spark.createDataFrame([], EXPORT_LINE)
    paths = [store.spark_path(p) for p in export.data_files]
    return spark.read.schema(EXPORT_LINE).option("mode", "FAILFAST").json(paths)


@dataclass(frozen=True)
class TableOutput:
    """Where one table was written: a Parquet directory and one CSV file (with header)."""

    name: str
    parquet: str
    csv: str


def write_table(
    store: Store, df: DataFrame, root: str, name: str, order_by: Sequence[str | Column]
) -> TableOutput:
    """Write `df` as ``<root>/parquet/<name>/`` and ``<root>/csv/<name>/``, one file each,
    sorted by `order_by`. The CSV is made from the Parquet just written, so `df` is computed
    once. Report tables are aggregates, so one file stays small; the overdue list is the
    exception and is still written by an executor, never through the driver."""
    parquet_dir = join(root, "parquet", name)
    csv_dir = join(root, "csv", name)
    _sorted_single(df, order_by).write.mode("overwrite").parquet(store.spark_path(parquet_dir))
    written = df.sparkSession.read.parquet(store.spark_path(parquet_dir))
    csv = _sorted_single(written, order_by).write.mode("overwrite").option("header", True)
    csv.csv(store.spark_path(csv_dir))
    csv_files = [e.path for e in store.list(csv_dir) if e.path.endswith(".csv")]
    return TableOutput(name, parquet_dir, csv_files[0] if len(csv_files) == 1 else csv_dir)


def _sorted_single(df: DataFrame, order_by: Sequence[str | Column]) -> DataFrame:
    single = df.coalesce(1)
    return single.sortWithinPartitions(*order_by) if order_by else single


def relative_to(root: str, path: str) -> str:
    """`path` relative to the directory `root`, for links in the HTML summary."""
    return path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/") + "/") else path


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ReportError(f"not an s3://bucket/key URI: {uri}")
    return bucket, key


def _export_root(base: str, path: str) -> str | None:
    parts = path[len(base) :].strip("/").split("/")
    if len(parts) >= 2 and parts[-2] == DATA_DIR and parts[-1].endswith(".gz"):
        return join(base, *parts[:-2])
    if parts[-1] in (MANIFEST_SUMMARY, MANIFEST_FILES):
        return join(base, *parts[:-1])
    return None


def _export(store: Store, root: str, entries: Iterable[Entry]) -> Export:
    by_path = {e.path: e for e in entries}
    summary_path = join(root, MANIFEST_SUMMARY)
    files_path = join(root, MANIFEST_FILES)
    summary = _read_json(store, summary_path) if summary_path in by_path else {}
    _check_summary(root, summary)
    listed = sorted(p for p in by_path if p.startswith(join(root, DATA_DIR) + "/"))
    item_count = summary.get("itemCount")
    if files_path in by_path:
        lines = _read_json_lines(store, files_path)
        data_files = [
            join(root, DATA_DIR, posixpath.basename(line["dataFileS3Key"])) for line in lines
        ]
        missing = [p for p in data_files if p not in by_path]
        if missing:
            raise ExportLayoutError(
                f"{files_path} lists {len(missing)} data file(s) that are missing: {missing[:3]}"
            )
        item_count = sum(int(line.get("itemCount", 0)) for line in lines)
    else:
        data_files = listed
    manifests = tuple(p for p in (summary_path, files_path) if p in by_path)
    return Export(
        root=root,
        export_id=posixpath.basename(root),
        data_files=tuple(sorted(data_files)),
        manifests=manifests,
        item_count=None if item_count is None else int(item_count),
        export_time_ms=_time_ms(root, summary.get("exportTime")),
    )


def _check_summary(root: str, summary: dict[str, Any]) -> None:
    output_format = summary.get("outputFormat", SUPPORTED_FORMAT)
    if output_format != SUPPORTED_FORMAT:
        raise ExportLayoutError(
            f"{root}: {output_format} exports are not supported, only DYNAMODB_JSON"
        )
    export_type = summary.get("exportType", SUPPORTED_TYPE)
    if export_type != SUPPORTED_TYPE:
        raise ExportLayoutError(f"{root}: {export_type} is not supported, only full exports")


def _newest(export: Export, entries: Sequence[Entry]) -> int:
    if export.export_time_ms is not None:
        return export.export_time_ms
    return max(e.modified_ms for e in entries)


def _read_json(store: Store, path: str) -> dict[str, Any]:
    try:
        value = json.loads(store.read_bytes(path))
    except ValueError as e:
        raise ExportLayoutError(f"{path} is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise ExportLayoutError(f"{path} is not a JSON object")
    return value


def _read_json_lines(store: Store, path: str) -> list[dict[str, Any]]:
    lines = []
    for number, line in enumerate(store.read_bytes(path).decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise ExportLayoutError(f"{path}:{number} is not JSON: {e}") from e
        if not isinstance(value, dict) or not isinstance(value.get("dataFileS3Key"), str):
            raise ExportLayoutError(f"{path}:{number} has no dataFileS3Key")
        lines.append(value)
    return lines


def _time_ms(root: str, value: object) -> int | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError as e:
        raise ExportLayoutError(f"{root}: exportTime {value!r} is not an ISO 8601 time") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
