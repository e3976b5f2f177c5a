"""pyspark-kafkalog: Kafka's on-disk log format on shared storage, for Spark, without brokers."""

__version__ = "0.1.0"


def register(spark) -> None:
    """Register the ``kafkalog`` format with a SparkSession: the one line users add."""
    from .spark.datasource import KafkaLogDataSource
    spark.dataSource.register(KafkaLogDataSource)
