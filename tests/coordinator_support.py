"""The standalone coordinator command as a real process, for the coordinator's tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from cli_support import REPO

DEADLINE_S = 90.0
CLI = [sys.executable, "-m", "pyspark_kafkalog.cli.main"]


class Service:
    """``kafkalog --cluster URL --json coordinator …`` as a process; its announce line parsed."""

    def __init__(self, url: str, *options):
        self.proc = subprocess.Popen(
            [*CLI, "--cluster", url, "--json", "coordinator", *map(str, options)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self.err = []
        self._reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr),
                                        daemon=True)
        self._reader.start()
        line = self.proc.stdout.readline()
        assert line, f"the coordinator ended before serving: {self.stderr()}"
        self.announced = json.loads(line)

    def stderr(self) -> str:
        if self.proc.poll() is not None:
            self._reader.join(DEADLINE_S)
        return "".join(self.err)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)


@pytest.fixture
def services():
    """``services(url, *options)`` starts a :class:`Service`; every one is killed at the end."""
    running = []

    def make(*args):
        s = Service(*args)
        running.append(s)
        return s
    yield make
    for s in running:
        s.kill()
