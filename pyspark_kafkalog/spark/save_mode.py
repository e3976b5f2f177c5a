"""The default save mode means append for ``format("kafkalog")``, as it does for Spark's Kafka sink.

Spark's Kafka sink accepts Append and ErrorIfExists (Spark's default mode) and treats both as an
append, so ``df.write.format("kafka").option(...).save()`` works without ``mode``. PySpark 4.3
refuses ErrorIfExists for every Python data source, in the JVM, before the source sees the write
(``[UNSUPPORTED_DATA_SOURCE_SAVE_MODE]``); a Python data source only learns ``overwrite`` or not.

So :func:`install` (called by ``pyspark_kafkalog.register``) wraps ``DataFrameWriter.save`` (of
the session's kind: classic or Spark Connect) in the driver: when the writer's format is ``kafkalog`` and its mode is unset,
``error``, ``errorifexists`` or ``default``, the write goes to Spark as an append. Nothing else
changes: other formats keep Spark's behaviour, Overwrite still reaches the sink (which refuses it:
a log is append-only), and Ignore is still refused by Spark, as Spark's Kafka sink refuses it.
Why a class patch and not something narrower: PySpark 4.3 offers a Python data source no hook
before the JVM checks the save mode, and a writer's format is known only when ``format()`` or
``save(format=...)`` is called, after the writer exists; the wrappers therefore only record the
format, mode and options a writer is given and pass every call through unchanged unless the
format is ``kafkalog``.
The same wrapper makes the writer's session the thread's active one (``_activate``), so that
writes from a thread pool find the format, and (classic PySpark) writes a coalesced DataFrame
when the write should run on fewer tasks (``write_tasks``: ``maxTasks``): it then replays the
writer's format, mode and options on a writer of the coalesced DataFrame. A writer given
``partitionBy``, ``bucketBy`` or ``sortBy`` is left as it is, so that Spark still refuses those.
"""
from __future__ import annotations

import functools

FORMAT = "kafkalog"
# the names Spark's SaveMode parser gives ErrorIfExists
ERROR_IF_EXISTS = frozenset({"error", "errorifexists", "default"})


def install(session=None) -> None:
    """Wrap the DataFrameWriter class of ``session``'s kind, classic or Spark Connect; with no
    session, both that this PySpark has (idempotent).

    Connect's client is imported only for a Connect session: importing it in a process without
    its dependencies (pandas) runs PySpark's doctest guard, which exits the interpreter with
    status 0, so ``register`` in a plain ``python -c`` script would end the script silently."""
    if session is None or not is_connect(session):
        from pyspark.sql.readwriter import DataFrameWriter
        _wrap(DataFrameWriter, coalesce=True)
    if session is not None and not is_connect(session):
        return
    try:
        from pyspark.sql.connect.readwriter import DataFrameWriter as ConnectDataFrameWriter
    except ImportError:            # Spark Connect's client dependencies are not installed
        return
    _wrap(ConnectDataFrameWriter, coalesce=False)


def is_connect(session) -> bool:
    """Whether ``session`` is a Spark Connect session, told without importing Connect."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def append_instead(source, mode) -> bool:
    """Whether a save with this format and mode is one Spark's Kafka sink would append."""
    return (isinstance(source, str) and source.lower() == FORMAT
            and (mode is None or (isinstance(mode, str) and mode.lower() in ERROR_IF_EXISTS)))


def _activate(writer) -> None:
    """Make the writer's session the thread's active one in the JVM. PySpark 4.3 looks a
    Python data source up for a write in the thread's active session, which a thread other
    than the one that made the session does not have: without this, ``df.write`` of a
    registered format fails with DATA_SOURCE_NOT_FOUND in a thread pool (reads are not
    affected)."""
    session = getattr(writer, "_spark", None)
    jsession = getattr(session, "_jsparkSession", None)
    if jsession is None:           # Spark Connect: the server resolves the source
        return
    session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def _recorded(writer) -> dict:
    if "_kafkalog_options" not in writer.__dict__:
        writer._kafkalog_options = {}
    return writer._kafkalog_options


def _coalesced_writer(writer, source, mode, options):
    """A writer of the writer's DataFrame coalesced for the write (``write_tasks``), with the
    same format, mode and options; None when the DataFrame is to be written as it is."""
    from .write_tasks import coalesced
    df = getattr(writer, "_df", None)
    if df is None or getattr(writer, "_kafkalog_layout", False):
        return None
    recorded = dict(_recorded(writer))
    every = dict(recorded, **{k: v for k, v in options.items() if v is not None})
    target = coalesced(df, every)
    if target is df:
        return None
    new = type(writer)(target)
    new.format(source)
    if mode is not None:
        new.mode(mode)
    new.options(**recorded)
    return new


def _wrap(cls, coalesce: bool) -> None:
    if getattr(cls, "_kafkalog_save_mode", False):
        return
    original_format, original_mode, original_save = cls.format, cls.mode, cls.save
    original_option, original_options = cls.option, cls.options

    @functools.wraps(original_option)
    def option(self, key, value):
        _recorded(self)[key] = value
        return original_option(self, key, value)

    @functools.wraps(original_options)
    def options(self, **opts):
        _recorded(self).update(opts)
        return original_options(self, **opts)

    for name in ("partitionBy", "bucketBy", "sortBy"):   # layouts the sink does not take
        original = getattr(cls, name, None)
        if original is not None:
            setattr(cls, name, _marking(original))

    @functools.wraps(original_format)
    def format(self, source):
        self._kafkalog_source = source
        return original_format(self, source)

    @functools.wraps(original_mode)
    def mode(self, saveMode):
        if saveMode is not None:
            self._kafkalog_mode = saveMode
        return original_mode(self, saveMode)

    @functools.wraps(original_save)
    def save(self, path=None, format=None, mode=None, partitionBy=None, **options):
        source = format if format is not None else getattr(self, "_kafkalog_source", None)
        current = mode if mode is not None else getattr(self, "_kafkalog_mode", None)
        if append_instead(source, current):
            mode = "append"
        if isinstance(source, str) and source.lower() == FORMAT:
            _activate(self)
            if coalesce and partitionBy is None:
                writer = _coalesced_writer(self, source, mode if mode is not None else current,
                                           options)
                if writer is not None:
                    return original_save(writer, path, format, mode, partitionBy, **options)
        return original_save(self, path, format, mode, partitionBy, **options)

    cls.format, cls.mode, cls.save = format, mode, save
    cls.option, cls.options = option, options
    cls._kafkalog_save_mode = True


def _marking(original):
    @functools.wraps(original)
    def wrapper(self, *args, **kw):
        self._kafkalog_layout = True
        return original(self, *args, **kw)
    return wrapper
