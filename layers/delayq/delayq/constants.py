"""Every environment variable name, header name, default and AWS limit, in one place."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ATTR_CANCEL_ORDER",
    "ATTR_CANCEL_SRC",
    "ATTR_CANCEL_TS",
    "ATTR_KEY",
    "ATTR_KEY_Z",
    "ATTR_LATE_COUNT",
    "ATTR_LOCATED_PK",
    "ATTR_MOVED_BY_SRC",
    "ATTR_MOVED_BY_TS",
    "ATTR_OFFLOADED_BYTES",
    "ATTR_PENDING_OFFSET_PREFIX",
    "ATTR_PENDING_QUEUED",
    "ATTR_PENDING_STORED",
    "ATTR_PK",
    "ATTR_PLACEMENTS",
    "ATTR_PRIORITY",
    "ATTR_RELEASE_MS",
    "ATTR_RELEASE_RANK",
    "ATTR_RESCHEDULE_DUE_MS",
    "ATTR_RESCHEDULE_ORDER",
    "ATTR_RESCHEDULE_SRC",
    "ATTR_RESCHEDULE_TS",
    "ATTR_SK",
    "ATTR_TENANT",
    "ATTR_TS",
    "ATTR_TTL",
    "ATTR_VALUE",
    "ATTR_VALUE_Z",
    "ATTR_WATERMARK_CURSORS",
    "ATTR_WATERMARK_LATE",
    "ATTR_WATERMARK_READING",
    "ATTR_WATERMARK_SECOND",
    "ATTR_WATERMARK_TOKEN",
    "BUNDLE_MAX_OFFLOADED_BYTES",
    "CANCEL_PK_PREFIX",
    "CATCH_UP_SPREAD_SECONDS",
    "COUNTER_KEEP_SECONDS",
    "DEFAULT_AWS_CONNECT_TIMEOUT_SECONDS",
    "DEFAULT_AWS_READ_TIMEOUT_SECONDS",
    "DEFAULT_BUNDLE_MAX_BYTES",
    "DEFAULT_BUNDLE_MAX_MESSAGES",
    "DEFAULT_DELIVERY_LOG_RATE",
    "DEFAULT_DELIVERY_MAX_ATTEMPTS",
    "DEFAULT_DIRECT_WINDOW_MS",
    "DEFAULT_EMIT_LEAD_MS",
    "DEFAULT_HORIZON_SECONDS",
    "DEFAULT_INGEST_TIMEOUT_SECONDS",
    "DEFAULT_KAFKA_TIMEOUT_SECONDS",
    "DEFAULT_LOOKAHEAD_SECONDS",
    "DEFAULT_MAX_DELAY_SECONDS",
    "DEFAULT_MAX_HOLD_MS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_OFFLOAD_THRESHOLD_BYTES",
    "DEFAULT_SCHEDULER_PAGE_ITEMS",
    "DEFAULT_SHARDS",
    "DEFAULT_STATS_FLUSH_MESSAGES",
    "DEFAULT_TARGET_OUTAGE_MAX_SECONDS",
    "DEFAULT_TICK_SECONDS",
    "DEFAULT_TTL_CLOCK_MARGIN_SECONDS",
    "DEFAULT_TTL_GRACE_SECONDS",
    "DYNAMODB_BATCH_GET_KEYS",
    "DYNAMODB_BATCH_WRITE_ITEMS",
    "EMIT_BUFFER_KBYTES",
    "EMIT_FETCH_BUDGET_BYTES",
    "EMIT_FETCH_WORKERS",
    "EMIT_RESERVE_SECONDS",
    "EMIT_RETRY_MAX_SECONDS",
    "ENV_ALLOWED_TARGETS",
    "ENV_AWS_CONNECT_TIMEOUT_SECONDS",
    "ENV_AWS_READ_TIMEOUT_SECONDS",
    "ENV_AWS_REGION",
    "ENV_BUNDLE_MAX_BYTES",
    "ENV_BUNDLE_MAX_MESSAGES",
    "ENV_DELAY_DLQ_URL",
    "ENV_DELAY_QUEUE_HIGH_URL",
    "ENV_DELAY_QUEUE_LOW_URL",
    "ENV_DELAY_QUEUE_URL",
    "ENV_DELIVERY_LOG_RATE",
    "ENV_DELIVERY_MAX_ATTEMPTS",
    "ENV_DIRECT_WINDOW_MS",
    "ENV_EMIT_LEAD_MS",
    "ENV_HORIZON_SECONDS",
    "ENV_ID_INDEX",
    "ENV_INGEST_TIMEOUT_SECONDS",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_KAFKA_CA_LOCATION",
    "ENV_KAFKA_SECRET_ARN",
    "ENV_KAFKA_SECURITY",
    "ENV_KAFKA_TIMEOUT_SECONDS",
    "ENV_LOOKAHEAD_SECONDS",
    "ENV_MAX_DELAY_SECONDS",
    "ENV_MAX_HOLD_MS",
    "ENV_MAX_PAYLOAD_BYTES",
    "ENV_OFFLOAD_THRESHOLD_BYTES",
    "ENV_PAYLOAD_BUCKET",
    "ENV_PENDING_COUNTS",
    "ENV_REJECT_QUEUE_URL",
    "ENV_SCHEDULER_PAGE_ITEMS",
    "ENV_SHARDS",
    "ENV_STATS_FLUSH_MESSAGES",
    "ENV_STRICT_CAPS",
    "ENV_TABLE_NAME",
    "ENV_TARGET_OUTAGE_MAX_SECONDS",
    "ENV_TENANT_LIMITS",
    "ENV_TICK_QUEUE_URL",
    "ENV_TICK_SECONDS",
    "ENV_TTL_CLOCK_MARGIN_SECONDS",
    "ENV_TTL_GRACE_SECONDS",
    "HEADER_ATTEMPT",
    "HEADER_CANCEL",
    "HEADER_DELAY_MS",
    "HEADER_DELAY_SECONDS",
    "HEADER_DELIVER_AT",
    "HEADER_DUE_MS",
    "HEADER_EMITTED_MS",
    "HEADER_ID",
    "HEADER_PREFIX",
    "HEADER_PRIORITY",
    "HEADER_RELEASE_MS",
    "HEADER_RESCHEDULE",
    "HEADER_TARGET",
    "HEADER_TENANT",
    "HEADER_WAS_DUE",
    "INTERNAL_TOPIC_PREFIX",
    "KAFKA_DEFAULT_MESSAGE_MAX_BYTES",
    "KAFKA_RECORD_OVERHEAD_BYTES",
    "KIND_CANCEL",
    "KIND_COUNTER",
    "KIND_LOCATOR",
    "KIND_MESSAGE",
    "KIND_PENDING",
    "KIND_PLACEMENT",
    "KIND_STATS",
    "KIND_WATERMARK",
    "LATE_RANGE_KEEP_SECONDS",
    "LIFE_AFTER_RELEASE_SECONDS",
    "LOCATED_IN_QUEUE",
    "LOCATOR_PK_PREFIX",
    "MAX_BUNDLE_ENTRIES",
    "MAX_DIRECT_WINDOW_MS",
    "MAX_ID_BYTES",
    "MAX_ID_LENGTH",
    "MAX_INLINE_KEY_AND_HEADERS_BYTES",
    "MAX_LATE_RANGES",
    "MAX_RELEASE_SPREAD_SECONDS",
    "MAX_SHARDS",
    "MAX_TENANT_LENGTH",
    "PENDING_KEEP_SECONDS",
    "PENDING_PK_PREFIX",
    "PLACEMENT_GROUPS",
    "PLACEMENT_MAX_BYTES",
    "PLACEMENT_MAX_ENTRIES",
    "PLACEMENT_PK_PREFIX",
    "PRIORITIES",
    "PRIORITY_HIGH",
    "PRIORITY_LOW",
    "PRIORITY_NORMAL",
    "QUOTA_PK_PREFIX",
    "RATE_PK_PREFIX",
    "RELEASE_PROBE_MAX_STEP",
    "RESCHEDULE_MARGIN_MS",
    "SQS_BATCH_ENTRIES",
    "SQS_BILLING_CHUNK_BYTES",
    "SQS_MAX_BATCH_BYTES",
    "SQS_MAX_DELAY_SECONDS",
    "SQS_MAX_MESSAGE_BYTES",
    "SQS_MAX_RETENTION_SECONDS",
    "SQS_MAX_VISIBILITY_SECONDS",
    "STATS_PK_PREFIX",
    "STORE_ZLIB_LEVEL",
    "TICK_GROUP_ID",
    "TOPIC_WILDCARDS",
    "TTL_PRINCIPAL",
    "WATERMARK_PK",
    "WATERMARK_SK",
]

# Environment variables.
ENV_TABLE_NAME: Final = "DELAYQ_TABLE_NAME"
ENV_DELAY_QUEUE_URL: Final = "DELAYQ_DELAY_QUEUE_URL"
ENV_TICK_QUEUE_URL: Final = "DELAYQ_TICK_QUEUE_URL"
ENV_REJECT_QUEUE_URL: Final = "DELAYQ_REJECT_QUEUE_URL"
ENV_PAYLOAD_BUCKET: Final = "DELAYQ_PAYLOAD_BUCKET"
ENV_ALLOWED_TARGETS: Final = "DELAYQ_ALLOWED_TARGETS"
ENV_HORIZON_SECONDS: Final = "DELAYQ_HORIZON_SECONDS"
ENV_LOOKAHEAD_SECONDS: Final = "DELAYQ_LOOKAHEAD_SECONDS"
ENV_TICK_SECONDS: Final = "DELAYQ_TICK_SECONDS"
ENV_SHARDS: Final = "DELAYQ_SHARDS"
ENV_MAX_DELAY_SECONDS: Final = "DELAYQ_MAX_DELAY_SECONDS"
ENV_MAX_PAYLOAD_BYTES: Final = "DELAYQ_MAX_PAYLOAD_BYTES"
ENV_OFFLOAD_THRESHOLD_BYTES: Final = "DELAYQ_OFFLOAD_THRESHOLD_BYTES"
ENV_TTL_GRACE_SECONDS: Final = "DELAYQ_TTL_GRACE_SECONDS"
ENV_TTL_CLOCK_MARGIN_SECONDS: Final = "DELAYQ_TTL_CLOCK_MARGIN_SECONDS"
ENV_EMIT_LEAD_MS: Final = "DELAYQ_EMIT_LEAD_MS"
ENV_MAX_HOLD_MS: Final = "DELAYQ_MAX_HOLD_MS"
ENV_KAFKA_BOOTSTRAP: Final = "DELAYQ_KAFKA_BOOTSTRAP"
ENV_KAFKA_SECURITY: Final = "DELAYQ_KAFKA_SECURITY"
ENV_KAFKA_SECRET_ARN: Final = "DELAYQ_KAFKA_SECRET_ARN"  # noqa: S105 -- a variable name
ENV_KAFKA_CA_LOCATION: Final = "DELAYQ_KAFKA_CA_LOCATION"
ENV_KAFKA_TIMEOUT_SECONDS: Final = "DELAYQ_KAFKA_TIMEOUT_SECONDS"
ENV_AWS_CONNECT_TIMEOUT_SECONDS: Final = "DELAYQ_AWS_CONNECT_TIMEOUT_SECONDS"
ENV_AWS_READ_TIMEOUT_SECONDS: Final = "DELAYQ_AWS_READ_TIMEOUT_SECONDS"
ENV_STATS_FLUSH_MESSAGES: Final = "DELAYQ_STATS_FLUSH_MESSAGES"
ENV_SCHEDULER_PAGE_ITEMS: Final = "DELAYQ_SCHEDULER_PAGE_ITEMS"
ENV_BUNDLE_MAX_BYTES: Final = "DELAYQ_BUNDLE_MAX_BYTES"
ENV_BUNDLE_MAX_MESSAGES: Final = "DELAYQ_BUNDLE_MAX_MESSAGES"
ENV_INGEST_TIMEOUT_SECONDS: Final = "DELAYQ_INGEST_TIMEOUT_SECONDS"
ENV_DELAY_DLQ_URL: Final = "DELAYQ_DELAY_DLQ_URL"
ENV_DELIVERY_MAX_ATTEMPTS: Final = "DELAYQ_DELIVERY_MAX_ATTEMPTS"
ENV_TARGET_OUTAGE_MAX_SECONDS: Final = "DELAYQ_TARGET_OUTAGE_MAX_SECONDS"
ENV_DIRECT_WINDOW_MS: Final = "DELAYQ_DIRECT_WINDOW_MS"
ENV_DELIVERY_LOG_RATE: Final = "DELAYQ_DELIVERY_LOG_RATE"
ENV_TENANT_LIMITS: Final = "DELAYQ_TENANT_LIMITS"
ENV_PENDING_COUNTS: Final = "DELAYQ_PENDING_COUNTS"
ENV_STRICT_CAPS: Final = "DELAYQ_STRICT_CAPS"
ENV_ID_INDEX: Final = "DELAYQ_ID_INDEX"
ENV_DELAY_QUEUE_HIGH_URL: Final = "DELAYQ_DELAY_QUEUE_HIGH_URL"
ENV_DELAY_QUEUE_LOW_URL: Final = "DELAYQ_DELAY_QUEUE_LOW_URL"
ENV_AWS_REGION: Final = "AWS_REGION"

# Topics no allow-list can open: Kafka's internal topics (__consumer_offsets,
# __transaction_state) and anything else named like them.
INTERNAL_TOPIC_PREFIX: Final = "__"
# Allow-list pattern characters (fnmatch); a pattern must start with a literal character, so
# that no entry ('*', '**', '?*', '[a-z]*', ...) opens every topic.
TOPIC_WILDCARDS: Final = "*?["

# Control headers of the message contract (lower-case; matched case-insensitively).
HEADER_PREFIX: Final = "delay-"
HEADER_TARGET: Final = "delay-target"
HEADER_DELIVER_AT: Final = "delay-deliver-at"
HEADER_DELAY_SECONDS: Final = "delay-seconds"
HEADER_DELAY_MS: Final = "delay-ms"
HEADER_ID: Final = "delay-id"
HEADER_CANCEL: Final = "delay-cancel"
HEADER_TENANT: Final = "delay-tenant"
HEADER_PRIORITY: Final = "delay-priority"
# A reschedule: move the pending message with this id (stored for its old due time, in
# epoch milliseconds, ``delay-was-due``) to the due time of the usual due headers.
HEADER_RESCHEDULE: Final = "delay-reschedule"
HEADER_WAS_DUE: Final = "delay-was-due"
# Delivery headers added by the emitter.
HEADER_DUE_MS: Final = "delay-due-ms"
HEADER_EMITTED_MS: Final = "delay-emitted-ms"
HEADER_ATTEMPT: Final = "delay-attempt"
# When a tenant's release-rate cap moved the message after its due time.
HEADER_RELEASE_MS: Final = "delay-release-ms"

# Priorities (delay-priority): each has its own delay queue and emitter concurrency.
PRIORITY_HIGH: Final = "high"
PRIORITY_NORMAL: Final = "normal"
PRIORITY_LOW: Final = "low"
PRIORITIES: Final = (PRIORITY_HIGH, PRIORITY_NORMAL, PRIORITY_LOW)
MAX_TENANT_LENGTH: Final = 128

# Defaults.
DEFAULT_HORIZON_SECONDS: Final = 900
DEFAULT_LOOKAHEAD_SECONDS: Final = 840
DEFAULT_TICK_SECONDS: Final = 60
DEFAULT_SHARDS: Final = 16
DEFAULT_MAX_DELAY_SECONDS: Final = 7 * 24 * 3600
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
DEFAULT_OFFLOAD_THRESHOLD_BYTES: Final = 200 * 1024
DEFAULT_TTL_GRACE_SECONDS: Final = 24 * 3600
DEFAULT_EMIT_LEAD_MS: Final = 1500
DEFAULT_MAX_HOLD_MS: Final = 3000
DEFAULT_KAFKA_TIMEOUT_SECONDS: Final = 10.0
# Every AWS call is one attempt (botocore's retries off: the layer's own retries count them,
# within the deadline) bounded by these: a call cannot take effect long after its caller
# stopped counting on it. The read timeout bounds each socket read (not a whole 1 MB S3 put,
# whose upload is not a read) and must exceed any long poll (a redrive's WaitTimeSeconds).
DEFAULT_AWS_CONNECT_TIMEOUT_SECONDS: Final = 2.0
DEFAULT_AWS_READ_TIMEOUT_SECONDS: Final = 5.0
# The ingest function's timeout (the template sets the function and this variable from one
# value): ingest must finish a batch within horizon - look-ahead (see Settings).
DEFAULT_INGEST_TIMEOUT_SECONDS: Final = 60
# Deliveries the target refuses (the record is too large, the topic does not exist or may not
# be written...) are tried this many times, with back-off, then dead-lettered with the reason.
DEFAULT_DELIVERY_MAX_ATTEMPTS: Final = 5
# A target cluster that cannot be reached (timeouts, no leader, all brokers down) does not use
# up a message's attempts: it is retried, with back-off, until this long after its due time,
# then dead-lettered with reason target-unavailable.
DEFAULT_TARGET_OUTAGE_MAX_SECONDS: Final = 24 * 3600
# Messages due within this many milliseconds of ingest (or already due) are produced by ingest
# itself, held to their due time, instead of waiting for the emitter's poll (delayq.direct).
# 0: every message goes through the delay queue.
DEFAULT_DIRECT_WINDOW_MS: Final = 800
# The share of deliveries logged one line each (id, target, due, emitted, attempt, lateness),
# chosen by id so that an id is logged everywhere or nowhere. 0.01: about $0.001 of log
# ingestion per million messages.
DEFAULT_DELIVERY_LOG_RATE: Final = 0.01
# The direct window may not exceed this: ingest holds its batch that long at most.
MAX_DIRECT_WINDOW_MS: Final = 10_000
# Write the delivery statistics once this many deliveries are buffered (or the minute is over):
# at most 0.1 extra writes per delivered message.
DEFAULT_STATS_FLUSH_MESSAGES: Final = 10
# Items per scheduler Query page (one shard of one due-second): the scheduler sends a page before
# it reads the next, and re-sends at most one page per shard after a crash. 16 shards x 250
# items is 4,000 messages between two progress writes.
DEFAULT_SCHEDULER_PAGE_ITEMS: Final = 250
# Delay-queue bundles (docs/internals.md): requests sharing a DelaySeconds travel as one SQS
# message of at most this many bytes (SQS bills a request per 64 KiB chunk: one chunk) and
# this many messages. A batch of 100 bundles is then at most 10,000 messages for one emitter
# invocation (about 1.2 s of CPU at 256 MB, bench/cpu.py), well within its 30 s timeout.
DEFAULT_BUNDLE_MAX_BYTES: Final = 64 * 1024
DEFAULT_BUNDLE_MAX_MESSAGES: Final = 100
# The emitter refuses (bad-envelope) a bundle of more entries than this: a forged body must not
# turn into thousands of rejects or an invocation that cannot finish.
MAX_BUNDLE_ENTRIES: Final = 1000
# Bytes a delivered record may carry beyond key + value + user headers (which ingest caps at
# max_payload_bytes): the delivery headers (an id of up to 1 KiB, times, attempt) and Kafka's
# record framing, with room to spare. The producer's message.max.bytes is the sum.
KAFKA_RECORD_OVERHEAD_BYTES: Final = 64 * 1024
# librdkafka's own default message.max.bytes (smaller payload limits keep it).
KAFKA_DEFAULT_MESSAGE_MAX_BYTES: Final = 1_000_000
# The producer's in-memory queue (queue.buffering.max.kbytes): with the payloads being
# fetched, this bounds the emitter's memory whatever a batch holds.
EMIT_BUFFER_KBYTES: Final = 32 * 1024
# Offloaded values being fetched from S3 ahead of producing, at most this many bytes (and
# EMIT_FETCH_WORKERS requests) at a time.
EMIT_FETCH_BUDGET_BYTES: Final = 32 * 1024 * 1024
EMIT_FETCH_WORKERS: Final = 8
# A delay-queue bundle carries at most this many bytes of offloaded values (counted by
# their real size, not the pointer's): one SQS message is never hours of S3 reads.
BUNDLE_MAX_OFFLOADED_BYTES: Final = 8 * 1024 * 1024
# The emitter stops producing this long before the Kafka flush timeout would overrun its
# deadline, and sends what it did not produce back to the delay queue.
EMIT_RESERVE_SECONDS: Final = 2.0
# Longest back-off before a message whose delivery failed is received again (seconds).
EMIT_RETRY_MAX_SECONDS: Final = 60
# The scheduler's progress item holds one sort key (<= 1,024 bytes) per unfinished shard and
# must stay under DynamoDB's 400 KB item limit: 256 shards of 1 KB ids is about 270 KB.
MAX_SHARDS: Final = 256
# TTL may delete an item from its expiry time on, as DynamoDB's clock tells it: a due-second
# is counted as passed late when the scheduler passes it this close to (or after) its expiry,
# which covers any clock difference between a function and DynamoDB. It must stay below the
# TTL grace, or every second counts as late and every TTL removal is re-driven.
DEFAULT_TTL_CLOCK_MARGIN_SECONDS: Final = 300
# Late ranges are kept this long after the TTL of their last second (AWS documents TTL
# deletion "within a few days" of expiry): the cleanup function must still recognise them.
LATE_RANGE_KEEP_SECONDS: Final = 30 * 24 * 3600
# At most this many late ranges on the progress item; beyond it the oldest two are merged
# (which only widens what the cleanup function re-drives).
MAX_LATE_RANGES: Final = 64
MAX_ID_LENGTH: Final = 512
# DynamoDB's sort key holds at most 1,024 bytes; a stored message's adds a 9-byte version tag.
MAX_ID_BYTES: Final = 1000
# Key and headers stay inline even when the value is offloaded, so they get their own cap.
MAX_INLINE_KEY_AND_HEADERS_BYTES: Final = 64 * 1024

# AWS limits (documented service quotas).
SQS_MAX_DELAY_SECONDS: Final = 900
SQS_MAX_VISIBILITY_SECONDS: Final = 43200
# The longest a message may stay in a queue (the dead-letter queues keep them this long).
SQS_MAX_RETENTION_SECONDS: Final = 14 * 24 * 3600
# How long a message may still need its payload and its id's markers after its release time:
# the TTL grace (at most a day), TTL's own deletion lag (AWS: "within a few days"; 7 counted),
# the emitter's outage limit, the dead-letter queue's retention, and a day of margin. The
# template's PayloadRetention is the maximum delay plus this.
LIFE_AFTER_RELEASE_SECONDS: Final = (
    86400 + 7 * 86400 + DEFAULT_TARGET_OUTAGE_MAX_SECONDS + SQS_MAX_RETENTION_SECONDS + 86400
)
SQS_BATCH_ENTRIES: Final = 10
SQS_MAX_MESSAGE_BYTES: Final = 256 * 1024
# The sum of the bodies of one SendMessageBatch call (1 MiB on AWS since 2025; kept at the
# older 256 KiB, like the message limit, so that every endpoint accepts it).
SQS_MAX_BATCH_BYTES: Final = 256 * 1024
# SQS bills one request per 64 KiB chunk of a call's payload.
SQS_BILLING_CHUNK_BYTES: Final = 64 * 1024
DYNAMODB_BATCH_WRITE_ITEMS: Final = 25
DYNAMODB_BATCH_GET_KEYS: Final = 100

# DynamoDB item layout.
ATTR_PK: Final = "pk"
ATTR_SK: Final = "sk"
ATTR_TTL: Final = "expires_at"
# A message's key and value: plain bytes, or zlib-compressed under the second name when that
# is smaller (docs/internals.md).
ATTR_KEY: Final = "key"
ATTR_KEY_Z: Final = "key_z"
ATTR_VALUE: Final = "value"
ATTR_VALUE_Z: Final = "value_z"
STORE_ZLIB_LEVEL: Final = 6
KIND_MESSAGE: Final = "msg"
KIND_CANCEL: Final = "cancel"
KIND_WATERMARK: Final = "watermark"
# Where a message stored away from its due second waits (a release cap's slot), found by id.
KIND_LOCATOR: Final = "loc"
LOCATOR_PK_PREFIX: Final = "loc#"
ATTR_LOCATED_PK: Final = "at"
# ``at`` of a message ingest sent to the delay queue (indexed when the id index is on).
LOCATED_IN_QUEUE: Final = "queue"
# Where a release cap placed the messages of one due-second (those stored in a later second),
# grouped by a hash of the id: ``placed#<due second>#<group>``, one item per ingest batch and
# group holding ``[sort key, seconds after due]`` pairs. A reschedule naming the due time
# reads its id's group; a burst's thousand messages cost a few items, not a thousand.
KIND_PLACEMENT: Final = "placed"
PLACEMENT_PK_PREFIX: Final = "placed#"
PLACEMENT_GROUPS: Final = 64
PLACEMENT_MAX_ENTRIES: Final = 500
PLACEMENT_MAX_BYTES: Final = 64 * 1024
ATTR_PLACEMENTS: Final = "placed"
KIND_STATS: Final = "stats"
WATERMARK_PK: Final = "meta#watermark"
WATERMARK_SK: Final = "-"
# Watermark attributes: the last due-second fully sent, the progress inside the next one
# (partition key -> last sort key sent), and a random token that every write renews.
ATTR_WATERMARK_SECOND: Final = "second"
ATTR_WATERMARK_CURSORS: Final = "cursors"
ATTR_WATERMARK_TOKEN: Final = "token"  # noqa: S105 -- an attribute name
# The last due-second any run may have read (its window, recorded before its first Query), and
# the ranges of due-seconds passed after TTL may already have deleted some of their messages.
ATTR_WATERMARK_READING: Final = "reading"
ATTR_WATERMARK_LATE: Final = "late"
# A stored message: its delay-topic record's timestamp and the bytes of its offloaded value.
ATTR_TS: Final = "ts"
ATTR_OFFLOADED_BYTES: Final = "pb"
ATTR_TENANT: Final = "tenant"
ATTR_PRIORITY: Final = "priority"
ATTR_RELEASE_MS: Final = "release_ms"
ATTR_RELEASE_RANK: Final = "rk"
# A tenant counter's count of late messages that claimed its second first (strict caps).
ATTR_LATE_COUNT: Final = "l"
# A cancel marker: the latest cancel's record timestamp and coordinates.
ATTR_CANCEL_TS: Final = "cancel_ts"
ATTR_CANCEL_SRC: Final = "cancel_src"
# The record order of the marker's cancel / reschedule (``delayq.ordering.order_token``).
ATTR_CANCEL_ORDER: Final = "cancel_order"
CANCEL_PK_PREFIX: Final = "cancel#"
# The same marker item holds the latest reschedule of the id (its record's timestamp and
# coordinates, and the due time it moved the message to, for operators).
ATTR_RESCHEDULE_TS: Final = "moved_ts"
ATTR_RESCHEDULE_SRC: Final = "moved_src"
ATTR_RESCHEDULE_DUE_MS: Final = "moved_due_ms"
ATTR_RESCHEDULE_ORDER: Final = "moved_order"
# A copy made by a reschedule: the reschedule record it belongs to.
ATTR_MOVED_BY_TS: Final = "mts"
ATTR_MOVED_BY_SRC: Final = "msrc"
# A reschedule must be recorded this long (plus the emitter's hold, within which the emitter
# reads a message's markers) before the old due time: the clocks of two functions may differ,
# and the marker write takes time. Later, it is refused as too late.
RESCHEDULE_MARGIN_MS: Final = 2000
# Counters of the tenant limits: release slots per second, ingest quota per second.
RATE_PK_PREFIX: Final = "rate#"
QUOTA_PK_PREFIX: Final = "quota#"
KIND_COUNTER: Final = "counter"
# Counters are kept this long after their second (TTL), then DynamoDB removes them.
COUNTER_KEEP_SECONDS: Final = 24 * 3600
# A release cap spreads a tenant's messages over at most this many seconds past their due
# time; beyond it the cap is too low for the traffic, and those messages are rejected
# (quota-exceeded) with the reason.
MAX_RELEASE_SPREAD_SECONDS: Final = 7 * 24 * 3600
# Past full seconds, release-slot probes skip at most this many seconds at a time.
RELEASE_PROBE_MAX_STEP: Final = 64
# The emitter gives a late capped message a new slot within this many seconds of now (SQS's
# longest DelaySeconds); a tenant whose seconds are all taken that far ahead is tried again
# later rather than probed further in one batch.
CATCH_UP_SPREAD_SECONDS: Final = 900
STATS_PK_PREFIX: Final = "stats#"
# Pending counts (delayq.pending): one item per release minute and target, in one partition per
# UTC day, with the messages stored and queued for it and, per delay-topic partition, the
# highest offset already counted (so a redelivered batch is not counted twice).
PENDING_PK_PREFIX: Final = "pending#"
KIND_PENDING: Final = "pending"
ATTR_PENDING_STORED: Final = "s"
ATTR_PENDING_QUEUED: Final = "q"
ATTR_PENDING_OFFSET_PREFIX: Final = "o#"
# Kept this long after their minute (TTL): `delayq pending` shows what is overdue that long.
PENDING_KEEP_SECONDS: Final = 24 * 3600

# Tick queue.
TICK_GROUP_ID: Final = "ticks"

# The principal DynamoDB uses for TTL deletions in stream records.
TTL_PRINCIPAL: Final = "dynamodb.amazonaws.com"
