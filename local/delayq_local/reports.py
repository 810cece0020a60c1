"""`delayq report`: export the local stack's table the way AWS does, and run both Spark jobs.

PySpark is imported only here, when the reports run: `make demo` installs the local stack
without it (`make venv` installs everything).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from delayq_local.exceptions import LocalStackError
from delayq_local.stack import EmbeddedStack

if TYPE_CHECKING:
    from delayq_reports.local_spark import LocalReports

EXPORT_PREFIX = "exports"


def export_table(stack: EmbeddedStack, timeout_seconds: float = 120.0) -> str:
    """Export the message table to the analytics bucket (ExportTableToPointInTime, DynamoDB
    JSON, as the daily export does in AWS); returns the export prefix once it is complete."""
    table = stack.resource("MessageTable")
    bucket = stack.resource("AnalyticsBucket").ref
    dynamodb = stack.client("dynamodb")
    started = dynamodb.export_table_to_point_in_time(
        TableArn=table.attributes["Arn"],
        S3Bucket=bucket,
        S3Prefix=EXPORT_PREFIX,
        ExportFormat="DYNAMODB_JSON",
    )["ExportDescription"]
    deadline = time.monotonic() + timeout_seconds
    status = started["ExportStatus"]
    while status == "IN_PROGRESS":
        if time.monotonic() > deadline:
            raise LocalStackError(f"table export not complete after {timeout_seconds:.0f}s")
        time.sleep(0.5)
        status = dynamodb.describe_export(ExportArn=started["ExportArn"])["ExportDescription"][
            "ExportStatus"
        ]
    if status != "COMPLETED":
        raise LocalStackError(f"table export ended {status}")
    return f"s3://{bucket}/{EXPORT_PREFIX}"


def require_spark() -> None:
    """Fail before any work when PySpark is not installed, and say how to install it."""
    if importlib.util.find_spec("pyspark") is None:
        raise LocalStackError(
            "the reports need PySpark (and Java 17): `make venv` installs it "
            "(`make demo` installs the local stack only)"
        )


def export_and_report(stack: EmbeddedStack, output: Path, out: TextIO) -> LocalReports:
    """Export the table, then run the delivery report and the backlog forecast on it."""
    require_spark()
    from delayq_reports.local_spark import run_reports  # noqa: PLC0415 (PySpark, see the docstring)

    export = export_table(stack)
    out.write(f"table exported to {export}; running the Spark reports (local[2])\n")
    return run_reports(export, str(output), s3_client=stack.client("s3"))
