"""Child process of tests/system/test_compaction_crash.py: a log cleaner of one compacted
partition, to be killed with SIGKILL.

    python compaction_child.py clean  ROOT TOPIC CRASH_AT BACKOFF_S
    python compaction_child.py repair ROOT TOPIC AHEAD_S

``clean``: ``clean_partition(force=True)`` in a loop (the topic's ``file.delete.delay.ms``),
``BACKOFF_S`` between passes (``log.cleaner.backoff.ms``: a covering file must get older than
the delay before what it covers goes), one JSON line per pass ({"pass": n, "cleaned": ..., "cleaned_to": ..., "deleted": ..., "rebuilt":
...}). ``CRASH_AT`` is ``random`` (the parent kills it whenever it likes) or ``POINT:N``: the
process kills itself with SIGKILL the Nth time it reaches POINT, after printing {"dying":
POINT}:

  entry      right after the clean_segments entry applied (nothing published yet)
  marker     after the ``<base>.merging`` marker was written
  log-part   while the cleaned ``.log`` is being written (its first piece produced)
  log        after the cleaned ``.log`` replaced the old one (old indexes still there)
  timeindex  after the ``.timeindex`` replace, before the ``.index`` one
  index      after both indexes, before the marker is deleted
  delete     after a covered segment's ``.log`` was deleted, before its indexes

The points are reached through the storage and cluster objects the cleaner is handed (wrapped
here, in the child only): the library is not changed for them.

``repair``: one fresh pass as a later cleaner, its clock ``AHEAD_S`` seconds ahead of the
storage's (so that a dead cleaner's marker is past the publish window and its margin), with
no file delete delay, then ``Admin.cleanup`` (indexes a dead deleter left without their
``.log``); prints {"repair": {...}} and exits 0.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.log import segment_merge as SM
from pyspark_kafkalog.maintenance.compaction import clean_partition


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _die(point: str) -> None:
    emit({"dying": point})
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(admin: Admin, crash_at: str) -> None:
    if crash_at == "random":
        return
    point, _, nth = crash_at.partition(":")
    left = [int(nth or 1)]
    storage, cluster = admin.cluster.storage, admin.cluster

    def reached(p: str) -> None:
        if p == point:
            left[0] -= 1
            if left[0] <= 0:
                _die(p)
    real_submit, real_replace = cluster.submit, storage.replace
    real_stream, real_delete = storage.publish_stream, storage.delete

    def submit(actions, *a, **kw):
        out = real_submit(actions, *a, **kw)
        if any(getattr(x, "OP", "") == "clean_segments" for x in actions) and out[2][0].ok:
            reached("entry")
        return out

    def replace(path, data, *a, **kw):
        real_replace(path, data, *a, **kw)
        if path.endswith(SM.MERGING_SUFFIX):
            reached("marker")
        elif path.endswith(".timeindex"):
            reached("timeindex")
        elif path.endswith(".index"):
            reached("index")

    def publish_stream(path, chunks, *a, **kw):
        def pieces():
            for i, piece in enumerate(chunks):
                yield piece
                if i == 0 and path.endswith(".log"):
                    reached("log-part")
        real_stream(path, pieces(), *a, **kw)
        if path.endswith(".log"):
            reached("log")

    def delete(path, *a, **kw):
        real_delete(path, *a, **kw)
        if path.endswith(".log"):
            reached("delete")
    cluster.submit, storage.replace = submit, replace
    storage.publish_stream, storage.delete = publish_stream, delete


def clean(root: str, topic: str, crash_at: str, backoff_s: str) -> None:
    admin = Admin(root, create=False)
    _arm(admin, crash_at)
    n = 0
    while True:
        out = clean_partition(admin.cluster, admin.cluster.state(), topic, 0, force=True)
        n += 1
        emit({"pass": n, "cleaned": out.cleaned, "cleaned_to": out.cleaned_to,
              "deleted": len(out.deleted), "rebuilt": len(out.rebuilt), "skipped": out.skipped})
        time.sleep(float(backoff_s))


def repair(root: str, topic: str, ahead_s: str) -> None:
    admin = Admin(root, create=False)
    cluster = admin.cluster
    state = cluster.state()
    d = cluster.partition_dir(topic, 0, state=state)
    now_s = cluster.storage.clock(d.partition("/")[0]) + float(ahead_s)
    out = clean_partition(cluster, state, topic, 0, force=True, now_s=now_s, delay_ms=0)
    garbage = admin.cleanup()
    emit({"repair": {"cleaned": out.cleaned, "cleaned_to": out.cleaned_to,
                     "deleted": out.deleted, "rebuilt": out.rebuilt, "skipped": out.skipped,
                     "garbage": garbage}})


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"clean": clean, "repair": repair}[mode](*args)
