"""docs/protocol.md §2.2 against ``cluster/actions.py``: every metadata action has its field table
in the protocol, and the table names the fields the action's dataclass has, each required or
optional as the code takes it.

The protocol is the promise between clients of different versions (a field the doc omits is one
another implementation would refuse, §2.3), so a field added to an action and not to its table
fails here, naming the action and the field."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from pyspark_kafkalog.cluster.actions import ACTIONS

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
#: a paragraph that describes an action starts with its name in bold code
ACTION_LINE = re.compile(r"^\*\*`([a-z_]+)`\*\*")
FIELD_HEADER = re.compile(r"^\|\s*field\s*\|\s*type\s*\|\s*required\s*\|")
ROW = re.compile(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`\s*\|([^|]*)\|([^|]*)\|")


def field_tables(text: str) -> Dict[str, List[Tuple[str, bool, int]]]:
    """{op: [(field, required, line number)]}: the first field table after each action's
    paragraph, before the next action or heading."""
    tables: Dict[str, List[Tuple[str, bool, int]]] = {}
    current, lines = None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = ACTION_LINE.match(line)
        if line.startswith("#"):
            current = None
        elif m:
            current = m.group(1) if m.group(1) in ACTIONS or m.group(1) not in tables else None
        elif current and FIELD_HEADER.match(line):
            rows, i = [], i + 2                      # past the header and the --- row
            while i < len(lines) and lines[i].startswith("|"):
                r = ROW.match(lines[i])
                assert r, f"protocol.md:{i + 1}: a row of {current}'s field table without a " \
                          f"`field` name: {lines[i]!r}"
                required = r.group(3).strip().lower()
                assert required == "yes" or required.startswith("no"), \
                    f"protocol.md:{i + 1}: {current}.{r.group(1)} is neither 'yes' nor 'no ...' " \
                    f"required: {required!r}"
                rows.append((r.group(1), required == "yes", i + 1))
                i += 1
            tables.setdefault(current, rows)
            current = None
            continue
        i += 1
    return tables


TABLES = field_tables(PROTOCOL.read_text(encoding="utf-8"))


def test_the_tables_were_found():
    assert len(TABLES) >= 10, f"protocol.md's field tables were not found: {sorted(TABLES)}"


@pytest.mark.parametrize("op", sorted(ACTIONS))
def test_every_action_has_its_fields_in_protocol_md(op):
    cls = ACTIONS[op]
    assert op in TABLES, (f"action {op!r} ({cls.__name__} in cluster/actions.py) has no field "
                          f"table in docs/protocol.md (a paragraph starting **`{op}`** and a "
                          "| field | type | required | meaning | table)")
    documented = {name: (required, line) for name, required, line in TABLES[op]}
    code = {f.name: f.metadata["required"] for f in dataclasses.fields(cls)}
    problems = []
    missing = sorted(set(code) - set(documented))
    extra = sorted(set(documented) - set(code))
    if missing:
        problems.append(f"fields in actions.py but not in protocol.md: {', '.join(missing)}")
    if extra:
        problems.append("fields in protocol.md but not in actions.py: "
                        + ", ".join(f"{n} (line {documented[n][1]})" for n in extra))
    for name in sorted(set(code) & set(documented)):
        doc_required, line = documented[name]
        if doc_required != code[name]:
            problems.append(f"{name}: protocol.md:{line} says "
                            f"{'required' if doc_required else 'optional'}, actions.py "
                            f"{'required' if code[name] else 'optional'}")
    assert not problems, f"action {op!r} ({cls.__name__}): " + "; ".join(problems)


def test_every_documented_action_exists():
    unknown = sorted(set(TABLES) - set(ACTIONS))
    assert not unknown, f"protocol.md has field tables for actions actions.py lacks: {unknown}"
