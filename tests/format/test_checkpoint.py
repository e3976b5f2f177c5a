"""Checkpoint/metadata text codecs against Kafka-written golden files and JDK-recorded vectors."""
import datetime as dt
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st


from pyspark_kafkalog.errors import (CorruptRecordError, InvalidPartitionsError,  # noqa: E402
                                     InvalidRequestError, InvalidTopicError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format import checkpoint as cp  # noqa: E402
from support.shared_paths import GOLDEN, GOLDEN_CASE_COUNT, needs_golden  # noqa: E402

PARTITION_DIRS = sorted(p for p in GOLDEN.glob("*-0") if p.is_dir())
ROOT_CHECKPOINTS = ["replication-offset-checkpoint", "log-start-offset-checkpoint",
                    "recovery-point-offset-checkpoint"]


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # no newline translation


# Properties.load on JDK 17 and JDK 25 (identical); None: IllegalArgumentException.
JAVA_LOAD_VECTORS = [
    ('a=b', {'a': 'b'}),
    ('a:b', {'a': 'b'}),
    ('a b', {'a': 'b'}),
    ('a   =   b', {'a': 'b'}),
    ('a\t:\tb  ', {'a': 'b  '}),
    ('  key = value with spaces  ', {'key': 'value with spaces  '}),
    ('# comment\n! comment\na=1', {'a': '1'}),
    ('a=hello \\\n    world', {'a': 'hello world'}),
    ('a=x\\\\\n b=y', {'a': 'x\\', 'b': 'y'}),
    ('key\\ with\\ space=v', {'key with space': 'v'}),
    ('k\\=x=v', {'k=x': 'v'}),
    ('k\\:x:v', {'k:x': 'v'}),
    ('\\u0041\\u00e9=\\t\\n\\r\\f\\\\', {'Aé': '\t\n\r\x0c\\'}),
    ('a=', {'a': ''}),
    ('a', {'a': ''}),
    ('=b', {'': 'b'}),
    (':b', {'': 'b'}),
    (' =b', {'': 'b'}),
    ('a=b\\', {'a': 'b'}),
    ('a=1\r\nb=2\rc=3\n', {'a': '1', 'b': '2', 'c': '3'}),
    ('a==b', {'a': '=b'}),
    ('a =: b', {'a': ': b'}),
    ('# c\\\na=1', {'a': '1'}),
    ('a=1\\\n#x', {'a': '1#x'}),
    ('x\\\n', {'x': ''}),
    ('a=1\na=2', {'a': '2'}),
    ('\n\n  \t\x0c\n a = 1 \n', {'a': '1 '}),
    ('a=1\\\n\nb=2', {'a': '1', 'b': '2'}),
    ('a\\\\=b', {'a\\': 'b'}),
    ('a\\\\\\=b=c', {'a\\=b': 'c'}),
    ('\\ a=b', {' a': 'b'}),
    ('a=\\ b', {'a': ' b'}),
    ('a\\tb=c', {'a\tb': 'c'}),
    ('k=\\q\\z', {'k': 'qz'}),
    ('a\\\r\n  b=c', {'ab': 'c'}),
    ('!x=1\n#y=2\n z=3', {'z': '3'}),
    ('a\x0c=\x0cb', {'a': 'b'}),
    ('k=v\\\\\\\n  w', {'k': 'v\\w'}),
    ('é=ü', {'é': 'ü'}),
    ('\x0bk=v', {'\x0bk': 'v'}),
    ('k=v\x0b', {'k': 'v\x0b'}),
    ('a:=b', {'a': '=b'}),
    ('a: =b', {'a': '=b'}),
    ('a\t\tb c', {'a': 'b c'}),
    ('version=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\nnode.id=1\n', {'cluster.id': 'MkU3OEVBNTcwNTJENDM2Qk', 'node.id': '1', 'version': '1'}),
    ('#\n#Thu Sep 12 10:15:30 UTC 2024\nnode.id=1\n', {'node.id': '1'}),
    ('\\uZZZZ=1', None),
    ('a=\\u12', None),
    ('a=\\u12g4', None),
]
# Properties.store(writer, "") bodies: (entries in insertion order, JDK 17 body, JDK 25 body)
JAVA_STORE_VECTORS = [
    ([('version', '1'), ('cluster.id', 'MkU3OEVBNTcwNTJENDM2Qk'), ('node.id', '1'), ('directory.id', 'J8aAPcfLQt2bqs1JT_rMgQ')],
     'node.id=1\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\nversion=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n',
     'cluster.id=MkU3OEVBNTcwNTJENDM2Qk\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\nnode.id=1\nversion=1\n'),
    ([('version', '0'), ('cluster.id', 'abc'), ('broker.id', '3')],
     'broker.id=3\nversion=0\ncluster.id=abc\n',
     'broker.id=3\ncluster.id=abc\nversion=0\n'),
    ([('version', '0')],
     'version=0\n',
     'version=0\n'),
    ([('version', '1'), ('cluster.id', 'x'), ('node.id', '7')],
     'node.id=7\nversion=1\ncluster.id=x\n',
     'cluster.id=x\nnode.id=7\nversion=1\n'),
    ([('version', '0'), ('broker.id', '0'), ('directory.id', 'J8aAPcfLQt2bqs1JT_rMgQ')],
     'broker.id=0\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\nversion=0\n',
     'broker.id=0\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\nversion=0\n'),
    ([('version', '0'), ('z:d', '_d9_z'), ('7g', ''), ('_d5ncf', 'c'), ('.epf80d', 'is.j'), ('o=', 'h9t8')],
     '7g=\nz\\:d=_d9_z\n_d5ncf=c\nversion=0\n.epf80d=is.j\no\\==h9t8\n',
     '.epf80d=is.j\n7g=\n_d5ncf=c\no\\==h9t8\nversion=0\nz\\:d=_d9_z\n'),
    ([('version', '0'), ('g_9', 'w-4_2'), ('xg8\t', ''), ('9d', 'fr3\\#e'), ('4!70', ''), ('2_2xtp', '\\t:9!'), ('\\pf', '1s\ty#w'), ('64vé1', ''), ('-eh5.', 'wk '), ('vj4', ''), ('c#e89uv', 'dns')],
     'g_9=w-4_2\n-eh5.=wk \nvj4=\n64vé1=\n\\\\pf=1s\\ty\\#w\nxg8\\t=\n2_2xtp=\\\\t\\:9\\!\n9d=fr3\\\\\\#e\nc\\#e89uv=dns\nversion=0\n4\\!70=\n',
     '-eh5.=wk \n2_2xtp=\\\\t\\:9\\!\n4\\!70=\n64vé1=\n9d=fr3\\\\\\#e\n\\\\pf=1s\\ty\\#w\nc\\#e89uv=dns\ng_9=w-4_2\nversion=0\nvj4=\nxg8\\t=\n'),
    ([('version', '0'), ('zz4f', 'i0'), ('1z8', '8r\t.w!')],
     'zz4f=i0\nversion=0\n1z8=8r\\t.w\\!\n',
     '1z8=8r\\t.w\\!\nversion=0\nzz4f=i0\n'),
    ([('version', '0'), ('jflj', '!8zzzz'), ('#oa4', ''), ('qsa', '=zd'), ('.7x', 'e'), ('i\\5 :!', '1'), ('2', 'h')],
     'i\\\\5\\ \\:\\!=1\n2=h\njflj=\\!8zzzz\nversion=0\n\\#oa4=\nqsa=\\=zd\n.7x=e\n',
     '\\#oa4=\n.7x=e\n2=h\ni\\\\5\\ \\:\\!=1\njflj=\\!8zzzz\nqsa=\\=zd\nversion=0\n'),
    ([('version', '0'), ('g', 'w-'), ('9', '3h'), ('7gx', ''), ('e', '4233tf'), (' yj=', 'g')],
     'e=4233tf\ng=w-\n7gx=\n9=3h\n\\ yj\\==g\nversion=0\n',
     '\\ yj\\==g\n7gx=\n9=3h\ne=4233tf\ng=w-\nversion=0\n'),
    ([('version', '0'), ('3\\k6b', '=o'), ('6xj\\', 'mpzo'), ('6', '6'), (':f\\q6', 'wéb'), ('kwo775', '')],
     '3\\\\k6b=\\=o\n\\:f\\\\q6=wéb\nkwo775=\n6=6\nversion=0\n6xj\\\\=mpzo\n',
     '3\\\\k6b=\\=o\n6=6\n6xj\\\\=mpzo\n\\:f\\\\q6=wéb\nkwo775=\nversion=0\n'),
    ([('version', '0'), ('qm\\-w1éw', 'm3l0=v'), ('fogo3m', ''), ('n3  a3', 'éz2zfé'), (':f#hy\t', 'k')],
     'fogo3m=\nn3\\ \\ a3=éz2zfé\n\\:f\\#hy\\t=k\nversion=0\nqm\\\\-w1éw=m3l0\\=v\n',
     '\\:f\\#hy\\t=k\nfogo3m=\nn3\\ \\ a3=éz2zfé\nqm\\\\-w1éw=m3l0\\=v\nversion=0\n'),
    ([('version', '0'), ('j', '8iba'), (':j -3#wj', 'é:g6i0')],
     '\\:j\\ -3\\#wj=é\\:g6i0\nj=8iba\nversion=0\n',
     '\\:j\\ -3\\#wj=é\\:g6i0\nj=8iba\nversion=0\n'),
    ([('version', '0'), ('bqns', '5i7'), ('_uq7', '6'), ('idw2#_6', 'b1l-')],
     '_uq7=6\nidw2\\#_6=b1l-\nbqns=5i7\nversion=0\n',
     '_uq7=6\nbqns=5i7\nidw2\\#_6=b1l-\nversion=0\n'),
]


# -- golden files -------------------------------------------------------------------------------

@needs_golden
def test_golden_inventory():
    assert len(PARTITION_DIRS) == GOLDEN_CASE_COUNT


@needs_golden
@pytest.mark.parametrize("name", ROOT_CHECKPOINTS)
def test_golden_offset_checkpoints(name):
    text = _read(GOLDEN / name)
    offsets = cp.parse_offset_checkpoint(text)
    assert len(offsets) == 26 and all(p == 0 for _, p in offsets)
    assert cp.format_offset_checkpoint(offsets) == text
    # Cross-check the values against the records (README: undamaged cases only).
    for (topic, _), offset in offsets.items():
        lines = (GOLDEN / f"{topic}-0" / "expected.jsonl").read_text().splitlines()
        first, last = json.loads(lines[0])["offset"], json.loads(lines[-1])["offset"]
        expected = first if name == "log-start-offset-checkpoint" else last + 1
        assert offset == expected, topic


@needs_golden
@pytest.mark.parametrize("d", PARTITION_DIRS, ids=lambda p: p.name)
def test_golden_partition_files(d):
    text = _read(d / "leader-epoch-checkpoint")
    entries = cp.parse_leader_epoch_checkpoint(text)
    assert entries and all(isinstance(e, cp.EpochEntry) for e in entries)
    assert cp.format_leader_epoch_checkpoint(entries) == text
    text = _read(d / "partition.metadata")
    topic_id = cp.parse_partition_metadata(text)
    assert len(topic_id) == 22 and not text.endswith("\n")
    assert cp.format_partition_metadata(topic_id) == text
    assert cp.topic_id_from_bytes(cp.topic_id_to_bytes(topic_id)) == topic_id


# -- offset and leader-epoch checkpoints --------------------------------------------------------

topics = st.text("abcXYZ019._-", min_size=1, max_size=30).filter(lambda t: t not in (".", ".."))


@given(st.dictionaries(st.tuples(topics, st.integers(0, 2**31 - 1)),
                       st.integers(-2**63, 2**63 - 1), max_size=20))
@settings(max_examples=100, deadline=None)
def test_offset_checkpoint_round_trip(offsets):
    text = cp.format_offset_checkpoint(offsets)
    parsed = cp.parse_offset_checkpoint(text)
    assert parsed == offsets and list(parsed) == list(offsets)
    assert cp.format_offset_checkpoint(parsed) == text
    # Kafka reads with readLine, so CRLF files parse the same.
    assert cp.parse_offset_checkpoint(text.replace("\n", "\r\n")) == offsets


@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=20))
@settings(max_examples=100, deadline=None)
def test_leader_epoch_round_trip(entries):
    text = cp.format_leader_epoch_checkpoint(entries)
    assert cp.parse_leader_epoch_checkpoint(text) == [cp.EpochEntry(*e) for e in entries]


