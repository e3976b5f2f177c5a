"""The ``kafkalog`` data source: Spark's Kafka connector schema and options, over Kafka's log
format on storage. Thin by design: planning and I/O live in the layers below."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource

from ..errors import KafkaLogError
from .read_options import ReadOptions
from .write_options import WriteOptions
from .schema import kafka_schema
from .surface import failed_stream_reader, surfaces_errors


@surfaces_errors
class KafkaLogDataSource(DataSource):
    #: ``read_options.session_defaults`` of the session ``register`` ran in
    session: dict = {}

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    @classmethod
    def for_session(cls, spark):
        """This class with the session's defaults: a subclass Spark pickles by value, so that
        the planner worker (which cannot read the session's conf) gets them."""
        from .read_options import session_defaults
        return type(cls.__name__, (cls,), {"session": session_defaults(spark),
                                           "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__ + "ForSession"})

    def schema(self):
        return kafka_schema(ReadOptions.parse(self.options, validate=False).include_headers)

    def reader(self, schema):
        from .reader import KafkaLogReader
        return KafkaLogReader(ReadOptions.parse(self.options, session=self.session), schema)

    def streamReader(self, schema):
        from .stream_reader import KafkaLogStreamReader
        try:
            return KafkaLogStreamReader(ReadOptions.parse(self.options, session=self.session,
                                                          streaming=True), schema)
        except KafkaLogError as err:
            return failed_stream_reader(err)

    def writer(self, schema, overwrite: bool):
        from .writer import KafkaLogWriter
        return KafkaLogWriter(WriteOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .stream_writer import KafkaLogStreamWriter
        return KafkaLogStreamWriter(WriteOptions.parse(self.options, streaming=True), schema,
                                    overwrite)


@surfaces_errors
class KafkaLogPushdownDataSource(KafkaLogDataSource):
    """``kafkalog`` with filter pushdown (see ``reader.KafkaLogPushdownReader`` for why opt-in)."""

    def reader(self, schema):
        from .reader import KafkaLogPushdownReader
        return KafkaLogPushdownReader(ReadOptions.parse(self.options, session=self.session),
                                      schema)
