"""How a deliberate kafkalog error leaves a Spark entry point: as the first line a user reads.

Spark reports what a Python data source raises inside its own message, and by default that
message goes on with ``Traceback (most recent call last):`` and our frames; the line that says
what is wrong comes last (and a task's failure is logged with a Java stack under it). For a
:class:`KafkaLogError` the frames add nothing: it is raised on purpose, and its message names the
file, option or offset and what to run. So at each entry point Spark calls, such an error gets
Kafka's error name and code at the front of its message, and the failing worker formats it as
one line, with PySpark's own switch for that (``SPARK_HIDE_TRACEBACK``, which
``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets for every error). Setting it in
the worker touches nothing else: PySpark's workers exit right after reporting an exception.

``KAFKALOG_TRACEBACK=1`` in the workers' environment keeps the frames (the environment Spark
starts them with: the driver's in local mode, ``spark.executorEnv.KAFKALOG_TRACEBACK`` for
executors). The session's ``simplifiedTraceback`` setting cannot say it, because the streaming
source's worker is not told that setting. Errors that are not ours (bugs) always keep theirs.
"""
from __future__ import annotations

import functools
import inspect
import os

from ..errors import KafkaLogError

#: the methods of PySpark's DataSource, reader and writer classes that Spark calls
ENTRY_POINTS = frozenset({
    "schema", "reader", "streamReader", "writer", "streamWriter",
    "partitions", "read", "pushFilters",
    "initialOffset", "latestOffset", "reportLatestOffset", "prepareForTriggerAvailableNow",
    "getDefaultReadLimit", "write", "commit", "abort"})


def headline(err: KafkaLogError) -> str:
    """The message with Kafka's error name and code in front, as Kafka's tools print them."""
    message = str(err)
    prefix = f"{err.error_name} ({err.error_code}): "
    return message if message.startswith(prefix) else prefix + message


def _surface(err: KafkaLogError) -> None:
    if len(err.args) <= 1:
        err.args = (headline(err),)
    if os.environ.get("KAFKALOG_TRACEBACK", "") in ("", "0"):
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def _guarded(items):
    try:
        yield from items
    except KafkaLogError as err:
        _surface(err)
        raise


def surfaced(fn):
    """``fn`` (a function, a generator function or one that returns an iterator), reporting
    a :class:`KafkaLogError` as described above, also one raised while its result is read."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except KafkaLogError as err:
            _surface(err)
            raise
        return _guarded(result) if inspect.isgenerator(result) else result
    return call


def surfaces_errors(cls):
    """Class decorator: :func:`surfaced` on each of Spark's entry points that ``cls`` defines
    itself (inherited ones are already wrapped)."""
    for name in ENTRY_POINTS & cls.__dict__.keys():
        setattr(cls, name, surfaced(cls.__dict__[name]))
    return cls


def failed_stream_reader(err: KafkaLogError):
    """A stream reader that raises ``err`` at Spark's first call, for an error met while
    building the real one. Why not raise it at once: PySpark 4.3's streaming source worker
    calls ``reader.stop()`` in a ``finally`` even when ``streamReader()`` raised, and that
    ``UnboundLocalError`` is what the query then reports, with ours hidden under it."""
    from pyspark.sql.datasource import DataSourceStreamReader

    def fail(self, *args, **kwargs):
        _surface(err)
        raise err

    methods = {name: fail for name in ("initialOffset", "latestOffset", "partitions", "read",
                                       "commit", "getDefaultReadLimit", "reportLatestOffset",
                                       "prepareForTriggerAvailableNow")}
    methods["stop"] = lambda self: None
    return type("FailedStreamReader", (DataSourceStreamReader,), methods)()
