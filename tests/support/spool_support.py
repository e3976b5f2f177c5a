"""Helpers shared by tests/storage/test_spool.py and tests/log/test_segment_spool.py."""
from __future__ import annotations

import os

import pytest

from pyspark_kafkalog.storage import local_spool as spool_mod

ALIGN = 4096                       # a page: patches straddling it must not matter
HAS_DIRECT = hasattr(os, "O_DIRECT")
needs_direct = pytest.mark.skipif(not HAS_DIRECT, reason="O_DIRECT: Linux only")


def temp_files(root):
    return [n for _, _, files in os.walk(root) for n in files if ".tmp-" in n]


def segment_files(root):
    """{path relative to root: bytes} of every segment file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for n in files:
            if n.endswith((".log", ".index", ".timeindex")) and n[:20].isdigit():
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = f.read()
    return out


class OsSpy:
    """Stands in for ``os`` inside one module only (the rest of the process and the test keep
    the real module): the attributes given replace the real ones, everything else is the real
    ``os``."""

    def __init__(self, **over):
        self.__dict__.update(over)

    def __getattr__(self, name):
        return getattr(os, name)


def spy_os(monkeypatch, module=spool_mod, **over) -> OsSpy:
    """Replace ``os`` in ``module`` (default: ``storage.local_spool``) by an :class:`OsSpy`."""
    spy = OsSpy(**over)
    monkeypatch.setattr(module, "os", spy)
    return spy
