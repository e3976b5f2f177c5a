"""A real power cut of a real file system (docs/protocol.md §3, "Durability"): the cluster lives
on an ext4 image attached as a loop device; a writer process produces to a topic with Kafka's
default configs and to one with ``flush.messages=1``, printing each commit it was acknowledged;
at a random moment the writer is stopped and the image file is copied. The copy holds what the
device held then, and nothing of the kernel's page cache above it: mounted (the journal replayed),
it is the file system after a power cut at that moment.

Then every acknowledged record of the flushed topic reads back, byte for byte; the default
topic's may be lost, but never read back wrong: reads raise typed errors, ``repair`` reports what
it lost, and every record read afterwards is the one the writer wrote at that offset.

Needs root, ``losetup`` and ``mount`` (the kernel's loop driver and ext4); skipped elsewhere.
``KAFKALOG_POWER_CUTS`` sets how many cuts to try (default 2).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import CorruptRecordError, OffsetOutOfRangeError

CUTS = int(os.environ.get("KAFKALOG_POWER_CUTS", "2"))
TOPICS = {"plain": {}, "flushed": {"flush.messages": "1"}}

WRITER = r"""
import sys
from pyspark_kafkalog.admin import Admin
a = Admin(sys.argv[1])
i = 0
while True:
    for topic in ("plain", "flushed"):
        p = i % 2
        recs = [(b"k", b"%s-%d-%d-%d" % (topic.encode(), p, i, j) * 8) for j in range(20)]
        placed = a.produce(topic, recs, partition=p)
        print(topic, p, placed[0].offset, i, flush=True)   # acknowledged: committed
    i += 1
"""


def _run(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _can_mount() -> bool:
    if os.geteuid() != 0 or not (shutil.which("losetup") and shutil.which("mount")
                                 and shutil.which("mkfs.ext4")):
        return False
    return True


pytestmark = [pytest.mark.skipif(not _can_mount(), reason="needs root, losetup, mount and "
                                                          "mkfs.ext4 (a loop-mounted ext4)"),
              pytest.mark.slow]   # a loop-mounted file system's power cut (as root)


class Mounted:
    def __init__(self, image, where, options="commit=600"):
        self.device = _run("losetup", "-f", "--show", str(image))
        try:
            _run("mount", "-o", options, self.device, str(where))
        except BaseException:
            _run("losetup", "-d", self.device)
            raise
        self.where = where

    def close(self):
        subprocess.run(["umount", str(self.where)], check=False)
        subprocess.run(["losetup", "-d", self.device], check=False)


def _expected(topic, p, i):
    return [b"%s-%d-%d-%d" % (topic.encode(), p, i, j) * 8 for j in range(20)]


@pytest.mark.parametrize("cut", range(CUTS))
def test_a_power_cut_loses_no_flushed_write_and_never_returns_wrong_bytes(tmp_path, cut):
    image, copy = tmp_path / "disk.img", tmp_path / "after-the-cut.img"
    (tmp_path / "m1").mkdir()
    (tmp_path / "m2").mkdir()
    with open(image, "wb") as f:
        f.truncate(128 << 20)
    _run("mkfs.ext4", "-q", "-F", str(image))
    disk = Mounted(image, tmp_path / "m1")
    try:
        root = str(tmp_path / "m1" / "c")
        admin = Admin(root)
        for topic, configs in TOPICS.items():
            admin.create_topic(topic, 2, configs=configs)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, root], stdout=subprocess.PIPE,
                                  text=True)
        acked = []
        try:
            stop_after = random.Random(cut).randint(6, 30)
            while len(acked) < stop_after:
                line = writer.stdout.readline()
                assert line, "the writer died"
                acked.append(line.split())
            writer.send_signal(signal.SIGSTOP)        # nothing more reaches the device ...
            time.sleep(0.05)
            shutil.copyfile(image, copy)              # ... while the device is copied
        finally:
            writer.kill()
            writer.wait()
    finally:
        disk.close()
    after = Mounted(copy, tmp_path / "m2", options="errors=remount-ro")
    try:
        admin = Admin(str(tmp_path / "m2" / "c"))
        want = {}                                     # (topic, p) -> {offset: value}
        for topic, p, first, i in acked:
            values = _expected(topic, int(p), int(i))
            want.setdefault((topic, int(p)), {}).update(
                {int(first) + j: v for j, v in enumerate(values)})
        for p in range(2):                            # flushed: every acknowledged record
            got = {r.offset: r.value for r in admin.consume("flushed", p)}
            assert {o: got.get(o) for o in want.get(("flushed", p), {})} == \
                want.get(("flushed", p), {})
        lost = {}
        for p in range(2):                            # default: typed errors, then repair
            try:
                list(admin.consume("plain", p))
            except (CorruptRecordError, OffsetOutOfRangeError) as exc:
                assert f"plain-{p}" in str(exc)
        for report in admin.repair_partition("plain"):
            lost[report.partition] = {o for r in report.lost
                                      for o in range(r.first_offset, r.last_offset + 1)}
        for p in range(2):
            got = {r.offset: r.value for r in admin.consume("plain", p)}
            for offset, value in got.items():         # never wrong bytes
                assert want[("plain", p)].get(offset, value) == value, offset
            missing = set(want.get(("plain", p), {})) - set(got)
            assert missing <= lost.get(p, set()), sorted(missing - lost.get(p, set()))[:5]
        print(json.dumps({"acked": len(acked), "plain_lost": {p: len(v) for p, v in
                                                             lost.items()}}))
    finally:
        after.close()
