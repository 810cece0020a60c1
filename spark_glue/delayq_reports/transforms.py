"""Pure DataFrame -> DataFrame transforms of the delivery report and the backlog forecast.

Decoders turn the export's typed attribute values (`schema.EXPORT_LINE`) into plain columns;
their final ``select`` is the schema contract the other transforms rely on. Times are computed
on epoch milliseconds (UTC buckets whatever the session time zone) and shown as timestamps.

Lateness percentiles come from the merged histograms of the emitter's statistics items (see
`delayq.stats`): bucket ``i`` holds lateness in ``(BOUNDS_MS[i-1], BOUNDS_MS[i]]``. For ``q``
(per mille) and ``n`` messages, the percentile is the upper bound of the first bucket whose
cumulative count ``c`` satisfies ``1000 * c >= q * n`` (nearest rank), capped at the exact
maximum lateness; the overflow bucket (above 60 s) reports the maximum. So the reported value is
never below the true percentile and at most one bucket width above it: "p99 = 500" means at
least 99 % of the messages were at most 500 ms late. Shares "within X" count lateness <= X,
exact because 500, 1000 and 2000 are bucket bounds; early deliveries count as within (they are
reported in `early` as well, since any early delivery breaks an invariant).
"""

from __future__ import annotations

from typing import Final, Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 -- PySpark's convention (palantir guide)

# The emitter's histogram layout (delayq.stats.BOUNDS_MS; a test keeps the two equal). Items
# written with other bounds are not merged (`known_layout` is false) and are counted instead.
BOUNDS_ATTRIBUTE: Final = (
    "0,10,25,50,100,200,300,400,500,750,1000,1500,2000,3000,5000,10000,30000,60000"
)
BOUNDS_MS: Final = tuple(int(bound) for bound in BOUNDS_ATTRIBUTE.split(","))
BUCKETS: Final = len(BOUNDS_MS) + 1

# Item kinds (delayq.constants).
KIND_MESSAGE: Final = "msg"
KIND_CANCEL: Final = "cancel"
KIND_WATERMARK: Final = "watermark"
KIND_STATS: Final = "stats"

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000
Grain = Literal["minute", "hour", "day"]
GRAIN_MS: Final[dict[str, int]] = {"minute": MINUTE_MS, "hour": HOUR_MS, "day": DAY_MS}
VOLUME_WINDOW_MINUTES: Final = 5

WITHIN_MS: Final[dict[str, int]] = {"within_500ms": 500, "within_1s": 1000, "within_2s": 2000}
PERCENTILES_PER_MILLE: Final[dict[str, int]] = {"p50_ms": 500, "p99_ms": 990}
MESSAGE_COLUMNS: Final = ("pk", "id", "topic", "tenant", "due_ms", "due_second", "size")


def _attr(name: str, type_key: str) -> Column:
    return F.col(f"Item.{name}.{type_key}")


# Delivery report ---------------------------------------------------------------------------


def decode_stats(raw: DataFrame) -> DataFrame:
    """Statistics items, one row per item and target topic.

    Columns: minute (epoch minute of emission), topic, messages, early, late_sum_ms,
    late_min_ms, late_max_ms, hist (array<long>), known_layout (histogram bounds as expected).
    """
    entries = raw.where(_attr("kind", "S") == KIND_STATS).select(
        _attr("minute", "N").cast("long").alias("minute"),
        _attr("bounds_ms", "S").alias("bounds_ms"),
        F.explode(_attr("targets", "M")).alias("topic", "entry"),
    )
    counter = {
        name: F.col(f"entry.M.{name}.N").cast("long")
        for name in ("messages", "early", "late_sum_ms", "late_min_ms", "late_max_ms")
    }
    hist = F.transform(F.col("entry.M.hist.L"), lambda value: value["N"].cast("long"))
    known = (F.col("bounds_ms") == BOUNDS_ATTRIBUTE) & (F.size(hist) == BUCKETS)
    return entries.select(
        F.col("minute"),
        F.col("topic"),
        *(column.alias(name) for name, column in counter.items()),
        hist.alias("hist"),
        F.coalesce(known, F.lit(False)).alias("known_layout"),
    )


