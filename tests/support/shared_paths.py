"""Where the tests find the ground truth that lives outside this repository, in one place.

The shared dir sits beside the repository (``<repo>/../shared``, as CI lays it out) unless
``KAFKALOG_SHARED`` names another; it holds ``kafka-golden/`` (the log dir Kafka's own classes
wrote; ``KAFKALOG_GOLDEN`` overrides just that) and ``kafka-src/kafka-src.tar.gz`` (the part of
Kafka's source tree the Java-oracle tests compile; ``KAFKALOG_KAFKA_SOURCE`` overrides it).

Missing ground truth skips the tests that need it on a developer's clone, but fails them in CI
(``CI`` set, as CI services do): a corpus that is not there must not turn the suite green.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("KAFKALOG_SHARED") or PROJECT.parent / "shared")
GOLDEN = Path(os.environ.get("KAFKALOG_GOLDEN") or SHARED / "kafka-golden")
KAFKA_SRC_ARCHIVE = SHARED / "kafka-src" / "kafka-src.tar.gz"
# the golden corpus's partition dirs (kafka-golden/README.md); fewer means a partial copy
GOLDEN_CASE_COUNT = 29

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str) -> None:
    """Skip the current test because ``what`` is missing, or fail it under CI."""
    if IN_CI:
        pytest.fail(f"{what} (CI must not skip ground-truth tests)", pytrace=False)
    pytest.skip(what)


needs_golden = pytest.mark.skipif(not GOLDEN.is_dir(),
                                  reason=f"golden corpus not at {GOLDEN} (set KAFKALOG_GOLDEN)")