def test_checkpoint_layout_and_leniency():
    assert cp.format_offset_checkpoint({("t", 0): 5, ("t", 1): 7}) == "0\n2\nt 0 5\nt 1 7\n"
    assert cp.format_offset_checkpoint({}) == "0\n0\n"
    # Kafka reads an empty file, or one with only a version line, as no entries.
    assert cp.parse_offset_checkpoint("") == {} and cp.parse_offset_checkpoint("0\n") == {}
    # Fields split on \s+, trailing whitespace ignored, signs accepted (Integer.parseInt).
    assert cp.parse_offset_checkpoint("0\n1\nt\t+3  \x0b-4 \n") == {("t", 3): -4}
    # A repeated partition: first position, last value (Kafka's HashMap keeps the last).
    assert list(cp.parse_offset_checkpoint("0\n3\na 0 1\nb 0 2\na 0 3\n").items()) == [
        (("a", 0), 3), (("b", 0), 2)]
    assert cp.parse_leader_epoch_checkpoint("0\n2\n3 10\n1 5\n") == [(3, 10), (1, 5)]


@pytest.mark.parametrize("text, error, match", [
    ("1\n0\n", UnsupportedVersionError, "line 1: version 1"),
    ("x\n0\n", CorruptRecordError, "line 1 .*'x' is not"),
    ("0\nzero\n", CorruptRecordError, "line 2 .*'zero'"),
    ("0\n-1\n", CorruptRecordError, "line 2: negative"),
    ("0\n2\nt 0 5\n", CorruptRecordError, "line 2: declares 2 entries but 1"),
    ("0\n0\nt 0 5\n", CorruptRecordError, "declares 0 entries but 1"),
    ("0\n1\nt 0\n", CorruptRecordError, "line 3: expected 3 fields, found 2"),
    ("0\n1\nt 0 5 6\n", CorruptRecordError, "line 3: expected 3 fields, found 4"),
    ("0\n1\n t 0 5\n", CorruptRecordError, "line 3: expected 3 fields, found 4"),
    ("0\n2\nt 0 5\n\n", CorruptRecordError, "line 4: expected 3 fields, found 1"),
    ("0\n1\nt x 5\n", CorruptRecordError, "line 3 .partition.: 'x'"),
    ("0\n1\nt 2147483648 5\n", CorruptRecordError, "line 3 .partition.*32-bit"),
    ("0\n1\nt 0 9223372036854775808\n", CorruptRecordError, "line 3 .offset.*64-bit"),
    ("0\n1\nt 0 1_000\n", CorruptRecordError, "line 3 .offset."),
    ("\ufeff0\n0\n", CorruptRecordError, "line 1"),
])
def test_offset_checkpoint_malformed(text, error, match):
    with pytest.raises(error, match=match):
        cp.parse_offset_checkpoint(text)


