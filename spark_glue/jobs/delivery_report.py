"""Glue entry point of DeliveryReportJob: arguments in, `run_delivery_report`, nothing else.

Arguments: ``--export_path``, ``--output_path``, optional ``--now_ms``, ``--days`` and
``--lateness_p99_alarm_ms`` (the template passes its LatenessP99AlarmMs). The
`delayq_reports` package comes from ``--extra-py-files`` (``glue/delayq_reports.zip``).
"""

from __future__ import annotations

import sys

import boto3
from awsglue.context import GlueContext
from awsglue.utils import getResolvedOptions
from pyspark.context import SparkContext

from delayq_reports.jobs import run_delivery_report
from delayq_reports.options import DeliveryReportOptions


def main(argv: list[str]) -> None:
    """Resolve the job arguments and write the delivery report."""
    options = DeliveryReportOptions.from_argv(argv, getResolvedOptions)
    glue = GlueContext(SparkContext.getOrCreate())
    run_delivery_report(glue.spark_session, options, s3_client=boto3.client("s3"))


if __name__ == "__main__":
    main(sys.argv)
