"""The ``kafkalog`` data source: Spark's Kafka connector schema and options, over Kafka's log
format on storage. Thin by design: planning and I/O live in the layers below."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource

from .options import ReadOptions, WriteOptions
from .schema import kafka_schema


class KafkaLogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    def schema(self):
        return kafka_schema(ReadOptions.parse(self.options, validate=False).include_headers)

    def reader(self, schema):
        from .reader import KafkaLogReader
        return KafkaLogReader(ReadOptions.parse(self.options), schema)

    def writer(self, schema, overwrite: bool):
        from .writer import KafkaLogWriter
        return KafkaLogWriter(WriteOptions.parse(self.options), schema, overwrite)


class KafkaLogPushdownDataSource(KafkaLogDataSource):
    """``kafkalog`` with filter pushdown (see ``reader.KafkaLogPushdownReader`` for why opt-in)."""

    def reader(self, schema):
        from .reader import KafkaLogPushdownReader
        return KafkaLogPushdownReader(ReadOptions.parse(self.options), schema)
