"""Glue entry point of BacklogForecastJob: arguments in, `run_backlog_forecast`, nothing else.

Arguments: ``--export_path``, ``--output_path``, optional ``--now_ms``, ``--days`` and
``--top_cohorts``. The `delayq_reports` package comes from ``--extra-py-files``
(``glue/delayq_reports.zip``).
"""

from __future__ import annotations

import sys

import boto3
from awsglue.context import GlueContext
from awsglue.utils import getResolvedOptions
from pyspark.context import SparkContext

from delayq_reports.jobs import run_backlog_forecast
from delayq_reports.options import BacklogForecastOptions


def main(argv: list[str]) -> None:
    """Resolve the job arguments and write the backlog forecast."""
    options = BacklogForecastOptions.from_argv(argv, getResolvedOptions)
    glue = GlueContext(SparkContext.getOrCreate())
    run_backlog_forecast(glue.spark_session, options, s3_client=boto3.client("s3"))


if __name__ == "__main__":
    main(sys.argv)
