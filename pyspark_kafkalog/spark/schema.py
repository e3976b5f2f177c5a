"""The schema of the ``kafkalog`` source: Spark's Kafka connector's, so that jobs move between
the two unchanged. Its own module because the data source (``schema()``) and the reader (which
refuses any other schema) both need it, and the data source imports the reader."""
from __future__ import annotations

from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)


def kafka_schema(include_headers: bool = False) -> StructType:
    """Exactly the schema of Spark's built-in Kafka source."""
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)
