"""Every C twin is chosen the same way: used when its extension was built, and never under
``KAFKALOG_PURE_PYTHON=1``, which forces the Python/numpy fallbacks everywhere. Checked in fresh
interpreters, since the choice is made at import time, in one place (``format/accel.py``).
Also here: the extensions' type stubs name exactly what the built extensions export."""
from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyspark_kafkalog

try:
    from pyspark_kafkalog.format import _columnar_accel, _encode_accel  # noqa: F401
    BUILT = True
except ImportError:
    BUILT = False

#: what each switch prints: (uses C, the C object is the one in use)
SWITCHES = {
    "the choice": "from pyspark_kafkalog.format import accel as m; "
                  "print(m.COLUMNAR is not None, m.ENCODE is not None)",
    "record loop": "from pyspark_kafkalog.format import columnar as m, _columnar_py as py; "
                   "print(m.ACCELERATED, m._scan_v2 is not py.scan_v2)",
    "Arrow read route": "from pyspark_kafkalog.arrow import arrow_decode as m; "
                        "print(m.AVAILABLE, m.decode_spark_arrays(b'', with_headers=False) "
                        "is not None)",
    "records encoder": "from pyspark_kafkalog.arrow import arrow_encode as m; "
                       "print(m.ACCELERATED, m._encode_records is not None)",
    "murmur2": "from pyspark_kafkalog.arrow import arrow_encode as m; "
               "print(m._murmur2_hashes is not None, m._murmur2_partitions is not None)",
    "sink accumulator": "from pyspark_kafkalog.arrow import accumulate as m; "
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


# -- one home: format/accel.py -------------------------------------------------------------------

PACKAGE = Path(pyspark_kafkalog.__file__).parent
FORMAT = PACKAGE / "format"
EXTENSIONS = ("_columnar_accel", "_encode_accel")


def test_only_accel_loads_the_extensions_or_reads_the_switch():
    """Any other module that imported an extension or read the variable would make its own
    choice, which the switch could then miss."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == FORMAT / "accel.py":
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith("KAFKALOG_PURE_PYTHON") else []
            for name in names:
                if name.rsplit(".", 1)[-1] in EXTENSIONS or name == "KAFKALOG_PURE_PYTHON":
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert not offenders, "only pyspark_kafkalog/format/accel.py may load the C extensions " \
                          "or read KAFKALOG_PURE_PYTHON:\n" + "\n".join(offenders)


def stub_names(name: str) -> set:
    """The functions and classes a stub defines at its top level (its type aliases describe
    the signatures; the extension has no such names)."""
    tree = ast.parse((FORMAT / f"{name}.pyi").read_text(encoding="utf-8"))
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


def stub_class_members(name: str, cls: str) -> set:
    tree = ast.parse((FORMAT / f"{name}.pyi").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    raise AssertionError(f"{name}.pyi has no class {cls}")


@pytest.mark.parametrize("name", EXTENSIONS)
def test_every_extension_has_a_stub_that_ships(name):
    assert (FORMAT / f"{name}.pyi").is_file()
    root = PACKAGE.parent
    assert "include pyspark_kafkalog/format/*.pyi" in (root / "MANIFEST.in").read_text()
    assert '"pyspark_kafkalog.format": ["*.pyi"]' in (root / "setup.py").read_text()


@pytest.mark.skipif(not BUILT, reason="the optional C extensions are not built (no compiler at "
                                      "install time?); `pip install -e .` builds them in place")
@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_stub_names_exactly_what_the_extension_exports(name):
    mod = importlib.import_module(f"pyspark_kafkalog.format.{name}")
    exported = {n for n in dir(mod) if not n.startswith("_")}
    assert stub_names(name) == exported
    for cls in exported:
        obj = getattr(mod, cls)
        if isinstance(obj, type):
            members = {n for n in dir(obj) if not n.startswith("_")} | {"__init__"}
            assert stub_class_members(name, cls) == members, cls
