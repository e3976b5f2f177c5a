"""The package's imports follow its architecture (README.md, "Layout"): no import cycles between
modules, imports only down the layers ``format → arrow / storage → log → cluster →
maintenance → client → connector → coordinator → spark / admin / cli``, and no private name (``_x``) imported from another module.

Read from the source with ``ast``, both module-level imports and those inside functions: an
import moved into a function to dodge a cycle is still the cycle, and a cycle is what makes a
module's import order matter. Each failure prints the offending imports, file and line.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import pyspark_kafkalog

PACKAGE = Path(pyspark_kafkalog.__file__).parent
ROOT = PACKAGE.name   # "pyspark_kafkalog"

#: Layers, bottom first: a module may import its own package and the layers below it. A module
#: directly in the package (errors.py) is the bottom, but for config_def.py, which declares
#: configs and raises errors.py's InvalidConfigError; the package itself (``register``, the one
#: line users add) is the top, except that anything may read its metadata (``__version__``):
#: importing any module runs the package's ``__init__`` first anyway, and it imports nothing
#: until ``register`` is called.
LAYERS = {"config_def": 0.5, "format": 1, "arrow": 2, "storage": 2, "log": 3, "cluster": 4,
          "maintenance": 5, "client": 6, "connector": 7, "coordinator": 8, "spark": 9, "admin": 9,
          "cli": 9}
BOTTOM, TOP = 0, 10
#: Imports between packages of one layer that are allowed: the CLI calls the admin API (one
#: implementation of every rule, README.md). The Spark source and the admin API are separate
#: front ends over the layers below, and neither uses the CLI.
PEERS = {("cli", "admin")}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    name: Optional[str]     # the name taken with ``from ... import name`` (not a module)
    where: str              # file:line
    in_function: bool

    def __str__(self) -> str:
        what = f"{self.imported}.{self.name}" if self.name else self.imported
        return (f"{self.importer} -> {what}  ({self.where}"
                f"{', inside a function' if self.in_function else ''})")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()
#: Modules that are not .py files: the C extensions, known by their type stubs.
EXTENSIONS = {_module_name(p) for p in PACKAGE.rglob("*.pyi")}


def _is_module(name: str) -> bool:
    return name in MODULES or name in EXTENSIONS


def _resolve(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _imports_of(tree: ast.Module) -> List[Tuple[ast.stmt, bool]]:
    """Every import statement, and whether it sits inside a function. An import is a statement,
    so only statement lists are searched, not expressions."""
    found = []

    def visit(stmts, inside: bool) -> None:
        for st in stmts:
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                found.append((st, inside))
                continue
            nested = inside or isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
            for block in ("body", "orelse", "finalbody"):
                value = getattr(st, block, None)
                if isinstance(value, list):
                    visit(value, nested)
            for part in getattr(st, "handlers", None) or getattr(st, "cases", None) or []:
                visit(part.body, nested)

    visit(tree.body, False)
    return found


def _edges_of(name: str, path: Path) -> List[Edge]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    out, shown = [], path.relative_to(PACKAGE.parent)
    for node, inside in _imports_of(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names
                       if a.name == ROOT or a.name.startswith(ROOT + ".")]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node.level, node.module)
            if base != ROOT and not base.startswith(ROOT + "."):
                continue
            targets = [(f"{base}.{a.name}", None) if _is_module(f"{base}.{a.name}")
                       else (base, a.name) for a in node.names]
        where = f"{shown}:{node.lineno}"
        out += [Edge(name, target, what, where, inside)
                for target, what in targets if target != name]
    return out


EDGES = [edge for name, path in MODULES.items() for edge in _edges_of(name, path)]


def _package(module: str) -> str:
    """The sub-package a module belongs to ("" for the package itself, its own name for a
    module directly in the package, e.g. "errors")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    pkg = _package(module)
    if pkg == "":
        return TOP
    return LAYERS.get(pkg, BOTTOM if (PACKAGE / f"{pkg}.py").exists() else None)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _strongly_connected(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def cycles(edges: List[Edge]) -> List[List[Edge]]:
    """The imports inside each group of modules that import each other, directly or not."""
    graph: Dict[str, Set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    return [sorted((e for e in edges if e.importer in comp and e.imported in comp), key=str)
            for comp in _strongly_connected(graph)]


def against_layers(edges: List[Edge]) -> List[Edge]:
    bad = []
    for e in edges:
        a, b = _package(e.importer), _package(e.imported)
        if a == b or (a, b) in PEERS or (e.imported == ROOT and e.name and e.name[:2] == "__"):
            continue
        la, lb = _layer(e.importer), _layer(e.imported)
        if la is None or lb is None or lb >= la:
            bad.append(e)
    return bad


def private_imports(edges: List[Edge]) -> List[Edge]:
    """A private name taken from another module, or a private module taken from outside the
    package it belongs to (``format/columnar.py`` may use ``format/_columnar_py.py``)."""
    bad = []
    for e in edges:
        if e.name is not None and _private(e.name):
            bad.append(e)
        elif e.name is None and any(_private(p) for p in e.imported.split(".")):
            owner = e.imported.rsplit(".", 1)[0]
            if e.importer.rsplit(".", 1)[0] != owner and e.importer != owner:
                bad.append(e)
    return bad


def _report(title: str, lines) -> str:
    return title + "\n" + "\n".join(f"  {line}" for line in lines)


# -- the rules -----------------------------------------------------------------------------------

def test_every_module_was_read():
    """The walk sees the package (a broken walk would pass every rule below)."""
    assert {"pyspark_kafkalog.errors", "pyspark_kafkalog.format.columnar",
            "pyspark_kafkalog.cli.main", "pyspark_kafkalog.spark.datasource"} <= set(MODULES)
    assert len(EDGES) > 100
    assert any(e.in_function for e in EDGES) and any(not e.in_function for e in EDGES)
    assert all(_layer(m) is not None for m in MODULES), \
        [m for m in MODULES if _layer(m) is None]


def test_no_import_cycles():
    found = cycles(EDGES)
    assert not found, _report(
        "import cycles (modules that import each other; move what both need into a module "
        "of its own):", [line for group in found for line in ["--"] + [str(e) for e in group]])


def test_imports_go_down_the_layers():
    bad = against_layers(EDGES)
    assert not bad, _report("imports against the layer order format → arrow / storage → log → "
                            "cluster → maintenance → client → connector → coordinator → "
                            "spark / admin / cli (cli may use admin):",
                            map(str, bad))


def test_no_private_names_across_modules():
    bad = private_imports(EDGES)
    assert not bad, _report("private names imported from another module (make them public, "
                            "or move them to where both modules can use them):", map(str, bad))


# -- the checks catch what they are for -----------------------------------------------------------

def _edge(a: str, b: str, name: Optional[str] = None, in_function: bool = False) -> Edge:
    return Edge(f"{ROOT}.{a}", f"{ROOT}.{b}", name, "x.py:1", in_function)


def test_a_cycle_through_a_function_level_import_is_found():
    edges = [_edge("cli.produce", "cli.cluster_data", in_function=True),
             _edge("cli.cluster_data", "cli.produce", "parse_records", in_function=True),
             _edge("cli.main", "cli.produce")]
    found = cycles(edges)
    assert [[e.importer for e in group] for group in found] == [
        [f"{ROOT}.cli.cluster_data", f"{ROOT}.cli.produce"]]
    assert "inside a function" in str(found[0][0])
    longer = [_edge("log.a", "log.b"), _edge("log.b", "log.c"), _edge("log.c", "log.a"),
              _edge("log.c", "log.d")]
    assert [len(group) for group in cycles(longer)] == [3]


@pytest.mark.parametrize("a, name, ok", [
    ("cli.main", "__version__", True),
    ("log.segment", "register", False),     # the package itself is the top
])
def test_the_layer_rule_for_the_package_itself(a, name, ok):
    edge = Edge(f"{ROOT}.{a}", ROOT, name, "x.py:1", False)
    assert (against_layers([edge]) == []) is ok


@pytest.mark.parametrize("a, b, ok", [
    ("storage.local", "format.crc", True),
    ("storage.local", "arrow.buffer_pool", False),
    ("connector.spark_job", "client.producer", True),
    ("client.consumer", "maintenance.repair", True),
    ("maintenance.retention", "client.producer", False),
    ("cluster.state", "maintenance.repair", False),
    ("log.segment", "storage.base", True),
    ("cli.produce", "admin", True),
    ("spark.reader", "connector.read_plan", True),
    ("format.batch", "errors", True),
    ("format.encode", "log.segment", False),
    ("errors", "format.records", False),
    ("cluster.producer", "spark.writer", False),
    ("admin", "cli.main", False),
    ("spark.writer", "admin", False),
    ("cli.produce", "spark.shuffle", False),
    ("storage.local", "", False),
])
def test_the_layer_rule(a, b, ok):
    imported = f"{ROOT}.{b}" if b else ROOT
    edge = Edge(f"{ROOT}.{a}", imported, None, "x.py:1", False)
    assert (against_layers([edge]) == []) is ok


@pytest.mark.parametrize("edge, ok", [
    (_edge("arrow.accumulate", "arrow.arrow_encode", "_v2_header"), False),
    (_edge("storage.local_spool", "storage.local", "_writev_all", in_function=True), False),
    (_edge("arrow.arrow_encode", "format.accel", "ENCODE"), True),
    (_edge("format.columnar", "format._columnar_py"), True),        # its own package's
    (_edge("format.accel", "format._encode_accel"), True),
    (_edge("log.segment", "format._columnar_py"), False),           # another package's
    (_edge("cli.main", "errors", "__doc__"), True),
])
def test_the_private_name_rule(edge, ok):
    assert (private_imports([edge]) == []) is ok


def test_storage_loads_without_pyarrow():
    """The storage layer is what every process loads first, including the coordinator's
    short-lived clients: it must not pull in pyarrow (an import of a few hundred ms and MBs)."""
    import subprocess
    import sys
    code = ("import sys; import pyspark_kafkalog.storage, pyspark_kafkalog.storage.local, "
            "pyspark_kafkalog.storage.posix_io, pyspark_kafkalog.storage.fsspec_backends; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
