"""The standalone coordinator command as a real process, for the coordinator's tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cli_support import REPO
from support.polling import eventually  # noqa: F401  (its deadline here: DEADLINE_S below)
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.coordinator import quota_client
from pyspark_kafkalog.coordinator.config import CoordinatorConfig
from pyspark_kafkalog.coordinator.service import Coordinator

DEADLINE_S = 90.0
CLI = [sys.executable, "-m", "pyspark_kafkalog.cli.main"]
TOKEN = "0123456789abcdef" * 4
LEASE_MS = 1500
CONF = REPO / "conf"


def metrics_of(url_: str) -> dict:
    """The scraped samples: {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(url_, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def url(tmp_path) -> str:
    root = str(tmp_path / "kl")
    Cluster(root)          # create it
    return root


@pytest.fixture
def cluster(url) -> Cluster:
    return Cluster(url, create=False)


@pytest.fixture
def token_file(tmp_path):
    """The test's token in a file; afterwards this process's cached connections to the
    test's coordinator (quota clients') are dropped."""
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    yield str(path)
    quota_client.CONNECTIONS.clear()


#: Coordinator's keyword arguments; the others are settings (CoordinatorConfig's)
RUNTIME = ("token", "ticks", "holder", "leases")


def new_coordinator(cluster, **kwargs) -> Coordinator:
    """``Coordinator(cluster, CoordinatorConfig.of(**settings), **runtime)`` from one set of
    keyword arguments, as the tests give them."""
    runtime = {k: kwargs.pop(k) for k in RUNTIME if k in kwargs}
    return Coordinator(cluster, CoordinatorConfig.of(**kwargs), **runtime)


@pytest.fixture
def coordinator_defaults() -> dict:
    """Options every coordinator a test starts gets unless it says otherwise (a test module
    overrides this fixture to change them)."""
    return {}


@pytest.fixture
def coordinators(coordinator_defaults):
    """``coordinators(cluster, **options)`` starts a Coordinator (the test's token and a short
    lease); every one is stopped, its lease released, after the test."""
    started = []

    def make(cluster, **kwargs):
        kwargs = {"token": TOKEN, "lease_ms": LEASE_MS, **coordinator_defaults, **kwargs}
        c = new_coordinator(cluster, **kwargs).start()
        started.append(c)
        return c
    yield make
    for c in started:
        c.stop()


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
