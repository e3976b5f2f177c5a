"""What the command-line tests share: `kafkalog` as a real process, and a digest of every file
under a root (to show that a refused command changed nothing)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

REPO = Path(__file__).resolve().parents[2]


def run_cli(*argv, stdin: str = "", env: Optional[dict] = None, timeout: int = 180):
    """``kafkalog ARGV`` in a fresh interpreter: (exit status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**(os.environ if env is None else env), "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def digests(root: Path) -> Dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def run_main(*argv, stdin: str = ""):
    """``kafkalog ARGV`` in this process (much cheaper than a fresh interpreter): (exit status,
    stdout, stderr). An exception that escapes ``main`` is a traceback the user would see: it
    propagates and fails the test."""
    import contextlib
    import io
    from pyspark_kafkalog.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as exc:          # argparse: --help, usage errors
                rc = exc.code
    finally:
        sys.stdin = old_stdin
    return rc, out.getvalue(), err.getvalue()


def peak_rss_kb(argv) -> int:
    """Peak RSS of one ``kafkalog ARGV`` child process, from its own rusage (wait4), its
    output thrown away; it must exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "pyspark_kafkalog.cli.main",
                             *map(str, argv)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, err
    return usage.ru_maxrss


def fill_big_topic(url: str, records: int) -> None:
    """Topic ``m`` with one partition of ``records`` records (one encoded batch of 1,000
    100-byte records written again and again, which takes well under a second) and an empty
    topic ``e``: what the memory-bound tests of consume read."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.client.producer import Producer
    from pyspark_kafkalog.format.records import Record
    admin = Admin(url)
    admin.create_topic("m")
    admin.create_topic("e")
    producer = Producer(admin.cluster)
    batch = producer.encode("m", [Record(None, b"%06d" % i + b"v" * 94, 1_000 + i)
                                  for i in range(1000)])
    assert producer.send({("m", 0): batch * (records // 1000)}) == {("m", 0): (0, records - 1)}
