"""PySpark 4 registers ``format("kafkalog")`` by itself (``pyspark_kafkalog.DefaultSource``): a
fresh session reads and writes without ``register()``; importing the package loads no Spark."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.cli_support import REPO

pytestmark = [pytest.mark.spark,
              pytest.mark.slow]   # PySpark sessions in child processes (~17 s)

_JOB = """
import sys
from pyspark.sql import SparkSession
from pyspark_kafkalog.admin import Admin
url = sys.argv[1]
Admin(url).create_topic("t", 2)
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.log.level", "ERROR").getOrCreate())
df = spark.createDataFrame([("k%d" % i, "v%d" % i) for i in range(10)], "key string, value string")
df.write.format("kafkalog").option("topic", "t").mode("append").save(url)
print("read", spark.read.format("kafkalog").option("subscribe", "t").load(url).count())
spark.stop()
"""


def test_a_fresh_session_finds_the_format_without_register(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "c")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "read 10"


def test_importing_the_package_loads_no_spark():
    code = ("import sys, pyspark_kafkalog, pyspark_kafkalog.admin; "
            "print(any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    import pyspark_kafkalog
    from pyspark.sql.datasource import DataSource
    assert issubclass(pyspark_kafkalog.DefaultSource, DataSource)
    assert pyspark_kafkalog.DefaultSource.name() == "kafkalog"
