"""Options of the ``kafkalog`` format (Spark's Kafka connector names where the meaning is the
same); reading and writing each have their own module."""
from .read_options import ReadOptions  # noqa: F401
from .write_options import WriteOptions  # noqa: F401