def stats_in_window(stats: DataFrame, start_ms: int, end_ms: int) -> DataFrame:
    """Statistics of a known layout for the minutes that start in ``[start_ms, end_ms)``."""
    minute_start = F.col("minute") * MINUTE_MS
    return stats.where(F.col("known_layout") & (minute_start >= start_ms) & (minute_start < end_ms))


def summarize_lateness(stats: DataFrame, *keys: str) -> DataFrame:
    """Merge the histograms per `keys` (none: one overall row) and derive the lateness figures.

    Columns: keys, then messages, early, within_500ms, within_1s, within_2s (shares 0..1),
    p50_ms, p99_ms, max_ms (ms), mean_ms. Groups without messages are dropped.
    """
    merged = stats.groupBy(*keys).agg(
        F.sum("messages").alias("messages"),
        F.sum("early").alias("early"),
        F.sum("late_sum_ms").alias("late_sum_ms"),
        F.max("late_max_ms").alias("max_ms"),
        _sum_histograms(F.col("hist")).alias("hist"),
    )
    messages = F.col("messages")
    cumulative = _cumulative(F.col("hist"))
    within = {
        name: (F.element_at(cumulative, BOUNDS_MS.index(limit) + 1) / messages).alias(name)
        for name, limit in WITHIN_MS.items()
    }
    percentiles = {
        name: _percentile(cumulative, messages, F.col("max_ms"), per_mille).alias(name)
        for name, per_mille in PERCENTILES_PER_MILLE.items()
    }
    return merged.where(messages > 0).select(
        *(F.col(k) for k in keys),
        messages,
        F.col("early"),
        *within.values(),
        *percentiles.values(),
        F.col("max_ms"),
        (F.col("late_sum_ms") / messages).alias("mean_ms"),
    )


def lateness_hourly(stats: DataFrame) -> DataFrame:
    """Lateness per topic and UTC hour of emission: topic, hour, then the columns of
    `summarize_lateness`."""
    hour_start = (F.col("minute") - F.col("minute") % 60) * 60
    with_hour = stats.select("*", F.timestamp_seconds(hour_start).alias("hour"))
    return summarize_lateness(with_hour, "topic", "hour")


def lateness_histogram(stats: DataFrame) -> DataFrame:
    """The histograms of all topics merged: one row per bucket, all `BUCKETS` of them.

    Columns: bucket (0-based index), le_ms (the bucket's inclusive upper bound; null for the
    overflow bucket above 60 s), messages. Bucket 0 (le_ms 0) holds the early deliveries and
    those exactly on time.
    """
    merged = stats.agg(_sum_histograms(F.col("hist")).alias("hist"))
    counts = merged.select(F.posexplode("hist").alias("bucket", "messages"))
    return counts.select(
        F.col("bucket").cast("int").alias("bucket"),
        F.element_at(_upper_bounds(), F.col("bucket") + 1).alias("le_ms"),
        F.col("messages"),
    )


def volume_5min(stats: DataFrame) -> DataFrame:
    """Messages delivered per topic and 5-minute window of emission.

    Columns: window_start, topic, messages. Windows without deliveries have no row.
    """
    minute = F.col("minute")
    window_start = F.timestamp_seconds((minute - minute % VOLUME_WINDOW_MINUTES) * 60)
    return stats.groupBy(window_start.alias("window_start"), F.col("topic")).agg(
        F.sum("messages").alias("messages")
    )


