"""The one place that decides whether the C twins of the hot paths run.

The read and write hot paths each have a C extension (``_columnar_accel``: the magic 2 record
loop and the Spark reader's Arrow route; ``_encode_accel``: the records builder, the sink's
accumulator and murmur2) and a pure-Python/numpy twin that gives the same results and errors.
Which one runs is decided here, once, at import, so that every module makes the same choice and
one switch forces the fallbacks everywhere: ``KAFKALOG_PURE_PYTHON=1`` in the environment of
the process (each process decides for itself, Spark's Python workers from their own
environment). A missing extension (no compiler at install time) is not an error, only slower.

The modules that use an extension bind the functions they call from :data:`COLUMNAR` /
:data:`ENCODE` when they are imported; tests that compare the twins swap those bindings
(``columnar._scan_v2``, ``arrow_encode._encode_records``, ...), not this module's.
The extensions' signatures are in ``_columnar_accel.pyi`` and ``_encode_accel.pyi``.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

#: The environment variable that, set to ``1``, forces the pure-Python/numpy fallbacks.
PURE_PYTHON_ENV = "KAFKALOG_PURE_PYTHON"
#: Whether :data:`PURE_PYTHON_ENV` was ``1`` when this module was imported (read only then).
PURE_PYTHON: bool = os.environ.get(PURE_PYTHON_ENV, "") == "1"

#: The extension modules this package may build (``setup.py``), by short name.
EXTENSIONS = ("_columnar_accel", "_encode_accel")


def _load(name: str) -> Optional[ModuleType]:
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError:   # not built (no compiler at install time): the twin gives the same
        return None


#: ``_columnar_accel`` (record loop ``scan_v2``, Arrow route ``scan_run_arrow``), or None.
COLUMNAR: Optional[ModuleType] = _load("_columnar_accel")
#: ``_encode_accel`` (``encode_v2_records``, ``Accumulator``, ``murmur2_*``), or None.
ENCODE: Optional[ModuleType] = _load("_encode_accel")


def describe() -> str:
    """Which implementation runs, in words (the benchmarks print it with their results)."""
    loaded = dict(zip(EXTENSIONS, (COLUMNAR, ENCODE)))
    if PURE_PYTHON:
        return f"pure Python ({PURE_PYTHON_ENV}=1)"
    built = [name for name, mod in loaded.items() if mod is not None]
    if not built:
        return "pure Python (the C extensions are not built)"
    missing = [name for name, mod in loaded.items() if mod is None]
    text = "C extensions (" + ", ".join(f"{__package__}.{n}" for n in built) + ")"
    if missing:
        text += "; pure Python for " + ", ".join(missing) + " (not built)"
    return text
