"""Long CLI operations show progress on a terminal and nothing more on a pipe or with --json:
real ``kafkalog`` processes whose stderr is a pseudo-terminal (``pty``) or a pipe."""
from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from support.cli_support import REPO, run_cli
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.progress import observed, tracked

PARTITIONS = 120


def on_a_terminal(*argv):
    """``kafkalog ARGV`` with stderr on a pseudo-terminal and stdout on a pipe:
    (exit status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:            # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read()
    proc.wait(timeout=120)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_create_repair_verify_and_cleanup_draw_bars_on_a_terminal(tmp_path):
    url = str(tmp_path / "c")
    rc, out, tty = on_a_terminal("--cluster", url, "topics", "--create", "--topic", "big",
                                 "--partitions", PARTITIONS)
    assert rc == 0, tty
    assert f"creating partitions [" in tty and f"{PARTITIONS}/{PARTITIONS} 100%" in tty, tty
    assert tty.endswith("\r\x1b[K") and "[#" not in out       # erased; stdout untouched
    rc, out, tty = on_a_terminal("--cluster", url, "repair", "--topic", "big", "--dry-run")
    assert rc == 0 and f"checking big [" in tty and f"{PARTITIONS}/{PARTITIONS}" in tty, tty
    rc, out, tty = on_a_terminal("--cluster", url, "cleanup")
    assert rc == 0 and "cleaning logdir-0 [" in tty, tty
    admin = Admin(url)
    for i in range(60):                                       # an entry each
        admin.produce("big", [(None, b"x")], partition=i)
    rc, out, tty = on_a_terminal("--cluster", url, "metadata", "--verify")
    assert rc == 0 and "reading entries [" in tty, tty


def test_a_pipe_and_json_get_no_bar(tmp_path):
    url = str(tmp_path / "c")
    rc, out, err = run_cli("--cluster", url, "topics", "--create", "--topic", "big",
                           "--partitions", PARTITIONS)
    assert rc == 0 and err == "" and "[#" not in out, err
    rc, out, tty = on_a_terminal("--cluster", url, "--json", "repair", "--topic", "big",
                                 "--dry-run")
    assert rc == 0 and "[" not in tty and "\r" not in tty, tty


def test_tracked_reports_each_item_once_it_is_done_and_nothing_without_an_observer():
    seen = []
    with observed(lambda label, done, total: seen.append((label, done, total))):
        for i in tracked("work", range(3)):
            seen.append(i)
    assert seen == [("work", 0, 3), 0, ("work", 1, 3), 1, ("work", 2, 3), 2, ("work", 3, 3)]
    assert list(tracked("work", iter([1, 2]))) == [1, 2]     # no observer: only the items
