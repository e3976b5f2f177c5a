"""Freeze a reused Python worker's long-lived objects out of the cyclic garbage collector.

Why. PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker
(``pyspark/daemon.py``), between the end of one task and the start of the next. A worker that
has imported PySpark, pyarrow, numpy and this package holds some 60,000 tracked objects (the
modules, their functions and classes), and each of those collections walks them all, taking
about as long as the sink's own work on a task (docs/performance.md), on the path from one wave
of tasks to the next. Those objects live as long as the process, so the collector never frees any
of them.

What. Once per process, before its first kafkalog task: one full collection (so that no cyclic
garbage is frozen, which would leak), then ``gc.freeze()``, which moves every object alive into
a permanent generation that collections skip. The daemon's collections then take well under a
millisecond. Objects created afterwards are collected as before; objects frozen are still freed
by reference counting when the last reference goes. It affects the whole worker process (other
data sources and UDFs run in it too), so ``KAFKALOG_GC_FREEZE=false`` in the workers'
environment (``spark.executorEnv.KAFKALOG_GC_FREEZE``, or the environment of a local session)
turns it off.
"""
from __future__ import annotations

import gc
import os

ENV = "KAFKALOG_GC_FREEZE"
_done = False


def enabled() -> bool:
    return os.environ.get(ENV, "true").strip().lower() not in ("0", "false", "no", "off")


def freeze_once() -> bool:
    """Collect and freeze, the first time in this process (and if enabled); whether it did."""
    global _done
    if _done or not enabled() or not hasattr(gc, "freeze"):
        return False
    _done = True
    gc.collect()
    gc.freeze()
    return True
