"""The export layout, its manifests, S3 and local paths, and table output."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]  # py4j ships no types
from pyspark.sql import Row, SparkSession

from delayq_reports.exceptions import ExportLayoutError, ReportError
from delayq_reports.io import (
    Export,
    LocalStore,
    S3Store,
    locate_export,
    read_export,
    stage_export,
    store_for,
    write_table,
)
from delayq_reports.schema import EXPORT_LINE
from delayq_reports.synthetic_exports import message_item, write_export
from tests.spark.conftest import NOW

EXPORT_ID = "01740000000000-0f0f0f0f"
ITEMS = [message_item(f"m{i}", due_ms=NOW + i * 1000, target="orders") for i in range(5)]


@pytest.fixture
def export_root(tmp_path: Path) -> Path:
    return write_export(
        tmp_path / "exports", ITEMS, export_id=EXPORT_ID, files=2, export_time_ms=NOW
    )


class TestLocateLocal:
    @pytest.mark.parametrize("level", [0, 1, 2], ids=["export dir", "AWSDynamoDB", "prefix"])
    def test_the_export_dir_or_any_parent_prefix(self, export_root: Path, level: int) -> None:
        path = export_root
        for _ in range(level):
            path = path.parent

        export = locate_export(LocalStore(), str(path) + "/")

        assert export.root == str(export_root)
        assert export.export_id == EXPORT_ID
        assert export.data_files == tuple(
            str(export_root / "data" / f"{n:04d}-0f0f0f0f.json.gz") for n in range(2)
        )
        assert export.manifests == (
            str(export_root / "manifest-summary.json"),
            str(export_root / "manifest-files.json"),
        )
        assert (export.item_count, export.export_time_ms) == (5, NOW)

    def test_the_newest_of_several_exports(self, tmp_path: Path) -> None:
        write_export(tmp_path, ITEMS, export_id="01-older", export_time_ms=NOW)
        write_export(tmp_path, ITEMS[:1], export_id="02-newer", export_time_ms=NOW + 1)
        assert locate_export(LocalStore(), str(tmp_path)).export_id == "02-newer"

    def test_moto_layout_without_manifests(self, tmp_path: Path) -> None:
        """moto writes only data/<uuid>.gz; the newest by file time wins."""
        for export_id, mtime in (("aaa", 2_000_000_000), ("bbb", 1_000_000_000)):
            data = tmp_path / "p" / "AWSDynamoDB" / export_id / "data"
            data.mkdir(parents=True)
            (data / "c0ffee.gz").write_bytes(gzip.compress(b""))
            os.utime(data / "c0ffee.gz", (mtime, mtime))

        export = locate_export(LocalStore(), str(tmp_path / "p"))

        assert export.export_id == "aaa"
        assert export.data_files == (str(tmp_path / "p/AWSDynamoDB/aaa/data/c0ffee.gz"),)
        assert (export.manifests, export.item_count, export.export_time_ms) == ((), None, None)

    def test_manifest_naming_a_missing_data_file_fails(self, export_root: Path) -> None:
        (export_root / "data" / "0001-0f0f0f0f.json.gz").unlink()
        with pytest.raises(ExportLayoutError, match=r"lists 1 data file\(s\) that are missing"):
            locate_export(LocalStore(), str(export_root))

    def test_empty_table_export_has_no_data_files(self, tmp_path: Path) -> None:
        root = write_export(tmp_path, [], export_time_ms=NOW)
        (root / "data" / "0000-a1b2c3d4.json.gz").unlink()
        (root / "manifest-files.json").write_text("\n")

        export = locate_export(LocalStore(), str(tmp_path))

        assert (export.data_files, export.item_count) == ((), 0)

    def test_an_export_time_without_zone_is_utc(self, export_root: Path) -> None:
        summary_path = export_root / "manifest-summary.json"
        summary = json.loads(summary_path.read_text())
        summary["exportTime"] = "2025-02-19T21:20:00"
        summary_path.write_text(json.dumps(summary))
        assert locate_export(LocalStore(), str(export_root)).export_time_ms == NOW

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("outputFormat", "ION", "ION exports are not supported"),
            ("exportType", "INCREMENTAL_EXPORT", "INCREMENTAL_EXPORT is not supported"),
            ("exportTime", "yesterday", "is not an ISO 8601 time"),
        ],
    )
    def test_unsupported_summaries_fail(
        self, export_root: Path, field: str, value: str, message: str
    ) -> None:
        summary_path = export_root / "manifest-summary.json"
        summary = json.loads(summary_path.read_text())
        summary[field] = value
        summary_path.write_text(json.dumps(summary))
        with pytest.raises(ExportLayoutError, match=message):
            locate_export(LocalStore(), str(export_root))

    @pytest.mark.parametrize(
        ("name", "content", "message"),
        [
            ("manifest-summary.json", "{", "is not JSON"),
            ("manifest-summary.json", "[]", "is not a JSON object"),
            ("manifest-files.json", "{\n", r":1 is not JSON"),
            ("manifest-files.json", '{"itemCount": 1}\n', "has no dataFileS3Key"),
        ],
    )
    def test_broken_manifests_fail(
        self, export_root: Path, name: str, content: str, message: str
    ) -> None:
        (export_root / name).write_text(content)
        with pytest.raises(ExportLayoutError, match=message):
            locate_export(LocalStore(), str(export_root))

    def test_no_export_at_all(self, tmp_path: Path) -> None:
        (tmp_path / "readme.txt").write_text("nothing here")
        with pytest.raises(ExportLayoutError, match="no DynamoDB export under"):
            locate_export(LocalStore(), str(tmp_path))


class TestS3:
    @pytest.fixture
    def s3(self, export_root: Path) -> object:
        with mock_aws():
            client = boto3.client("s3", region_name="us-east-1")
            client.create_bucket(Bucket="analytics")
            base = export_root.parent.parent  # the local "exports" prefix
            for file in sorted(export_root.rglob("*")):
                if file.is_file():
                    key = f"exports/{file.relative_to(base).as_posix()}"
                    client.put_object(Bucket="analytics", Key=key, Body=file.read_bytes())
            yield client

    def test_locate_on_s3(self, s3: object) -> None:
        export = locate_export(S3Store(s3), "s3://analytics/exports")

        root = f"s3://analytics/exports/AWSDynamoDB/{EXPORT_ID}"
        assert export.root == root
        assert export.data_files == (
            f"{root}/data/0000-0f0f0f0f.json.gz",
            f"{root}/data/0001-0f0f0f0f.json.gz",
        )
        assert (export.item_count, export.export_time_ms) == (5, NOW)

    @pytest.mark.spark
    def test_stage_an_s3_export_and_read_it(
        self, s3: object, spark: SparkSession, tmp_path: Path
    ) -> None:
        source = S3Store(s3)
        staged = stage_export(
            source, locate_export(source, "s3://analytics/exports"), str(tmp_path / "stage")
        )

        assert staged.root == str(tmp_path / "stage" / "AWSDynamoDB" / EXPORT_ID)
        assert (staged.item_count, staged.export_time_ms, len(staged.data_files)) == (5, NOW, 2)
        raw = read_export(spark, LocalStore(), staged)
        ids = sorted(r.S.split("#")[0] for r in raw.select("Item.sk.S").collect())
        assert ids == [f"m{i}" for i in range(5)]

    def test_write_and_read_back(self, s3: object) -> None:
        store = S3Store(s3)
        store.write_bytes("s3://analytics/reports/index.html", b"<html>", "text/html")
        assert store.read_bytes("s3://analytics/reports/index.html") == b"<html>"
        head = s3.head_object(Bucket="analytics", Key="reports/index.html")  # type: ignore[attr-defined]
        assert head["ContentType"] == "text/html"

    @pytest.mark.parametrize(
        ("call", "message"),
        [
            (lambda s: s.list("s3://missing-bucket/x"), "cannot list"),
            (lambda s: s.read_bytes("s3://analytics/nope"), "cannot read"),
            (lambda s: s.write_bytes("s3://missing-bucket/x", b"", "text/plain"), "cannot write"),
            (lambda s: s.list("s3:///x"), "not an s3://bucket/key URI"),
        ],
    )
    def test_errors_are_translated(self, s3: object, call: object, message: str) -> None:
        with pytest.raises(ReportError, match=message):
            call(S3Store(s3))  # type: ignore[operator]

    def test_s3_paths_need_a_client(self, s3: object) -> None:
        with pytest.raises(ReportError, match="no S3 client"):
            store_for("s3://analytics/exports")
        store = store_for("s3://analytics/exports", s3)
        assert isinstance(store, S3Store)
        assert store.spark_path("s3://analytics/x") == "s3://analytics/x"  # Glue reads s3:// itself
        assert isinstance(store_for("/tmp/x", s3), LocalStore)


@pytest.mark.spark
class TestReadAndWrite:
    def test_read_export_decodes_lines(self, spark: SparkSession, export_root: Path) -> None:
        store = LocalStore()
        raw = read_export(spark, store, locate_export(store, str(export_root)))

        assert raw.schema == EXPORT_LINE
        first = raw.where("Item.sk.S LIKE 'm0#%'").select("Item.pk.S", "Item.due_ms.N").collect()
        assert first == [Row(S=f"{NOW // 1000}#0", N=str(NOW))]

    def test_empty_export_reads_as_no_rows(self, spark: SparkSession, tmp_path: Path) -> None:
        root = write_export(tmp_path, [], export_time_ms=NOW)
        store = LocalStore()
        raw = read_export(spark, store, locate_export(store, str(root)))
        assert (raw.schema, raw.count()) == (EXPORT_LINE, 0)

    def test_no_data_files_read_as_no_rows(self, spark: SparkSession) -> None:
        export = Export(root="/nowhere", export_id="x", data_files=())
        raw = read_export(spark, LocalStore(), export)
        assert (raw.schema, raw.count()) == (EXPORT_LINE, 0)

    def test_malformed_json_fails_the_job(self, spark: SparkSession, export_root: Path) -> None:
        bad = export_root / "data" / "0000-0f0f0f0f.json.gz"
        bad.write_bytes(gzip.compress(b'{"Item": {"pk": {"S": "1#0"}}}\n{not json\n'))
        store = LocalStore()
        raw = read_export(spark, store, locate_export(store, str(export_root)))
        with pytest.raises(Py4JJavaError, match="MALFORMED_RECORD"):
            raw.count()

    def test_write_table_gives_one_sorted_csv_with_header_and_parquet(
        self, spark: SparkSession, tmp_path: Path
    ) -> None:
        df = spark.createDataFrame([("b", 2), ("a", 1), ("c", 3)], "topic string, n long")

        out = write_table(LocalStore(), df.repartition(3), str(tmp_path), "t", ("topic",))

        assert out.parquet == str(tmp_path / "parquet" / "t")
        assert Path(out.csv).parent == tmp_path / "csv" / "t"
        assert Path(out.csv).read_text() == "topic,n\na,1\nb,2\nc,3\n"
        assert spark.read.parquet(out.parquet).orderBy("topic").collect() == [
            ("a", 1),
            ("b", 2),
            ("c", 3),
        ]

    def test_empty_table_still_has_a_header(self, spark: SparkSession, tmp_path: Path) -> None:
        df = spark.createDataFrame([], "topic string, n long")
        out = write_table(LocalStore(), df, str(tmp_path), "empty", ())
        assert Path(out.csv).read_text() == "topic,n\n"
