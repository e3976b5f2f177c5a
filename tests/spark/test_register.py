"""``pyspark_kafkalog.register`` in a plain script: the line a user adds must not end the script.

Importing Spark Connect's client without its dependencies (pandas) runs PySpark's doctest guard,
which exits the interpreter with status 0: a ``register`` that imported it for a classic session
made ``python -c "...; register(spark); print('ok')"`` print nothing and succeed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark,     # a SparkSession in a child process (~7 s)
              pytest.mark.slow]

SCRIPT = """
import sys
from pyspark.sql import SparkSession
import pyspark_kafkalog
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
pyspark_kafkalog.register(spark)
assert not any(m.startswith("pyspark.sql.connect") for m in sys.modules), "Connect loaded"
spark.stop()
print("ok")
"""


def test_register_in_python_c_prints_ok_and_loads_no_connect_client():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1:] == ["ok"], (out.stdout, out.stderr[-3000:])
