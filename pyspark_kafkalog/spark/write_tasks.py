"""How many Spark tasks a ``df.write.format("kafkalog")`` runs: at most the session's cores.

Every task writes a segment, three files, to every Kafka partition its rows reach, so a job's
files grow with tasks x partitions: a DataFrame of 4 partitions written to a topic of 1,000 makes
4,000 segments. Tasks beyond the cores only run in later waves, so merging them into one task
per core (``coalesce``: no shuffle, each input partition still read whole and in order) keeps
the parallelism and writes cores x partitions segments instead. This is Spark's JDBC sink's
``numPartitions`` rule, under a name that cannot be taken for the topic's partition count.

Not under dynamic allocation, where the cores a session has when the write starts say little
about the cores it will get; an explicit ``maxTasks`` still applies there. A Python data
source cannot change its input's partitioning, so the driver applies this to the DataFrame
before Spark plans the write (``save_mode``'s wrapper of ``DataFrameWriter.save``).
"""
from __future__ import annotations

import logging
from typing import Mapping, Optional

from ..config_def import parse_bool
from .write_options import max_tasks

log = logging.getLogger(__name__)


def write_tasks(spark, options: Mapping[str, object]) -> Optional[int]:
    """The task count to coalesce a write to, or None to leave the DataFrame as it is."""
    n = max_tasks(options)
    if n is not None:
        return n or None
    conf = spark.sparkContext.getConf()
    if parse_bool("spark.dynamicAllocation.enabled",
                  conf.get("spark.dynamicAllocation.enabled", "false")):
        return None
    return max(1, int(spark.sparkContext.defaultParallelism))


def coalesced(df, options: Mapping[str, object]):
    """``df`` coalesced to :func:`write_tasks` tasks (a DataFrame with fewer partitions keeps
    them: coalesce never adds any), or ``df`` itself."""
    n = write_tasks(df.sparkSession, options)
    if n is None:
        return df
    own = _own_coalesce(df)
    if own is not None and own <= n:
        return df   # Spark would merge the two coalesces into ours, undoing a smaller one
    log.debug("kafkalog write: at most %d tasks (maxTasks)", n)
    return df.coalesce(n)


def _own_coalesce(df) -> Optional[int]:
    """The task count of a ``coalesce`` the DataFrame's own plan ends with (under nodes of one
    child: projections, filters, ...), or None. Why: Spark's optimizer replaces a coalesce
    directly over another one by the outer one (CollapseRepartition), so ``coalesce(2)`` over a
    user's ``coalesce(1)`` would write with 2 tasks where the user asked for 1."""
    try:
        node = df._jdf.queryExecution().optimizedPlan()
        while True:
            if node.nodeName() == "Repartition" and not node.shuffle():
                return int(node.numPartitions())
            if node.children().size() != 1:
                return None
            node = node.children().apply(0)
    except Exception:   # not a classic DataFrame, or a plan this cannot walk: leave it be
        return 0
