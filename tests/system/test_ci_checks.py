"""In CI (``CI`` set, as ``.ci/run`` sets it) what would only skip locally fails the run
(tests/support/ci.py): here, C extensions that are not in use."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.shared_paths import GOLDEN, PROJECT, needs_golden

TESTS = PROJECT / "tests"


pytestmark = pytest.mark.slow   # pytest runs in child processes (~3 s)


def run_pytest(tmp_path, ci: bool, **env) -> tuple[int, str]:
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("CI", "KAFKALOG_PURE_PYTHON", "PYTEST_ADDOPTS")}
    e.update(env, PYTHONPATH=os.pathsep.join([str(TESTS), str(PROJECT)]),
             KAFKALOG_GOLDEN=str(GOLDEN))
    if ci:
        e["CI"] = "true"
    # the project's conftest as a plugin, so its checks judge a module outside tests/
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "conftest", "test_nothing.py"], cwd=tmp_path, env=e,
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


@needs_golden       # under CI a missing corpus stops the run first
def test_c_extensions_turned_off_stop_a_ci_run_and_not_a_local_one(tmp_path):
    rc, out = run_pytest(tmp_path, ci=False, KAFKALOG_PURE_PYTHON="1")
    assert rc == 0 and "1 passed" in out, out
    rc, out = run_pytest(tmp_path, ci=True, KAFKALOG_PURE_PYTHON="1")
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "CI: the tests of the C extensions would only skip" in out, out
    assert "KAFKALOG_PURE_PYTHON=1" in out, out
