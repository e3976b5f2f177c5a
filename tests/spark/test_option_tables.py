"""The docs' option tables against the option tables of the code (#34): every read and write
option is in the docs with the table's default, and every option the docs' tables name is one.

A docs table is one whose header starts ``| option | default |``; an option is a backticked
name in a row's first cell, its default the row's second cell: ``—`` for none, ``required``,
else the first backticked value there (one cell per row, so a row names options of one
default). A name with ``*`` stands for the options it covers."""
from __future__ import annotations

import pathlib
import re

import pytest

from pyspark_kafkalog.connector.read_plan import (DEFAULT_MAX_PARTITION_BYTES,
                                                  DEFAULT_OPEN_COST_IN_BYTES)
from pyspark_kafkalog.spark.read_options import READ_OPTIONS, STREAMING_DEFAULTS, ReadOptions
from pyspark_kafkalog.spark.write_options import _READ_ONLY, WRITE_OPTIONS

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
#: not options: how a path is given, a trigger
NOT_OPTIONS = {"load(path)", "save(path)", "load(p1, p2, …)", "Trigger.AvailableNow"}


def tables(doc: str, section: str):
    """(option names, default cell) of each row of the option tables under ``## section``."""
    text = (DOCS / doc).read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows, inside = [], False
    for line in body.splitlines():
        if line.startswith("| option | default |"):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        if not inside or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        names = [n for n in re.findall(r"`([^`]+)`", cells[0]) if n not in NOT_OPTIONS]
        rows.append((names, cells[1]))
    assert rows, f"no option table in {doc} § {section}"
    return rows


READ_DOCS = [("user-guide.md", "Reading", False), ("streaming.md", "The source: options compared with Spark's Kafka connector", True)]
WRITE_DOCS = [("user-guide.md", "Writing", False), ("spark-write.md", "Options", False)]


def covered(table, name: str):
    """The table's rows a docs name stands for."""
    if name.endswith("*"):
        prefix = name[:-1].lower()
        rows = [k for k in table.keys() if k.name.lower().startswith(prefix)]
        family = table.lookup(prefix + "x")
        return rows or ([family] if family is not None else [])
    row = table.lookup(name)
    return [row] if row is not None else []


def default_cell(key, streaming: bool) -> str:
    default = STREAMING_DEFAULTS.get(key.name, key.default) if streaming else key.default
    if key.required:
        return "required"
    if default is None:
        return "—"
    return str(default).lower() if isinstance(default, bool) else str(default)


def documented(cell: str) -> str:
    cell = cell.replace("*", "")
    if cell.startswith("—"):
        return "—"
    if cell.startswith("required"):
        return "required"
    found = re.search(r"`([^`]+)`", cell)
    return found.group(1) if found else cell


@pytest.mark.parametrize("table, docs, extra", [(READ_OPTIONS, READ_DOCS, set()),
                                                 (WRITE_OPTIONS, WRITE_DOCS, set(_READ_ONLY))],
                         ids=["read", "write"])
def test_every_documented_option_is_in_the_table_with_its_default(table, docs, extra):
    for doc, section, streaming in docs:
        for names, cell in tables(doc, section):
            for name in names:
                rows = covered(table, name)
                if not rows:
                    assert name.lower() in extra, f"{doc}: {name} is not a {table.config.what}"
                    continue
                exact = table.lookup(name) is not None and not name.endswith("*") and (
                    table.lookup(name).name.lower() == name.lower())
                if exact and name.lower() not in extra:
                    assert documented(cell) == default_cell(rows[0], streaming), (
                        f"{doc}: the default of {name}")


@pytest.mark.parametrize("table, doc, section", [
    (READ_OPTIONS, "user-guide.md", "Reading"), (WRITE_OPTIONS, "spark-write.md", "Options")],
    ids=["read", "write"])
def test_every_option_of_the_table_is_documented(table, doc, section):
    named = set()
    for names, _ in tables(doc, section):
        for name in names:
            named.update(k.name for k in covered(table, name))
    missing = [k.name for k in table.keys()
               if k.name not in named and not table.options[k.name].hidden]
    assert not missing, f"{doc} § {section} has no row for {missing}"


def test_the_dataclass_defaults_are_the_tables():
    read = ReadOptions()
    for key in READ_OPTIONS.keys():
        if READ_OPTIONS.options[key.name].kind in ("supported", "streaming") and \
                hasattr(read, key.attr) and key.attr not in ("path", "client_id", "stats_file"):
            assert getattr(read, key.attr) == READ_OPTIONS.default(key.name), key.name
    assert read.max_partition_bytes == DEFAULT_MAX_PARTITION_BYTES
    assert read.open_cost_in_bytes == DEFAULT_OPEN_COST_IN_BYTES
