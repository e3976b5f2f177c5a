"""pyspark-kafkalog: Kafka's on-disk log format on shared storage, for Spark, without brokers."""

__version__ = "0.1.0"
