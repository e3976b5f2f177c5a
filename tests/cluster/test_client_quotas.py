"""Client quotas as the metadata log stores them (docs/protocol.md §12, KIP-13): the
``client_quota`` action's rules, which quota applies to a client id (its own, the default
entity's, the coordinator's KIP-13 defaults; the empty client id shares the default), snapshots,
the feature gate, and ``kafkalog configs`` / the admin API as ``kafka-configs.sh``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster.features import CLIENT_QUOTAS
from pyspark_kafkalog.cluster.quotas import FETCH, PRODUCE, quota_for
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.errors import InvalidConfigError


def replay(*actions):
    s = ClusterState()
    for i, a in enumerate(actions):
        s.apply(i, {"version": 1, "timestamp": 1000 + i, "actions": [a.to_json()]})
    return s


def test_replay_rules():
    on = A.EnableFeatures(reader_features=[CLIENT_QUOTAS])
    early = replay(A.ClientQuotaChange(entity="a", set={"producer_byte_rate": "10"}))
    assert early.results[0][0].error == "INVALID_REQUEST" and early.client_quotas == {}
    s = replay(on,
               A.ClientQuotaChange(entity="a", set={"producer_byte_rate": "1048576",
                                                    "consumer_byte_rate": "2e6"}),
               A.ClientQuotaChange(entity="<default>", set={"producer_byte_rate": "100"}),
               A.ClientQuotaChange(entity="", set={"producer_byte_rate": "5"}),
               A.ClientQuotaChange(entity="b", set={"request_percentage": "5"}),
               A.ClientQuotaChange(entity="b", set={"producer_byte_rate": "0"}),
               A.ClientQuotaChange(entity="b", set={"producer_byte_rate": "nan"}),
               A.ClientQuotaChange(entity="x" * 256, set={"producer_byte_rate": "1"}))
    assert [s.results[i][0].error for i in range(3, 8)] == [
        "INVALID_REQUEST", "INVALID_REQUEST", "INVALID_CONFIG", "INVALID_CONFIG",
        "INVALID_REQUEST"]
    assert s.client_quotas == {"a": {"producer_byte_rate": "1048576",
                                     "consumer_byte_rate": "2e6"},
                               "<default>": {"producer_byte_rate": "100"}}
    assert quota_for(s.client_quotas, "a", PRODUCE) == 1048576.0
    assert quota_for(s.client_quotas, "a", FETCH) == 2e6
    assert quota_for(s.client_quotas, "other", PRODUCE) == 100.0     # the default entity
    assert quota_for(s.client_quotas, "", PRODUCE) == 100.0          # shares the default
    assert quota_for(s.client_quotas, "other", FETCH) is None        # no quota
    assert quota_for(s.client_quotas, "other", FETCH, {FETCH: 7.0}) == 7.0   # KIP-13's default
    assert quota_for({}, "", PRODUCE, {PRODUCE: 3.0}) == 3.0
    # deleting the last value removes the entity; a snapshot carries the rest
    s.apply(8, {"version": 1, "timestamp": 2000, "actions": [A.ClientQuotaChange(
        entity="<default>", delete=["producer_byte_rate"]).to_json()]})
    assert "<default>" not in s.client_quotas
    again = ClusterState.from_snapshot(json.loads(json.dumps(s.to_snapshot())))
    assert again.client_quotas == s.client_quotas
    assert "client_quotas" not in replay(on).to_snapshot()            # absent until set


def test_admin_api_and_persistence_and_old_clients(tmp_path, monkeypatch):
    url = str(tmp_path / "c")
    admin = Admin(url, fsync=False)
    assert admin.describe_client_quotas() == {}
    assert admin.alter_client_quotas("etl", {"producer_byte_rate": 1048576}) == {
        "producer_byte_rate": 1048576.0}
    admin.alter_client_quotas(None, {"consumer_byte_rate": "500"})
    for bad in ({"producer_byte_rate": -1}, {"bytes": 1}):
        seq = admin.cluster.state().seq
        with pytest.raises(InvalidConfigError):
            admin.alter_client_quotas("etl", bad)
        assert admin.cluster.state().seq == seq                      # nothing written
    with pytest.raises(InvalidConfigError, match="empty client id"):
        admin.alter_client_quotas("", {"producer_byte_rate": 1})
    fresh = Admin(url, create=False)
    assert fresh.describe_client_quotas() == {"<default>": {"consumer_byte_rate": 500.0},
                                              "etl": {"producer_byte_rate": 1048576.0}}
    assert fresh.describe_client_quotas("etl") == {"etl": {"producer_byte_rate": 1048576.0}}
    # a client that does not know the feature refuses the cluster instead of ignoring quotas
    from pyspark_kafkalog.cluster import features
    monkeypatch.delitem(features.READER_FEATURES, CLIENT_QUOTAS)
    from pyspark_kafkalog.errors import UnsupportedVersionError
    with pytest.raises(UnsupportedVersionError, match=CLIENT_QUOTAS):
        Admin(url, create=False).cluster.state()


@pytest.mark.slow
def test_configs_cli_as_kafka_configs(tmp_path):
    url = str(tmp_path / "c")
    Admin(url, fsync=False)

    def kl(*argv):
        out = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", "--cluster", url,
                              *argv], capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout, out.stderr

    rc, out, err = kl("configs", "--alter", "--entity-type", "clients", "--entity-name", "etl",
                      "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2000000")
    assert rc == 0, err
    assert out.strip() == ("Completed updating config for client etl: "
                           "consumer_byte_rate=2000000, producer_byte_rate=1048576.")
    assert kl("configs", "--alter", "--entity-type", "clients", "--entity-default",
              "--add-config", "producer_byte_rate=100")[0] == 0
    rc, out, err = kl("--json", "configs", "--describe", "--entity-type", "clients")
    assert [json.loads(x) for x in out.splitlines()] == [
        {"entity": "<default>", "producer_byte_rate": 100.0, "consumer_byte_rate": None},
        {"entity": "etl", "producer_byte_rate": 1048576.0, "consumer_byte_rate": 2000000.0}]
    assert kl("configs", "--alter", "--entity-type", "clients", "--entity-name", "etl",
              "--delete-config", "consumer_byte_rate")[0] == 0
    rc, out, _ = kl("configs", "--describe", "--entity-type", "clients", "--entity-name", "etl")
    assert out.split() == ["ENTITY", "PRODUCER-BYTE-RATE", "CONSUMER-BYTE-RATE", "etl",
                           "1048576.0", "-"]
    for argv, msg in ((("--add-config", "producer_byte_rate=-1"), "below 1 byte per second"),
                      (("--add-config", "producer_byte_rate"), "K=V"),
                      (("--add-config", "bogus=1"), "unknown quota config"),
                      ((), "--add-config and/or --delete-config")):
        rc, _, err = kl("configs", "--alter", "--entity-type", "clients", "--entity-name", "etl",
                        *argv)
        assert rc == 2 and msg in err, (argv, err)
    rc, _, err = kl("configs", "--describe", "--entity-type", "topics")
    assert rc == 2 and "topics --alter" in err