@pytest.mark.parametrize("text, match", [
    ("0\n1\n-1 5\n", "line 3: negative"),
    ("0\n1\n1 -5\n", "line 3: negative"),
    ("0\n1\n1 5 9\n", "line 3: expected 2 fields"),
    ("0\n1\n2147483648 5\n", "line 3 .epoch."),
])
def test_leader_epoch_malformed(text, match):
    with pytest.raises(CorruptRecordError, match=match):
        cp.parse_leader_epoch_checkpoint(text)


@pytest.mark.parametrize("topic", ["my topic", "", ".", "..", "a" * 250, "t\n", "tö", "a/b"])
def test_format_rejects_impossible_topics(topic):
    with pytest.raises(InvalidTopicError):
        cp.format_offset_checkpoint({(topic, 0): 1})


def test_format_rejects_bad_numbers():
    cp.format_offset_checkpoint({("a" * 249, 0): 1})
    with pytest.raises(InvalidPartitionsError):
        cp.format_offset_checkpoint({("t", -1): 1})
    with pytest.raises(InvalidRequestError):
        cp.format_offset_checkpoint({("t", 0): 2**63})
    with pytest.raises(InvalidRequestError):
        cp.format_leader_epoch_checkpoint([(-1, 0)])
    with pytest.raises(InvalidRequestError):
        cp.format_leader_epoch_checkpoint([(0, True)])


