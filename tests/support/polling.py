"""Waiting for something another thread or process does: the one ``eventually`` of the suite."""
from __future__ import annotations

import time

import pytest

DEADLINE_S = 90.0


def eventually(predicate, what: str, deadline_s: float = DEADLINE_S, describe=None,
               interval_s: float = 0.05):
    """Poll ``predicate`` until it returns something true; fail naming ``what`` (and what
    ``describe()`` says of the state then) if it never does within a deadline far beyond what
    the tests need."""
    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"never happened within {deadline_s} s: {what}"
                        + (f"; {describe()}" if describe else ""))
        time.sleep(interval_s)
