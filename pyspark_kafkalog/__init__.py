"""pyspark-kafkalog: Kafka's on-disk log format on shared storage, for Spark, without brokers."""

__version__ = "0.1.0"


def register(spark) -> None:
    """Register the ``kafkalog`` format with a SparkSession: the one line users add.

    It also turns on ``spark.sql.python.filterPushdown.enabled``: the source pushes filters on
    ``topic``, ``partition``, ``offset`` and ``timestamp`` down to the offset and time indexes,
    and Spark refuses to plan a Python source that implements ``pushFilters`` without it.
    """
    from .spark.datasource import KafkaLogDataSource
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(KafkaLogDataSource)