# -- topic ids and partition.metadata -----------------------------------------------------------

@given(st.binary(min_size=16, max_size=16))
def test_topic_id_bytes_round_trip(raw):
    topic_id = cp.topic_id_from_bytes(raw)
    assert len(topic_id) == 22 and cp.topic_id_to_bytes(topic_id) == raw
    assert cp.topic_id_to_bytes(topic_id + "==") == raw
    if raw != bytes(16):
        text = cp.format_partition_metadata(topic_id)
        assert text == f"version: 0\ntopic_id: {topic_id}"
        assert cp.parse_partition_metadata(text) == topic_id


def test_new_topic_id():
    ids = {cp.new_topic_id() for _ in range(2000)}
    assert len(ids) == 2000
    for topic_id in ids:
        raw = cp.topic_id_to_bytes(topic_id)
        assert not topic_id.startswith("-") and len(topic_id) == 22
        assert raw[6] >> 4 == 4 and raw[8] >> 6 == 0b10  # java.util.UUID.randomUUID: v4, IETF
        assert topic_id not in (cp.ZERO_UUID, cp.METADATA_TOPIC_ID)
    assert cp.topic_id_to_bytes(cp.METADATA_TOPIC_ID) == bytes(15) + b"\x01"


@pytest.mark.parametrize("bad", ["", "A" * 21, "A" * 23, "A" * 22 + "=", "A" * 22 + "===",
                                 "A" * 21 + "+", "A" * 21 + "/", "A" * 21 + " "])
