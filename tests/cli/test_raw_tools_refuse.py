"""The raw log-dir commands that write (`recover`, `produce --log-dir`) refuse a kafkalog
cluster's directories and change nothing; the read-only ones (`recover --dry-run`, `dump`) still
work there. And `--cluster-config`'s storage settings reach every log-dir command (a real S3
server, real processes)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support.moto_support import BUCKET, moto_options  # noqa: F401  (a session fixture: a moto server)

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.slow   # every raw command against S3 and clusters as processes (~13 s)


def run_cli(*argv, stdin: str = "", env=None):
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, text=True, timeout=180,
                          env={**(env or os.environ), "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def records(n: int, start: int = 0) -> str:
    return "".join(json.dumps({"value": base64.b64encode(b"value-%d" % i).decode(),
                               "timestamp": 1_700_000_000_000 + i}) + "\n"
                   for i in range(start, start + n))


def tree(root: Path) -> dict:
    """Every file under ``root`` (temp files included) with its size, inode and sha256, and
    every directory: what a command could have changed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_size, st.st_ino, digest)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    """A cluster with topic t (2 partitions), three commits to partition 0 (three segments)."""
    root = tmp_path_factory.mktemp("refuse") / "kl"
    rc, _, err = run_cli("--cluster", root, "topics", "--create", "--topic", "t",
                         "--partitions", 2, "--config", "segment.bytes=200")
    assert rc == 0, err
    for i in range(3):
        rc, _, err = run_cli("--cluster", root, "produce", "--topic", "t", "--partition", 0,
                             stdin=records(5, 5 * i))
        assert rc == 0, err
    assert len(list((root / "logdir-0" / "t-0").glob("*.log"))) == 3
    return root


