"""Shared fixtures: the Kafka-written golden log dir and fresh copies of it."""
from __future__ import annotations

import os
import shutil
import stat

import pytest

from support.ci import environment_problems
from support.golden import (CASES, DAMAGED, UNDAMAGED, b64, expected_records,  # noqa: F401
                            record_json)
from support.shared_paths import GOLDEN, GOLDEN_CASE_COUNT, IN_CI, SHARED, missing  # noqa: F401
from support.spark_support import write  # noqa: F401


@pytest.fixture
def golden_copy(tmp_path):
    """A writable copy of the golden log dir (the original is read-only ground truth)."""
    dst = tmp_path / "golden"
    shutil.copytree(GOLDEN, dst)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = os.path.join(root, name)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    return dst


def pytest_report_header(config):
    return f"kafka-golden: {GOLDEN} ({len(CASES)} cases)"


def pytest_configure(config):
    """In CI a missing or partial golden corpus stops the run: its tests would only skip."""
    if IN_CI and len(CASES) < GOLDEN_CASE_COUNT:
        raise pytest.UsageError(
            f"CI: the golden corpus at {GOLDEN} has {len(CASES)} of {GOLDEN_CASE_COUNT} cases; "
            "place shared/ beside the repository or set KAFKALOG_GOLDEN")
    if IN_CI and environment_problems():
        raise pytest.UsageError("CI: the tests of the C extensions would only skip: "
                                + "; ".join(environment_problems()))
    _share_bytecode(config)


def _share_bytecode(config):
    """The processes the suite starts (CLI commands, coordinators, producers, Spark drivers and
    their Python workers: hundreds) each import this package. Where the environment turns
    bytecode caching off (``PYTHONDONTWRITEBYTECODE``, as some CI images do), every one of them
    compiled the package's modules again, about 0.25 s per process. They now share the
    bytecode, as with Python's defaults, in a directory of this run's own
    (``PYTHONPYCACHEPREFIX``), so nothing is written beside the sources; the code run is the
    same. An explicit ``PYTHONPYCACHEPREFIX`` is left alone."""
    import sys
    import tempfile
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = tempfile.mkdtemp(prefix="kafkalog-test-pycache-")
    config._kafkalog_pycache = prefix
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False


def pytest_unconfigure(config):
    prefix = getattr(config, "_kafkalog_pycache", None)
    if prefix:
        shutil.rmtree(prefix, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Every test that uses the ``spark`` session (or ``ks``) is marked ``spark``, so ``-m "not
    spark"`` leaves the JVM out. In CI a parametrised test with no parameters (a corpus list
    that came out empty) is an error, not the skip pytest makes it."""
    for item in items:
        if {"spark", "ks"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
    if not IN_CI:
        return
    empty = [item.nodeid for item in items
             if any(str(m.kwargs.get("reason", "")).startswith("got empty parameter set")
                    for m in item.iter_markers("skip"))]
    if empty:
        raise pytest.UsageError("CI: these tests have an empty parameter list: " + ", ".join(empty))


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (JVM start-up is the expensive part)."""
    import sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("kafkalog-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_check():
    """Apache Kafka's own classes reading a log dir (tests/support/kafka_java_support.py);
    where they cannot be built, skips naming what is missing, or fails in CI."""
    import support.kafka_java_support as kj
    try:
        return kj.KafkaCheck(*kj.build())
    except kj.Unavailable as e:
        missing(f"Kafka's Java classes are unavailable: {e}")


@pytest.fixture(scope="module")
def ks(spark):
    """The session with the kafkalog format registered (again per module: a module may have
    registered the filter-pushdown variant)."""
    import pyspark_kafkalog
    pyspark_kafkalog.register(spark)
    return spark
