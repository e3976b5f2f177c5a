"""Missing ground truth skips on a developer's clone but fails in CI (tests/support/shared_paths.py).

Each case runs pytest in a child process with the corpus locations pointed elsewhere, once with
``CI=true`` and once without, and checks the exit status and what pytest said.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.shared_paths import GOLDEN, PROJECT, missing, needs_golden

TESTS = PROJECT / "tests"


pytestmark = pytest.mark.slow   # pytest runs in child processes (~5 s)


def run_pytest(*args, ci: bool, cwd: Path = PROJECT, **env) -> tuple[int, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("CI", "KAFKALOG_SHARED", "KAFKALOG_GOLDEN", "KAFKALOG_KAFKA_SOURCE",
                      "PYTEST_ADDOPTS")}
    e.update(env, PYSPARK_PYTHON=sys.executable)
    if ci:
        e["CI"] = "true"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        *args], cwd=cwd, env=e, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("layout", ["absent", "partial"])
def test_a_missing_or_partial_golden_corpus_stops_ci_and_skips_locally(tmp_path, layout):
    golden = tmp_path / "kafka-golden"
    if layout == "partial":
        if not GOLDEN.is_dir():
            missing(f"no golden corpus at {GOLDEN} to copy a case from")
        shutil.copytree(GOLDEN / "m2-none-create-0", golden / "m2-none-create-0")
    args = ("tests/format/test_index_format.py", "tests/format/test_codecs.py", "-k", "golden")
    rc, out = run_pytest(*args, ci=True, KAFKALOG_GOLDEN=str(golden))
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert f"CI: the golden corpus at {golden} has {1 if layout == 'partial' else 0} of" in out
    if layout == "absent":
        rc, out = run_pytest(*args, ci=False, KAFKALOG_GOLDEN=str(golden))
        assert rc == 0, out
        assert "skipped" in out and "passed" not in out and "failed" not in out, out
        assert f"golden corpus not at {golden}" in out


def test_an_empty_parameter_list_fails_in_ci(tmp_path):
    (tmp_path / "test_empty.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('case', [])\n"
        "def test_each(case):\n"
        "    pass\n\n"
        "def test_other():\n"
        "    pass\n")
    # the project's conftest as a plugin, so its hooks judge a module outside tests/
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), str(PROJECT)]), "KAFKALOG_GOLDEN": str(GOLDEN)}
    rc, out = run_pytest("-p", "conftest", "test_empty.py", ci=False, cwd=tmp_path, **env)
    assert rc == 0 and "1 passed, 1 skipped" in out, out
    if not GOLDEN.is_dir():
        return          # under CI the missing corpus would stop the run before collection
    rc, out = run_pytest("-p", "conftest", "test_empty.py", ci=True, cwd=tmp_path, **env)
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "CI: these tests have an empty parameter list: test_empty.py::test_each" in out


@needs_golden
def test_kafkas_java_classes_missing_fail_in_ci_and_skip_locally(tmp_path):
    """No kafka-src archive in the shared dir (the golden corpus still found)."""
    env = {"KAFKALOG_SHARED": str(tmp_path), "KAFKALOG_GOLDEN": str(GOLDEN)}
    args = ("tests/compat/test_kafka_java.py", "-k", "golden_dir_exactly")
    rc, out = run_pytest(*args, ci=False, **env)
    assert rc == 0 and "1 skipped" in out, out
    assert f"{tmp_path}/kafka-src/kafka-src.tar.gz is missing" in out
    rc, out = run_pytest(*args, ci=True, **env)
    assert rc == pytest.ExitCode.TESTS_FAILED and "1 error" in out, out
    assert "Kafka's Java classes are unavailable" in out
    assert "CI must not skip ground-truth tests" in out
