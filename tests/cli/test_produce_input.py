"""``kafkalog produce`` input lines out of what the format can store (a timestamp past a signed
64-bit int, below -1, headers that are not a list, a header key that is no UTF-8): in both modes
(``--cluster`` and ``--log-dir``), a real process exits 2 with one line naming the line number and
the problem, no traceback, and writes nothing, not even the line before the bad one."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from support.cli_support import run_cli
from pyspark_kafkalog.admin import Admin

NOW = 1_700_000_000_000
GOOD = json.dumps({"value": base64.b64encode(b"ok").decode(), "timestamp": NOW}) + "\n"


pytestmark = pytest.mark.slow   # a CLI process per bad input line (~6 s)


def files(root: Path) -> dict:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(params=["cluster", "log-dir"])
def mode(request, tmp_path):
    """(argv of `produce` in that mode, the directory it would write)."""
    root = tmp_path / "d"
    if request.param == "cluster":
        Admin(str(root)).create_topic("t", 1)
        return ["--cluster", root, "--json", "produce", "--topic", "t"], root
    return ["produce", "--log-dir", root, "--topic", "t", "--partition", 0], root


BAD = [
    ('{"timestamp": 9223372036854775808}', "timestamp 9223372036854775808 is out of range"),
    ('{"timestamp": 99999999999999999999999}', "timestamp 99999999999999999999999 is out of "
                                               "range"),
    ('{"timestamp": -2}', "timestamp -2 is out of range"),
    ('{"timestamp": -9223372036854775809}', "timestamp -9223372036854775809 is out of range"),
    ('{"timestamp": 1.5}', "timestamp must be an integer (ms), got 1.5"),
    ('{"timestamp": true}', "timestamp must be an integer (ms), got true"),
    ('{"headers": 5}', "headers must be a JSON array"),
    ('{"headers": {"key": "a"}}', "headers must be a JSON array"),
    ('{"headers": [{"key": "\\ud800"}]}', "is not valid Unicode"),
]


@pytest.mark.parametrize("bad,problem", BAD, ids=[b for b, _ in BAD])
def test_bad_line_is_one_error_line_and_nothing_is_written(mode, bad, problem):
    argv, root = mode
    before = files(root)
    rc, out, err = run_cli(*argv, stdin=GOOD + bad + "\n")
    assert rc == 2, (out, err)
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith("kafkalog: error: InvalidRecordError: line 2: "), err
    assert problem in err, err
    assert files(root) == before


def test_the_bounds_themselves_are_taken(mode):
    argv, root = mode
    lines = "".join(json.dumps({"value": None, "timestamp": ts}) + "\n"
                    for ts in (2**63 - 1, -1, 0))
    rc, out, err = run_cli(*argv, stdin=lines)
    assert rc == 0, err
    assert [json.loads(x)["offset"] for x in out.splitlines()] == [0, 1, 2]
    (log,) = root.glob("**/t-0/*.log")
    rc, out, err = run_cli("--json", "dump", "--files", log, "--deep-iteration")
    assert rc == 0, err
    assert [json.loads(x)["timestamp"] for x in out.splitlines()] == [2**63 - 1, -1, 0]
