"""`kafkalog` exit statuses, as `--help` states them: 0 success, 2 a user error (bad option or
input), 1 trouble with the data or the storage."""
from __future__ import annotations


from support.cli_support import run_cli as kafkalog
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.format.records import Record




def test_help_states_the_exit_statuses():
    rc, out, _ = kafkalog("--help")
    text = " ".join(out.split())
    assert rc == 0
    assert "Exit status: 0 on success; 2 for a user error" in text
    assert "1 for trouble with the data or the storage" in text


def test_user_error_is_2_and_data_trouble_is_1(tmp_path):
    root = tmp_path / "kl"
    a = Admin(str(root))
    a.create_topic("t")
    a.produce("t", [Record(b"k", b"v" * 50, 1)], partition=0)
    assert kafkalog("--cluster", root, "consume", "--topic", "nope")[0] == 2
    assert kafkalog("--cluster", root, "consume", "--topic", "t", "--from", "x")[0] == 2
    assert kafkalog("--cluster", root, "frobnicate")[0] == 2
    seg = root / "logdir-0" / "t-0" / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    data[-10] ^= 0xFF                                      # bit rot in a committed record
    seg.chmod(0o644)
    seg.write_bytes(bytes(data))
    rc, _, err = kafkalog("--cluster", root, "consume", "--topic", "t")
    assert rc == 1 and "CorruptRecordError" in err
    (root / "_kafkalog" / "log" / f"{99:020d}.json").write_text("{}")   # a gap in the log
    rc, _, err = kafkalog("--cluster", root, "topics", "--list")
    assert rc == 1 and "gap" in err
