"""What may skip on a developer's machine but must fail in CI (``CI`` set, as CI services and
``.ci/run`` do): a test environment that lacks what the suite is meant to test.

* ``skip_or_fail(what)``: for a test or fixture that finds something missing (the moto server
  that did not start, ...): skips locally, fails in CI.
* ``environment_problems()``: checked once before a CI run collects anything (tests/conftest.py):
  the C extensions must be built and in use, or every test of a C twin would only skip.

Platform skips stay skips everywhere (O_DIRECT, fork, /proc, a root user who ignores file
permissions, the power-cut test's loop devices): they say what the platform is, not that the
environment is broken.
"""
from __future__ import annotations

import importlib
import os
from typing import List

import pytest

from support.shared_paths import IN_CI

EXTENSIONS = ("pyspark_kafkalog.format._columnar_accel", "pyspark_kafkalog.format._encode_accel")


def skip_or_fail(what: str) -> None:
    """Skip the current test because ``what``, or fail it under CI."""
    if IN_CI:
        pytest.fail(f"{what} (CI must not skip this)", pytrace=False)
    pytest.skip(what)


def environment_problems() -> List[str]:
    """Why the C twins' tests would skip here; empty when they all run."""
    problems = []
    if os.environ.get("KAFKALOG_PURE_PYTHON", "") == "1":
        problems.append("KAFKALOG_PURE_PYTHON=1 turns every C extension off")
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            problems.append(f"the C extension {name} is not built ({e}); `pip install -e .` "
                            "builds it (is a C compiler installed?)")
            continue
        if name.endswith("_encode_accel") and not hasattr(module, "murmur2_hashes"):
            problems.append(f"the C extension {name} is stale (no murmur2_hashes); rebuild it")
    return problems