def test_topic_id_rejects(bad):
    with pytest.raises(InvalidRequestError):
        cp.topic_id_to_bytes(bad)


def test_partition_metadata_leniency():
    # Like Java's decoder, unused low bits of the last character are ignored.
    assert cp.parse_partition_metadata("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAR") == \
        cp.METADATA_TOPIC_ID
    # Kafka accepts later versions (downgrade compatibility), CRLF, a final newline, any names.
    assert cp.parse_partition_metadata("version: 3\r\ntopic_id:\tEjRWeK7XjKQP7cuph2VDIQ\r\n") == \
        "EjRWeK7XjKQP7cuph2VDIQ"
    assert cp.parse_partition_metadata("v: 0\nid: EjRWeK7XjKQP7cuph2VDIQ==\nextra") == \
        "EjRWeK7XjKQP7cuph2VDIQ"


@pytest.mark.parametrize("text, error, match", [
    ("", CorruptRecordError, "empty"),
    ("version: -1\ntopic_id: EjRWeK7XjKQP7cuph2VDIQ", UnsupportedVersionError, "version -1"),
    ("version:0\ntopic_id: EjRWeK7XjKQP7cuph2VDIQ", CorruptRecordError, "line 1"),
    ("version: zero\ntopic_id: EjRWeK7XjKQP7cuph2VDIQ", CorruptRecordError, "line 1"),
    ("version: 0", CorruptRecordError, "line 2: missing"),
    ("version: 0\ntopic_id EjRWeK7XjKQP7cuph2VDIQ", CorruptRecordError, "line 2"),
    ("version: 0\ntopic_id: EjRWeK7XjKQP7cuph2VDI", CorruptRecordError, "line 2"),
    ("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", CorruptRecordError, "line 2: the zero"),
])
def test_partition_metadata_malformed(text, error, match):
    with pytest.raises(error, match=match):
        cp.parse_partition_metadata(text)


def test_format_partition_metadata_rejects_zero():
    with pytest.raises(InvalidRequestError):
        cp.format_partition_metadata(cp.ZERO_UUID)


