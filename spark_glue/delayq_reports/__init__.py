"""PySpark reports over DynamoDB exports of the delay queue's table (Glue 5.0 / Spark 3.5).

Two jobs: the delivery report (lateness shares and percentiles, early deliveries, volume per
5 minutes) and the backlog forecast (what is due per minute, hour and day, coming bursts, overdue
items). The Glue entry points live in ``spark_glue/jobs/``; `delayq_reports.local_spark.run_reports`
runs both on this machine.
"""

from delayq_reports.exceptions import ExportLayoutError, OptionsError, ReportError
from delayq_reports.jobs import ReportResult, run_backlog_forecast, run_delivery_report
from delayq_reports.options import BacklogForecastOptions, DeliveryReportOptions

__all__ = [
    "BacklogForecastOptions",
    "DeliveryReportOptions",
    "ExportLayoutError",
    "OptionsError",
    "ReportError",
    "ReportResult",
    "run_backlog_forecast",
    "run_delivery_report",
]