def volume_peak(volume: DataFrame) -> DataFrame:
    """The busiest 5-minute window over all topics (the earliest on a tie), at most one row.

    Columns: window_start, messages, per_second (the window's average rate).
    """
    totals = volume.groupBy("window_start").agg(F.sum("messages").alias("messages"))
    return (
        totals.orderBy(F.col("messages").desc(), F.col("window_start"))
        .limit(1)
        .select(
            F.col("window_start"),
            F.col("messages"),
            (F.col("messages") / (VOLUME_WINDOW_MINUTES * 60)).alias("per_second"),
        )
    )


def _upper_bounds() -> Column:
    """Each bucket's inclusive upper bound; null for the overflow bucket."""
    return F.array(*(F.lit(b).cast("long") for b in BOUNDS_MS), F.lit(None).cast("long"))


def _sum_histograms(hist: Column) -> Column:
    zeros = F.array_repeat(F.lit(0).cast("long"), BUCKETS)
    return F.aggregate(
        F.collect_list(hist), zeros, lambda acc, h: F.zip_with(acc, h, lambda a, b: a + b)
    )


def _cumulative(hist: Column) -> Column:
    return F.transform(
        hist,
        lambda _, i: F.aggregate(
            F.slice(hist, F.lit(1), i + 1), F.lit(0).cast("long"), lambda acc, x: acc + x
        ),
    )


def _percentile(cumulative: Column, messages: Column, max_ms: Column, per_mille: int) -> Column:
    reached = F.transform(cumulative, lambda c: c * 1000 >= messages * per_mille)
    bucket = F.array_position(reached, True).cast("int")
    # The overflow bucket has no upper bound (null); least() skips nulls and reports max_ms.
    return F.least(F.element_at(_upper_bounds(), bucket), max_ms)


# Backlog forecast --------------------------------------------------------------------------


# A stored message's sort key ends with its record's version tag (``delayq.store.sort_key``).
_VERSION_TAG: Final = "#[A-Za-z0-9_-]{8}$"


def decode_items(raw: DataFrame) -> DataFrame:
    """Message, cancel and watermark items.

    Columns: kind, pk, id (the delay id: a cancel's sort key; a message's without the record's
    version tag), topic, tenant, due_ms, due_second (the numeric part of a message's pk before
    '#'), size, second (watermark).
    """
    pk = _attr("pk", "S")
    sk = _attr("sk", "S")
    delay_id = F.when(
        _attr("kind", "S") == KIND_MESSAGE, F.regexp_replace(sk, _VERSION_TAG, "")
    ).otherwise(sk)
    return raw.where(_attr("kind", "S").isin(KIND_MESSAGE, KIND_CANCEL, KIND_WATERMARK)).select(
        _attr("kind", "S").alias("kind"),
        pk.alias("pk"),
        delay_id.alias("id"),
        _attr("target", "S").alias("topic"),
        _attr("tenant", "S").alias("tenant"),
        _attr("due_ms", "N").cast("long").alias("due_ms"),
        F.substring_index(pk, "#", 1).cast("long").alias("due_second"),
        _attr("size", "N").cast("long").alias("size"),
        _attr("second", "N").cast("long").alias("second"),
    )


def live_messages(items: DataFrame) -> DataFrame:
    """Stored messages whose id no cancel item names. Columns: `MESSAGE_COLUMNS`."""
    messages = items.where(F.col("kind") == KIND_MESSAGE)
    cancelled = items.where(F.col("kind") == KIND_CANCEL).select("id")
    return messages.join(cancelled, on="id", how="left_anti").select(*MESSAGE_COLUMNS)


def watermark(items: DataFrame) -> DataFrame:
    """One row, column second: the last due-second the scheduler handed to SQS (null if none)."""
    return items.where(F.col("kind") == KIND_WATERMARK).agg(F.max("second").alias("second"))


def kind_counts(items: DataFrame) -> DataFrame:
    """Items per kind. Columns: kind, items."""
    return items.groupBy("kind").agg(F.count(F.lit(1)).alias("items"))


