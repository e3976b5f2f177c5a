"""``produce``/``consume --format text`` as Kafka's console tools read and print lines, byte for
byte, against ``--format json`` (base64) and ``json-text``; properties by Kafka's names."""
from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from support.cli_support import REPO, digests, run_cli

import os


pytestmark = pytest.mark.slow   # a CLI process per console round trip (~5 s)


def _bytes_cli(*argv, stdin: bytes = b""):
    """``kafkalog ARGV`` with bytes in and out (the text formats carry any byte)."""
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace")


def _json_records(url):
    rc, out, err = run_cli("--cluster", url, "consume", "--topic", "t")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    dec = lambda v: None if v is None else base64.b64decode(v)  # noqa: E731
    return [(dec(r["key"]), dec(r["value"])) for r in rows]


def test_text_lines_in_and_out_are_the_records_bytes(tmp_path):
    url = tmp_path / "c"
    assert run_cli("--cluster", url, "topics", "--create", "--topic", "t")[0] == 0
    lines = [b"k1\tv1", b"k2\tvalue with\ta tab", b"\xff\xfe-key\t\x00bytes\xc3", b"k4\t",
             b"\tvalue only"]
    rc, out, err = _bytes_cli("--cluster", url, "produce", "--topic", "t", "--format", "text",
                              "--property", "parse.key=true", stdin=b"\r\n".join(lines) + b"\n")
    assert rc == 0, err
    want = [tuple(line.split(b"\t", 1)) for line in lines]
    assert _json_records(url) == want                      # the same bytes as JSON shows them
    rc, out, err = _bytes_cli("--cluster", url, "consume", "--topic", "t", "--format", "text",
                              "--property", "print.key=true")
    assert rc == 0, err
    assert out == b"".join(k + b"\t" + v + b"\n" for k, v in want)
    rc, out, err = _bytes_cli("--cluster", url, "consume", "--topic", "t", "--format", "text",
                              "--property", "print.offset=true", "--property",
                              "print.partition=true", "--property", "key.separator=|",
                              "--max-records", "1")
    assert (rc, out) == (0, b"Partition:0|Offset:0|v1\n"), err


def test_json_in_text_out_and_plain_values(tmp_path):
    url = tmp_path / "c"
    assert run_cli("--cluster", url, "topics", "--create", "--topic", "t")[0] == 0
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    lines = [{"key": None, "value": b64(b"plain")},
             {"key": b64(b"k"), "value": None, "headers": [{"key": "h", "value": b64(b"1")}]}]
    rc, _, err = run_cli("--cluster", url, "produce", "--topic", "t", "--partition", "0",
                         stdin="".join(json.dumps(line) + "\n" for line in lines))
    assert rc == 0, err
    rc, out, err = _bytes_cli("--cluster", url, "consume", "--topic", "t", "--format", "text",
                              "--property", "print.key=true", "--property", "print.headers=true")
    assert (rc, out) == (0, b"NO_HEADERS\tnull\tplain\nh:1\tk\tnull\n"), err
    # plain text lines without a key: each line a value, an empty line an empty value
    rc, _, err = _bytes_cli("--cluster", url, "produce", "--topic", "t", "--partition", "0",
                            "--format", "text", stdin=b"one\n\nthree\n")
    assert rc == 0, err
    assert _json_records(url)[2:] == [(None, b"one"), (None, b""), (None, b"three")]


def test_json_text_prints_strings_and_refuses_bytes_that_are_not_utf8(tmp_path):
    url = tmp_path / "c"
    assert run_cli("--cluster", url, "topics", "--create", "--topic", "t")[0] == 0
    assert _bytes_cli("--cluster", url, "produce", "--topic", "t", "--format", "text",
                      stdin="grüße\n".encode())[0] == 0
    rc, out, err = run_cli("--cluster", url, "consume", "--topic", "t", "--format", "json-text")
    assert rc == 0 and json.loads(out)["value"] == "grüße", err
    assert _bytes_cli("--cluster", url, "produce", "--topic", "t", "--format", "text",
                      stdin=b"\xff\n")[0] == 0
    rc, out, err = run_cli("--cluster", url, "consume", "--topic", "t", "--format", "json-text")
    assert rc == 2 and "offset 1: the value is not UTF-8; --format json" in err


def test_bad_input_and_properties_change_nothing(tmp_path):
    url = tmp_path / "c"
    assert run_cli("--cluster", url, "topics", "--create", "--topic", "t")[0] == 0
    before = digests(url)
    for argv, stdin, message in [
            (["--format", "text", "--property", "parse.key=true"], b"ok\tv\nno separator\n",
             "line 2: no key separator '\\t' (parse.key=true)"),
            (["--format", "text", "--property", "parse.keys=true"], b"x\n",
             "unknown --property 'parse.keys'"),
            (["--format", "text", "--property", "parse.key=yes"], b"x\n",
             "--property parse.key takes true or false"),
            (["--property", "parse.key=true"], b"{}\n", "--property applies to --format text")]:
        rc, _, err = _bytes_cli("--cluster", url, "produce", "--topic", "t", *argv, stdin=stdin)
        assert rc == 2 and message in err, (argv, err)
    assert digests(url) == before
    rc, _, err = run_cli("--cluster", url, "consume", "--topic", "t", "--format", "text",
                         "--property", "print.nothing=true")
    assert rc == 2 and "unknown --property 'print.nothing'" in err


def test_raw_mode_takes_text_too_and_the_help_describes_the_formats(tmp_path):
    rc, out, err = _bytes_cli("produce", "--log-dir", tmp_path / "ld", "--topic", "t",
                              "--partition", "0", "--format", "text", stdin=b"a\nb\n")
    assert rc == 0, err
    assert len(out.splitlines()) == 2
    rc, out, _ = run_cli("produce", "--help")
    assert "--format text: kafka-console-producer's lines" in " ".join(out.split())
    rc, out, _ = run_cli("consume", "--help")
    text = " ".join(out.split())
    assert "kafka-console-consumer's lines" in text and "json-text" in text
