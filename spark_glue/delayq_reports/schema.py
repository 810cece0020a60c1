"""The read schema of a DynamoDB export line: ``{"Item": {<attribute>: {<type>: <value>}}}``.

Only the attributes the reports use are declared, so the JSON reader skips the rest (keys,
values and headers of messages are never materialised) and no schema inference pass runs.
Numbers arrive as strings (DynamoDB JSON); the decoders in `transforms` cast them.
"""

from __future__ import annotations

from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType


def _typed(type_key: str) -> StructType:
    return StructType([StructField(type_key, StringType())])


S = _typed("S")
N = _typed("N")

TARGET_STATS = StructType(
    [
        StructField(
            "M",
            StructType(
                [
                    StructField("messages", N),
                    StructField("early", N),
                    StructField("late_sum_ms", N),
                    StructField("late_min_ms", N),
                    StructField("late_max_ms", N),
                    StructField("hist", StructType([StructField("L", ArrayType(N))])),
                ]
            ),
        )
    ]
)

ITEM = StructType(
    [
        StructField("pk", S),
        StructField("sk", S),
        StructField("kind", S),
        # msg
        StructField("due_ms", N),
        StructField("target", S),
        StructField("tenant", S),
        StructField("size", N),
        # watermark
        StructField("second", N),
        # stats
        StructField("minute", N),
        StructField("bounds_ms", S),
        StructField("targets", StructType([StructField("M", MapType(StringType(), TARGET_STATS))])),
    ]
)

EXPORT_LINE = StructType([StructField("Item", ITEM)])
