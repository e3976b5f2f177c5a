"""pyspark-kafkalog: Kafka's on-disk log format on shared storage, for Spark, without brokers."""

__version__ = "0.1.0"


def __getattr__(name):
    """``DefaultSource``: what PySpark 4 registers by itself, at a session's first data-source
    call, for every importable module named ``pyspark_*`` (``lookup_data_sources``), so that
    ``format("kafkalog")`` works without :func:`register`. Looked up only then: importing this
    package (the CLI, the admin API, that lookup's own worker) loads no Spark code."""
    if name == "DefaultSource":
        from .spark.datasource import KafkaLogDataSource
        return KafkaLogDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark, *, filter_pushdown: bool = False) -> None:
    """Register the ``kafkalog`` format with a SparkSession. PySpark 4 finds the format by
    itself (``DefaultSource`` above); this adds what only a call in the session can: the
    session's file-packing settings for planning reads (``spark.sql.files.maxPartitionBytes``,
    ``openCostInBytes``, ``minPartitionNum``: a planner worker cannot read the session's conf),
    the default save mode, and filter pushdown.

    ``filter_pushdown=True`` also turns on ``spark.sql.python.filterPushdown.enabled`` and
    registers the reader that pushes filters on ``topic``, ``partition``, ``offset`` and
    ``timestamp`` down to the offset and time indexes (it reads only the selected ranges). It is
    opt-in because PySpark 4.3 reuses a pushed-down read plan for a later scan of the same
    DataFrame object that pushes no filter, which returns too few rows; with it on, create a new
    DataFrame for each query (docs/user-guide.md).

    It also makes Spark's default save mode (ErrorIfExists) an append for this format, as Spark's
    Kafka sink treats it, which PySpark alone refuses for a Python data source
    (``spark/save_mode.py``).
    """
    from .spark import save_mode
    from .spark.datasource import KafkaLogDataSource, KafkaLogPushdownDataSource
    save_mode.install(spark)
    if filter_pushdown:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
        spark.dataSource.register(KafkaLogPushdownDataSource.for_session(spark))
    else:
        spark.dataSource.register(KafkaLogDataSource.for_session(spark))
