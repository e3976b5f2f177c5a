"""Every C twin is chosen the same way: used when its extension was built, and never under
``KAFKALOG_PURE_PYTHON=1``, which forces the Python/numpy fallbacks everywhere. Checked in fresh
interpreters, since the choice is made at import time."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    from pyspark_kafkalog.format import _columnar_accel, _encode_accel  # noqa: F401
    BUILT = True
except ImportError:
    BUILT = False

#: what each switch prints: (uses C, the C object is the one in use)
SWITCHES = {
    "record loop": "from pyspark_kafkalog.format import columnar as m, _columnar_py as py; "
                   "print(m.ACCELERATED, m._scan_v2 is not py.scan_v2)",
    "Arrow read route": "from pyspark_kafkalog.format import arrow_decode as m; "
                        "print(m.AVAILABLE, m.decode_spark_arrays(b'', with_headers=False) "
                        "is not None)",
    "records encoder": "from pyspark_kafkalog.format import arrow_encode as m; "
                       "print(m.ACCELERATED, m._encode_records is not None)",
    "murmur2": "from pyspark_kafkalog.format import arrow_encode as m; "
               "print(m._murmur2_hashes is not None, m._murmur2_partitions is not None)",
    "sink accumulator": "from pyspark_kafkalog.format import accumulate as m; "
                        "a = m.new_accumulator('t', 2, magic=2, compression=0, level=None, "
                        "batch_records=10, batch_size=1000, max_message_bytes=10000); "
                        "print(m._Accumulator is not None, type(a) is m.BatchAccumulator)",
}


def run(code: str, pure: bool) -> list:
    env = {k: v for k, v in os.environ.items() if k != "KAFKALOG_PURE_PYTHON"}
    if pure:
        env["KAFKALOG_PURE_PYTHON"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.parametrize("name", SWITCHES)
def test_kafkalog_pure_python_forces_every_fallback(name):
    assert run(SWITCHES[name], pure=True) == ["False", "False"]


@pytest.mark.skipif(not BUILT, reason="the optional C extensions are not built (no compiler at "
                                      "install time?); `pip install -e .` builds them in place")
@pytest.mark.parametrize("name", SWITCHES)
def test_extensions_are_the_default_when_built(name):
    assert run(SWITCHES[name], pure=False) == ["True", "True"]