def refused(rc, out, err, *needles):
    assert rc == 2, (out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kafkalog: error: ClusterDirectoryError: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def spellings(root: Path, sub: str):
    """One directory of the cluster written several ways: plain, file:// URL, through `..`, and
    through a symlink (which a check of the path's text alone would miss)."""
    link = root.parent / f"links-{uuid.uuid4().hex[:6]}" / Path(sub).name
    link.parent.mkdir()
    link.symlink_to(root / sub, target_is_directory=True)
    return [root / sub, f"file://{root / sub}", f"{root}/logdir-0/../{sub}", link]


def test_recover_refuses_a_cluster_partition_and_changes_nothing(cluster):
    for where in spellings(cluster, "logdir-0/t-0"):
        before = tree(cluster)
        refused(*run_cli("recover", where), f"kafkalog --cluster {cluster.resolve()} repair "
                "--topic t --partition 0")
        assert tree(cluster) == before, where
    # a log dir or the root given as the partition dir's parent: the same refusal
    for where in (cluster / "logdir-0" / "t-1", cluster / "logdir-0" / "x-0"):
        before = tree(cluster)
        refused(*run_cli("recover", where), "repair --topic")
        assert tree(cluster) == before


def test_produce_log_dir_refuses_a_cluster_log_dir_or_root_and_changes_nothing(cluster):
    for where in spellings(cluster, "logdir-0") + [cluster, cluster / "logdir-1"]:
        before = tree(cluster)
        refused(*run_cli("produce", "--log-dir", where, "--topic", "t", "--partition", 0,
                         stdin=records(1)),
                f"kafkalog --cluster {cluster.resolve()} produce --topic t --partition 0")
        assert tree(cluster) == before, where
    # the cluster still says what it said: 15 records in partition 0
    rc, out, err = run_cli("--json", "--cluster", cluster, "offsets", "--topic", "t",
                           "--partition", 0)
    assert rc == 0 and json.loads(out)["offset"] == 15, err


def test_read_only_log_dir_commands_still_work_on_a_cluster(cluster):
    before = tree(cluster)
    rc, out, err = run_cli("recover", "--dry-run", cluster / "logdir-0" / "t-0")
    assert rc == 0, err
    assert json.loads(out)["log_end_offset"] == 15
    segs = sorted((cluster / "logdir-0" / "t-0").glob("*.log"))
    rc, out, err = run_cli("dump", "--deep-iteration", "--json", "--files",
                           ",".join(map(str, segs)))
    assert rc == 0, err
    assert [json.loads(line)["offset"] for line in out.splitlines()] == list(range(15))
    assert tree(cluster) == before


def test_plain_log_dirs_are_still_written(tmp_path):
    """Only a cluster's directories are refused: a plain log dir, even one beside a cluster or
    named like a cluster's, is Kafka's to write as before."""
    rc, _, err = run_cli("--cluster", tmp_path / "kl", "topics", "--create", "--topic", "t")
    assert rc == 0, err
    for logdir in (tmp_path / "logdir-0", tmp_path / "other" / "logdir-0"):
        rc, out, err = run_cli("produce", "--log-dir", logdir, "--topic", "t", "--partition", 0,
                               stdin=records(3))
        assert rc == 0, err
        assert [json.loads(line)["offset"] for line in out.splitlines()] == [0, 1, 2]
        rc, out, err = run_cli("recover", logdir / "t-0")
        assert rc == 0 and json.loads(out)["log_end_offset"] == 3, err


# -- --cluster-config's storage.* settings reach the log-dir commands --------------------------

def _no_credentials_env(tmp_path) -> dict:
    """The environment less any AWS credentials, so only the config file can supply them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(
        tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")
    return env


def test_cluster_config_storage_settings_reach_dump_recover_and_produce(tmp_path,
                                                                         moto_options):
    conf = tmp_path / "cluster.properties"
    conf.write_text(f"storage.endpoint_url={moto_options['endpoint_url']}\n"
                    f"storage.key={moto_options['key']}\nstorage.secret={moto_options['secret']}\n")
    env = _no_credentials_env(tmp_path)
    logdir = f"s3://{BUCKET}/raw-{uuid.uuid4().hex}/logdir"
    seg = f"{logdir}/t-0/{0:020d}.log"

    # without the settings the storage cannot be reached: the bug this guards against
    rc, out, err = run_cli("produce", "--log-dir", logdir, "--topic", "t", "--partition", 0,
                           stdin=records(3), env=env)
    assert rc == 1 and len(err.splitlines()) == 1, err
    rc, out, err = run_cli("produce", "--log-dir", logdir, "--topic", "t", "--partition", 0,
                           "--cluster-config", conf, stdin=records(3), env=env)
    assert rc == 0, err
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [0, 1, 2]
    for argv in (["dump", "--files", seg, "--deep-iteration", "--json", "--cluster-config", conf],
                 ["--cluster-config", conf, "dump", "--files", seg, "--deep-iteration", "--json"]):
        rc, out, err = run_cli(*argv, env=env)
        assert rc == 0, err
        assert [json.loads(line)["offset"] for line in out.splitlines()] == [0, 1, 2]
    rc, out, err = run_cli("dump", "--files", seg, env=env)
    assert rc == 1, (out, err)
    for argv in (["recover", f"{logdir}/t-0", "--cluster-config", conf],
                 ["--cluster-config", conf, "recover", "--dry-run", f"{logdir}/t-0"]):
        rc, out, err = run_cli(*argv, env=env)
        assert rc == 0, err
        assert json.loads(out)["log_end_offset"] == 3

    # and the refusal sees an S3 cluster through the same settings
    root = f"s3://{BUCKET}/cluster-{uuid.uuid4().hex}"
    rc, _, err = run_cli("--cluster", root, "--cluster-config", conf, "topics", "--create",
                         "--topic", "t", env=env)
    assert rc == 0, err
    rc, _, err = run_cli("--cluster", root, "--cluster-config", conf, "produce", "--topic", "t",
                         stdin=records(2), env=env)
    assert rc == 0, err
    refused(*run_cli("produce", "--log-dir", f"{root}/logdir-0", "--topic", "t", "--partition",
                     0, "--cluster-config", conf, stdin=records(1), env=env),
            f"kafkalog --cluster {root} produce --topic t --partition 0")
    refused(*run_cli("--cluster-config", conf, "recover", f"{root}/logdir-0/t-0", env=env),
            f"kafkalog --cluster {root} repair --topic t --partition 0")
    rc, out, err = run_cli("--json", "--cluster", root, "--cluster-config", conf, "consume",
                           "--topic", "t", env=env)
    assert rc == 0 and len(out.splitlines()) == 2, err
