"""Shared plumbing for the spark-submit jobs: the session, and fanning work out per partition.

The rules themselves live in ``pyspark_kafkalog.maintenance.retention``; the jobs only hand them a
``fan_out`` that runs on Spark. What it runs is a ``PartitionWork``, which travels as the cluster
URL and a snapshot of the driver's state: every task sees exactly the metadata the driver
planned against, and none of them replays the metadata log.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Callable, List, Sequence, Tuple, TypeVar

T = TypeVar("T")


def _ship_this_module_by_value() -> None:
    """Executors cannot import ``jobs/_common.py``; let cloudpickle send its code along."""
    try:
        from pyspark import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    except Exception:   # pragma: no cover - very old pyspark
        pass


_ship_this_module_by_value()


def spark_session(app_name: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    return SparkSession.builder.appName(app_name).getOrCreate()


def spark_fan_out(spark, min_items_for_spark: int):
    """The ``fan_out(items, fn)`` that maintenance's rules take: Spark when there are many."""
    return lambda items, fn: fan_out(spark, items, fn, min_items_for_spark)


def fan_out(spark, items: Sequence[Tuple[str, int]], fn: Callable[[List[Tuple[str, int]]], List[T]],
            min_items_for_spark: int) -> List[T]:
    """Run ``fn`` over groups of partitions: on the executors when there are many, else here."""
    items = list(items)
    if spark is None or len(items) < min_items_for_spark:
        return fn(items)
    sc = spark.sparkContext
    slices = max(1, min(len(items), sc.defaultParallelism * 4))
    return sc.parallelize(items, slices).mapPartitions(lambda it: fn(list(it))).collect()


def partition_pass(name: str, rule, url: str, *, topics=None, spark=None,
                   min_partitions_for_spark: int = 64, **options) -> list:
    """A pass of ``rule`` (``merge_segments``, ``compact``: a rule over ``partitions`` that
    takes ``offline`` and ``fan_out``) over the cluster's partitions, or those of ``topics``:
    what each partition's pass did, as dicts. A log dir that could not be reached raises
    ``OfflineLogDirError`` once the rest is done; its ``done`` holds those dicts then."""
    from dataclasses import asdict
    from pyspark_kafkalog.cluster.cluster import Cluster
    from pyspark_kafkalog.maintenance.retention import offline_error
    cluster = Cluster(url, create=False)
    tps = [tp for tp in cluster.partitions(cluster.state()) if not topics or tp[0] in topics]
    offline = {}
    done = [asdict(r) for r in rule(cluster, partitions=tps, offline=offline,
                                    fan_out=spark_fan_out(spark, min_partitions_for_spark),
                                    **options)]
    if offline:
        raise offline_error(name, offline, [], done)
    return done


def run_and_report(name: str, run, summary: Callable[[list], str]) -> int:
    """A maintenance job's main: ``run()``, then :func:`report` of what it did, the log dirs
    it could not reach last (the rest was done)."""
    from pyspark_kafkalog.errors import OfflineLogDirError
    offline = None
    try:
        done = run()
    except OfflineLogDirError as exc:
        done, offline = exc.done, exc
    return report(name, done, summary(done), offline)


def report(name: str, rows, summary: str, offline) -> int:
    """A maintenance job's end: one JSON line per row on stdout, the summary on stderr, then
    the offline log dirs' error (the rest was done) and its exit status."""
    import json
    for row in rows:
        print(json.dumps(row))
    print(f"{name}: {summary}", file=sys.stderr)
    if offline is not None:
        print(f"{name}: error: {offline.error_name}: {offline}", file=sys.stderr)
        return 1
    return 0


# -- the quickstarts ---------------------------------------------------------------------------

QUICKSTART_MARK = ".kafkalog-quickstart"


def start_afresh(path: str) -> None:
    """Delete what a quickstart left at ``path``: only a directory a quickstart made (it holds
    ``QUICKSTART_MARK``), so that a mistyped ``--cluster`` never deletes anything else."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, QUICKSTART_MARK)):
        sys.exit(f"{path} exists and was not made by a quickstart: pass --keep to use it as it "
                 "is, or another --cluster")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    open(os.path.join(path, QUICKSTART_MARK), "w").close()
