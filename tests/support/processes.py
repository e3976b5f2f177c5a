"""A child process of the whole-process tests (tests/procs/ scripts), with stdout and stderr in
files, so a kill loses nothing it printed whole; its stdout is read as JSON lines."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from procs.torture_common import complete_json_lines

TESTS = Path(__file__).resolve().parents[1]
# the children import the package (the repository) and procs.* (tests/)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
PYTHON = os.environ.get("PYSPARK_PYTHON") or sys.executable


class ChildProcess:
    """``python SCRIPT ARGS`` with its output in ``tmp/NAME.out`` and ``tmp/NAME.err``."""

    def __init__(self, tmp: Path, name: str, script: Path, *args, deadline_s: float = 120):
        self.name, self.deadline_s = name, deadline_s
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([PYTHON, str(script), *map(str, args)], stdout=out,
                                         stderr=err, env=ENV)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self):
        return list(complete_json_lines(self.out))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=self.deadline_s)

    def terminate(self) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=self.deadline_s)

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            return self.err.read_text()[-n:]
        except FileNotFoundError:
            return ""