def due_forecast(messages: DataFrame, now_ms: int, days: int, grain: Grain) -> DataFrame:
    """Messages due per topic and UTC minute, hour or day in ``[now_ms, now_ms + days)``.

    Columns: topic, period_start, messages, bytes. The first period counts from now only.
    """
    size = GRAIN_MS[grain]
    due = F.col("due_ms")
    upcoming = messages.where((due >= now_ms) & (due < now_ms + days * DAY_MS))
    period_start = F.timestamp_millis(due - due % size)
    return upcoming.groupBy(F.col("topic"), period_start.alias("period_start")).agg(
        F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes")
    )


def cohorts(messages: DataFrame, now_ms: int, top: int) -> DataFrame:
    """The `top` largest same-second cohorts still to come (coming bursts), largest first.

    Columns: due_second, due_at, messages, bytes, topics (sorted, comma-separated). Only the
    `top` seconds collect their topics, so the cost is one count per due-second.
    """
    upcoming = messages.where(F.col("due_ms") >= now_ms)
    largest = (
        upcoming.groupBy("due_second")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
        .orderBy(F.col("messages").desc(), F.col("due_second"))
        .limit(top)
    )
    topics = (
        upcoming.join(F.broadcast(largest.select("due_second")), on="due_second", how="left_semi")
        .groupBy("due_second")
        .agg(F.array_join(F.array_sort(F.collect_set("topic")), ",").alias("topics"))
    )
    return (
        largest.join(topics, on="due_second", how="inner")
        .select(
            F.col("due_second"),
            F.timestamp_seconds(F.col("due_second")).alias("due_at"),
            F.col("messages"),
            F.col("bytes"),
            F.col("topics"),
        )
        .orderBy(F.col("messages").desc(), F.col("due_second"))
    )


def overdue_items(messages: DataFrame, now_ms: int, watermark_second: int | None) -> DataFrame:
    """Messages past due that the scheduler has not handed to SQS (due second above the
    watermark; with no watermark, every past-due message). Past-due messages at or below the
    watermark are normal: they wait for TTL clean-up.

    Columns: pk, id, topic, tenant, due_at, due_ms, overdue_ms.
    """
    return messages.where(_overdue(now_ms, watermark_second)).select(
        F.col("pk"),
        F.col("id"),
        F.col("topic"),
        F.col("tenant"),
        F.timestamp_millis(F.col("due_ms")).alias("due_at"),
        F.col("due_ms"),
        (F.lit(now_ms) - F.col("due_ms")).alias("overdue_ms"),
    )


def backlog_by_topic(
    messages: DataFrame, now_ms: int, days: int, watermark_second: int | None
) -> DataFrame:
    """The stored backlog per topic.

    Columns: topic, pending (due from now on), due_in_window (due in ``[now, now + days)``),
    overdue (see `overdue_items`), scheduled_past_due (past due, handed to SQS, awaiting TTL),
    bytes_pending, next_due_at, oldest_overdue_at.
    """
    due = F.col("due_ms")
    upcoming = due >= now_ms
    in_window = upcoming & (due < now_ms + days * DAY_MS)
    overdue = _overdue(now_ms, watermark_second)
    return messages.groupBy("topic").agg(
        F.count_if(upcoming).alias("pending"),
        F.count_if(in_window).alias("due_in_window"),
        F.count_if(overdue).alias("overdue"),
        F.count_if(~upcoming & ~overdue).alias("scheduled_past_due"),
        F.coalesce(F.sum(F.when(upcoming, F.col("size"))), F.lit(0)).alias("bytes_pending"),
        F.timestamp_millis(F.min(F.when(upcoming, due))).alias("next_due_at"),
        F.timestamp_millis(F.min(F.when(overdue, due))).alias("oldest_overdue_at"),
    )


def _overdue(now_ms: int, watermark_second: int | None) -> Column:
    past_due = F.col("due_ms") < now_ms
    if watermark_second is None:
        return past_due
    return past_due & (F.col("due_second") > watermark_second)