# -- java.util.Properties / meta.properties -----------------------------------------------------

@pytest.mark.parametrize("text, expected", JAVA_LOAD_VECTORS)
def test_parse_properties_matches_java(text, expected):
    if expected is None:
        with pytest.raises(CorruptRecordError, match=r"line 1: malformed \\uxxxx"):
            cp.parse_properties(text)
    else:
        assert cp.parse_properties(text) == expected


def test_parse_properties_error_names_line():
    with pytest.raises(CorruptRecordError, match="line 3"):
        cp.parse_properties("# c\na=1\nb=\\u00\n")


@pytest.mark.parametrize("entries, jdk17, jdk25", JAVA_STORE_VECTORS)
def test_format_meta_properties_matches_java(entries, jdk17, jdk25):
    props = dict(entries)
    for order, body in (("hash", jdk17), ("sorted", jdk25)):
        text = cp.format_meta_properties(props, "Thu Sep 12 10:15:30 UTC 2024", key_order=order)
        assert text == "#\n#Thu Sep 12 10:15:30 UTC 2024\n" + body
        assert cp.parse_properties(text) == props


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=8))
@settings(max_examples=150, deadline=None)
def test_properties_round_trip(extra):
    props = {**{k: v for k, v in extra.items() if k not in ("version", "broker.id", "node.id",
                                                             "cluster.id", "directory.id")},
             "version": "0"}
    for order in ("sorted", "hash"):
        assert cp.parse_properties(cp.format_meta_properties(props, "x", key_order=order)) == props


def test_meta_properties_kafka_rules():
    text = cp.format_meta_properties({"version": 1, "cluster.id": "c", "node.id": 2,
                                      "directory.id": "J8aAPcfLQt2bqs1JT_rMgQ"})
    assert text.startswith("#\n#") and text.endswith("node.id=2\nversion=1\n")
    assert cp.parse_meta_properties(text)["node.id"] == "2"
    assert cp.parse_meta_properties("version= 1 \nnode.id=1\ncluster.id=c\n")  # version trimmed
    assert cp.parse_meta_properties("broker.id=4\n") == {"broker.id": "4"}  # v0 by default
    with pytest.raises(UnsupportedVersionError, match="version 2"):
        cp.parse_meta_properties("version=2\nnode.id=1\ncluster.id=c\n")
    with pytest.raises(CorruptRecordError, match="requires node.id"):
        cp.parse_meta_properties("version=1\ncluster.id=c\n")
    with pytest.raises(CorruptRecordError, match="requires cluster.id"):
        cp.parse_meta_properties("version=1\nnode.id=1\n")
    with pytest.raises(CorruptRecordError, match="node.id"):
        cp.parse_meta_properties("version=1\nnode.id=1 \ncluster.id=c\n")  # not trimmed
    with pytest.raises(CorruptRecordError, match="directory.id"):
        cp.parse_meta_properties("version=0\ndirectory.id=nope\n")
    with pytest.raises(InvalidRequestError):
        cp.format_meta_properties({"version": "1", "node.id": "1"})
    with pytest.raises(InvalidRequestError):
        cp.format_meta_properties({"version": "0"}, "two\nlines")
    with pytest.raises(InvalidRequestError):
        cp.format_meta_properties({"version": "0"}, key_order="random")
    with pytest.raises(InvalidRequestError, match="11"):
        cp.format_meta_properties({"version": "0", **{f"k{i}": "" for i in range(11)}},
                                  key_order="hash")


def test_java_date():
    utc = dt.timezone.utc
    assert cp.java_date(dt.datetime(2024, 9, 12, 10, 15, 30, tzinfo=utc)) == \
        "Thu Sep 12 10:15:30 UTC 2024"
    assert cp.java_date(dt.datetime(2024, 1, 1, 0, 0, 5, tzinfo=utc)) == \
        "Mon Jan 01 00:00:05 UTC 2024"
    assert cp.format_meta_properties({"version": "0"}).split("\n")[1].endswith(
        f"UTC {dt.datetime.now(utc).year}")
