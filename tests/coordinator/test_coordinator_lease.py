"""The coordinator's lease and fencing (docs/protocol.md §11, issue #16 "exactly one acts").

* replay rules of ``coordinator_lease`` straight through ``ClusterState.apply``: acquire, renew,
  release, takeover only once the lease expired by the acquirer's clock, the loser of an epoch,
  a deposed holder's renewal refused, and a rejected action changes nothing;
* the fencing rule for any action carrying ``coordinator_epoch``;
* ``cluster.lease`` against a real cluster (an injected clock): the first acquire enables the
  feature in its own entry, the typed errors, snapshots carry the lease;
* a client without ``coordinatorLease`` refuses to read (in process and a real process);
* real processes: two racing to acquire (exactly one holds), and kill -9 of a holder that
  renews in a loop (a standby takes over with the next epoch only after the lease expired, and
  the dead holder's last lease is fenced).
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from support.cli_support import run_main
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.cluster import lease as L
from pyspark_kafkalog.cluster import state as S
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.maintenance.metadata_check import verify
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.errors import (CoordinatorLeaseHeldError, FencedCoordinatorError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format.records import Record

HERE = Path(__file__).resolve().parents[1]          # tests/
CHILD = HERE / "procs" / "lease_child.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
DEADLINE_S = 120          # generous: the machine is shared; never an assertion on time
LEASE_MS = 1500


# -- replay rules, no storage ------------------------------------------------------------------

def apply(s: ClusterState, action, ts: int = 1_000) -> A.Result:
    raw = action.to_json() if isinstance(action, A.Action) else action
    s.apply(s.seq + 1, {"version": 1, "writer": "w", "timestamp": ts, "actions": [raw]})
    return s.results[s.seq][0]


def lease(op, epoch, holder, renewed_ms, lease_ms=1000, address="h:1"):
    return A.CoordinatorLeaseChange(lease_op=op, epoch=epoch, holder=holder, address=address,
                                    lease_ms=lease_ms, renewed_ms=renewed_ms)


def frozen(s: ClusterState) -> str:
    d = s.to_snapshot()
    d.pop("seq"), d.pop("timestamp")
    return json.dumps(d, sort_keys=True)


def enabled() -> ClusterState:
    s = ClusterState()
    assert apply(s, A.EnableFeatures(reader_features=[features.COORDINATOR_LEASE])).ok
    return s


def refused(s: ClusterState, action, error: str) -> A.Result:
    """Replay rejects ``action`` with ``error``, and nothing of the state changes."""
    before = frozen(s)
    result = apply(s, action)
    assert result.error == error, result
    assert frozen(s) == before
    return result


def test_acquire_needs_the_feature():
    s = ClusterState()
    refused(s, lease("acquire", 1, "a", 0), "INVALID_REQUEST")
    assert s.coordinator is None


def test_acquire_renew_release_and_takeover_only_after_expiry():
    s = enabled()
    assert apply(s, lease("acquire", 1, "a", 1_000)).ok
    assert L.current_lease(s) == L.CoordinatorLease(1, "a", "h:1", 1000, 1_000)
    assert L.current_lease(s).expires_ms == 2_000
    # b's clock says 1,999: a's lease is still live, whatever epoch b asks for
    refused(s, lease("acquire", 2, "b", 1_999), "NOT_COORDINATOR")
    refused(s, lease("acquire", 1, "b", 5_000), "NOT_COORDINATOR")    # epoch 1 is taken
    refused(s, lease("acquire", 3, "b", 5_000), "INVALID_REQUEST")    # skips an epoch
    # a renews at 1,900 (its clock): live until 2,900 now
    assert apply(s, lease("renew", 1, "a", 1_900, address="h:2")).ok
    assert L.current_lease(s) == L.CoordinatorLease(1, "a", "h:2", 1000, 1_900)
    refused(s, lease("acquire", 2, "b", 2_899), "NOT_COORDINATOR")
    # at 2,900 by b's clock it has expired: b takes over with the next epoch
    assert apply(s, lease("acquire", 2, "b", 2_900, address="h:3")).ok
    assert L.current_lease(s) == L.CoordinatorLease(2, "b", "h:3", 1000, 2_900)
    # a, deposed, cannot renew, release or take epoch 2 back
    refused(s, lease("renew", 1, "a", 3_000), "STALE_CONTROLLER_EPOCH")
    refused(s, lease("release", 1, "a", 3_000), "STALE_CONTROLLER_EPOCH")
    refused(s, lease("renew", 2, "a", 3_000), "STALE_CONTROLLER_EPOCH")   # not its epoch
    refused(s, lease("acquire", 2, "a", 9_000), "NOT_COORDINATOR")
    # a late renewal of b, after expiry but before any takeover, still holds: epochs fence
    assert apply(s, lease("renew", 2, "b", 7_000)).ok
    # b releases: a takes over at once, even though b's last renewal would still be live
    assert apply(s, lease("release", 2, "b", 7_100, lease_ms=0)).ok
    assert L.current_lease(s) == L.CoordinatorLease(2, "", "", 0, 7_100)
    refused(s, lease("renew", 2, "b", 7_200), "STALE_CONTROLLER_EPOCH")
    assert apply(s, lease("acquire", 3, "a", 7_200)).ok
    assert L.current_lease(s).epoch == 3 and L.current_lease(s).holder == "a"


def test_acquiring_ones_own_lease_again_starts_a_new_epoch():
    s = enabled()
    assert apply(s, lease("acquire", 1, "a", 1_000)).ok
    assert apply(s, lease("acquire", 2, "a", 1_001)).ok           # live, but its own
    refused(s, lease("renew", 1, "a", 1_002), "STALE_CONTROLLER_EPOCH")
    assert apply(s, lease("renew", 2, "a", 1_002)).ok


@pytest.mark.parametrize("action", [
    lease("acquire", 1, "a", 0, lease_ms=0),
    lease("acquire", 0, "a", 0),
    lease("acquire", 1, "", 0),
    lease("steal", 1, "a", 0),
    {"op": "coordinator_lease", "lease_op": "acquire", "epoch": "1", "holder": "a",
     "address": "", "lease_ms": 10, "renewed_ms": 0},
    {"op": "coordinator_lease", "lease_op": "acquire", "epoch": 1, "holder": "a",
     "lease_ms": 10, "renewed_ms": 0},
], ids=["zero lease_ms", "epoch 0", "no holder", "unknown lease_op", "typed", "missing field"])
def test_malformed_lease_actions_are_rejected_whole(action):
    s = enabled()
    refused(s, action, "INVALID_REQUEST")
    assert s.coordinator is None


def test_renewing_or_releasing_without_a_lease_is_stale():
    s = enabled()
    refused(s, lease("renew", 1, "a", 0), "STALE_CONTROLLER_EPOCH")
    refused(s, lease("release", 1, "a", 0), "STALE_CONTROLLER_EPOCH")


def test_the_action_round_trips_through_json():
    action = lease("renew", 7, "host:1:ab", 123, lease_ms=1500, address="")
    assert A.parse_action(json.loads(json.dumps(action.to_json()))) == action


# -- the fencing rule for any action that carries coordinator_epoch -----------------------------

@dataclasses.dataclass(frozen=True)
class _FencedNote(A.Action):
    """A stand-in for a later coordinator action (ISR change, leader election): it sets a
    sink's batch, which is easy to see in the state. OP stays empty so the class is not
    registered for the whole session; the fixture registers it for one test."""
    OP: ClassVar[str] = ""
    sink: str = A.spec(A.check_str)
    batch: int = A.spec(A.check_int)
    coordinator_epoch: int = A.spec(A.check_int)


@pytest.fixture
def fenced_note(monkeypatch):
    def handler(s, a, ts):
        s._sinks_w()[a.sink] = a.batch
        return A.Result()
    monkeypatch.setattr(_FencedNote, "OP", "test_fenced_note")
    monkeypatch.setitem(A.ACTIONS, "test_fenced_note", _FencedNote)
    monkeypatch.setitem(S.HANDLERS, _FencedNote, handler)
    return _FencedNote


def test_an_action_with_a_stale_coordinator_epoch_changes_nothing(fenced_note):
    s = enabled()
    refused(s, fenced_note(sink="x", batch=1, coordinator_epoch=1), "STALE_CONTROLLER_EPOCH")
    assert apply(s, lease("acquire", 1, "a", 1_000)).ok
    assert apply(s, fenced_note(sink="x", batch=1, coordinator_epoch=1)).ok
    assert s.sinks == {"x": 1}
    assert apply(s, lease("acquire", 2, "b", 5_000)).ok              # a's lease expired
    result = refused(s, fenced_note(sink="x", batch=2, coordinator_epoch=1),
                     "STALE_CONTROLLER_EPOCH")
    assert "current epoch is 2" in result.message
    refused(s, fenced_note(sink="x", batch=2, coordinator_epoch=3), "STALE_CONTROLLER_EPOCH")
    assert apply(s, fenced_note(sink="x", batch=2, coordinator_epoch=2)).ok
    assert apply(s, lease("release", 2, "b", 5_001)).ok
    refused(s, fenced_note(sink="x", batch=3, coordinator_epoch=2), "STALE_CONTROLLER_EPOCH")
    assert s.sinks == {"x": 2}


# -- the lease API on a real cluster (an injected clock) ---------------------------------------

class Clock:
    def __init__(self, ms: int = 1_000_000):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def entries(root: Path):
    log = root / "_kafkalog" / "log"
    return [json.loads(p.read_text()) for p in sorted(log.glob("*[0-9].json"))]


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "kl"
    a = Admin(str(root))
    a.create_topic("t", 1)
    a.produce("t", [Record(b"k", b"v", 1)], partition=0)
    return root


def test_the_lease_api_on_a_cluster(root):
    clock = Clock()
    a_side, b_side = (Cluster(str(root), create=False, clock=clock) for _ in range(2))
    assert L.current_lease(a_side.state()) is None
    held = L.acquire(a_side, "a", "10.0.0.1:9095", 1000)
    assert held == L.CoordinatorLease(1, "a", "10.0.0.1:9095", 1000, 1_000_000)
    assert L.current_lease(b_side.state()) == held
    # the first acquire enabled the feature in an entry of its own, before its own
    ops = [[x["op"] for x in e["actions"]] for e in entries(root)]
    assert ops[-2:] == [["protocol"], ["coordinator_lease"]]
    assert features.COORDINATOR_LEASE in b_side.state().reader_features
    rc, out, _ = run_main("--cluster", root, "--json", "features", "--list")
    assert rc == 0 and {"feature": "coordinatorLease", "kind": "reader", "enabled": True,
                        "supported": True,
                        "description": features.READER_FEATURES["coordinatorLease"]} \
        in [json.loads(line) for line in out.splitlines()]

    clock.ms += 999
    with pytest.raises(CoordinatorLeaseHeldError, match="held by a at 10.0.0.1:9095") as info:
        L.acquire(b_side, "b", "10.0.0.2:9095", 1000)
    assert (info.value.holder, info.value.address, info.value.epoch, info.value.expires_ms,
            info.value.error_code) == ("a", "10.0.0.1:9095", 1, 1_001_000, 16)
    held = L.renew(a_side, held)
    assert held.renewed_ms == 1_000_999 and L.current_lease(b_side.state()) == held

    clock.ms += 1000                               # a's lease expired by b's (shared) clock
    taken = L.acquire(b_side, "b", "10.0.0.2:9095", 1000)
    assert taken.epoch == 2
    with pytest.raises(FencedCoordinatorError) as info:
        L.renew(a_side, held)
    assert info.value.error_code == 11 and info.value.current_epoch == 2
    n = len(entries(root))
    L.release(a_side, held)                        # deposed: nothing to give up, no entry
    assert len(entries(root)) == n
    L.release(b_side, taken)
    assert L.current_lease(a_side.state()) == L.CoordinatorLease(2, "", "", 0, clock.ms)
    assert L.acquire(a_side, "a", "", 1000).epoch == 3   # at once after a release


def test_a_renewal_that_loses_the_race_to_a_takeover_is_fenced_at_replay(root):
    """The deposed holder's look at the log shows it still holding; its renewal lands after
    the takeover's entry, and replay refuses it."""
    clock = Clock()
    a_side, b_side = (Cluster(str(root), create=False, clock=clock) for _ in range(2))
    held = L.acquire(a_side, "a", "", 1000)
    clock.ms += 5000
    L.acquire(b_side, "b", "", 1000)
    stale_view = a_side.state(refresh=False)
    a_side.state = lambda refresh=True: stale_view          # it has not seen b's entry yet
    before = frozen(b_side.state())
    with pytest.raises(FencedCoordinatorError, match="epoch 2 is held by b"):
        L.renew(a_side, held)
    assert entries(root)[-1]["actions"][0]["lease_op"] == "renew"    # written, and refused
    assert frozen(b_side.state()) == before


def test_snapshots_carry_the_lease(root):
    clock = Clock()
    c = Cluster(str(root), create=False, clock=clock, snapshot_interval=2)
    held = L.acquire(c, "a", "h:1", 1000)
    for _ in range(4):
        clock.ms += 10
        held = L.renew(c, held)
    log = root / "_kafkalog" / "log"
    newest = max(log.glob("*.snapshot.json"))
    assert json.loads(newest.read_text())["coordinator"] == dataclasses.asdict(held)
    seq = int(newest.name.split(".")[0])
    for p in log.glob("*[0-9].json"):                  # only the snapshot knows the past now
        if int(p.stem) <= seq:
            p.unlink()
    assert L.current_lease(Cluster(str(root), create=False).state()) == held
    assert not verify(Cluster(str(root), create=False).metalog).problems


def test_a_client_without_the_feature_refuses_to_read(root, monkeypatch):
    L.acquire(Cluster(str(root), create=False), "a", "", LEASE_MS)
    # a real process of a client that does not know coordinatorLease
    older = ("import sys; from pyspark_kafkalog.cluster import features; "
             "del features.READER_FEATURES['coordinatorLease']; "
             "from pyspark_kafkalog.cli.main import main; "
             f"sys.exit(main(['--cluster', {str(root)!r}, 'consume', '--topic', 't']))")
    before = sorted(p for p in root.rglob("*"))
    proc = subprocess.run([sys.executable, "-c", older], env=ENV, capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert proc.returncode == 1, proc.stderr
    assert "coordinatorLease" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p for p in root.rglob("*")) == before
    monkeypatch.delitem(features.READER_FEATURES, features.COORDINATOR_LEASE)
    with pytest.raises(UnsupportedVersionError, match="coordinatorLease"):
        Cluster(str(root), create=False).state()


# -- real processes ----------------------------------------------------------------------------

def child(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


ROUNDS = int(os.environ.get("KAFKALOG_LEASE_RACE_ROUNDS", "10"))


def test_two_processes_race_to_acquire_exactly_one_holds(root, tmp_path):
    admin = Cluster(str(root), create=False)
    racers = [child("race", root, name, 60_000, tmp_path / "go", ROUNDS)
              for name in ("racer-a", "racer-b")]
    try:
        for i in range(ROUNDS):
            (tmp_path / f"go-{i}").touch()
            outs = [json.loads(p.stdout.readline() or '{"error": "no output"}')
                    for p in racers]
            won = [o["won"] for o in outs if "won" in o]
            lost = [o for o in outs if "lost" in o]
            assert len(won) == 1 and len(lost) == 1, (i, outs)
            winner = L.CoordinatorLease(**won[0])
            assert winner.epoch == i + 1
            assert lost[0] == {"lost": "CoordinatorLeaseHeldError", "holder": winner.holder}
            assert L.current_lease(admin.state()) == winner
            L.release(admin, winner)        # the holder's clean shutdown, for the next round
    finally:
        for p in racers:
            p.kill()
            p.communicate()
    acquires = [a for e in entries(root) for a in e["actions"]
                if a["op"] == "coordinator_lease" and a["lease_op"] == "acquire"]
    assert len({a["epoch"] for a in acquires}) == ROUNDS


@pytest.mark.slow
def test_kill_9_of_the_holder_a_standby_takes_over_after_expiry(root, tmp_path):
    state_file, refused_file = tmp_path / "holder.json", tmp_path / "refused"
    holder = child("hold", root, "holder", LEASE_MS, state_file)
    standby = None
    try:
        first = wait_for(lambda: state_file.exists() and json.loads(state_file.read_text()),
                         "the holder to acquire")
        assert first["epoch"] == 1 and first["holder"] == "holder"
        wait_for(lambda: json.loads(state_file.read_text())["renewed_ms"] > first["renewed_ms"],
                 "the holder to renew")
        standby = child("standby", root, "standby", LEASE_MS, refused_file)
        wait_for(refused_file.exists, "the standby to be refused while the holder lives")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert holder.returncode == -signal.SIGKILL
        last = L.CoordinatorLease(**json.loads(state_file.read_text()))
        out, err = standby.communicate(timeout=DEADLINE_S)
        assert standby.returncode == 0, err
    finally:
        for p in (holder, standby):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    got = json.loads(out)
    taken = L.CoordinatorLease(**got["won"])
    assert got["refused"] >= 1
    cluster = Cluster(str(root), create=False)
    state = cluster.state()
    # the holder's last lease in the log: the file holds the last one it knew of, and a renewal
    # may have landed after it wrote the file
    in_log = [a for e in entries(root) for a in e["actions"]
              if a["op"] == "coordinator_lease" and a["epoch"] == 1]
    assert in_log and all(a["holder"] == "holder" for a in in_log)
    last_expiry = max(a["renewed_ms"] + a["lease_ms"] for a in in_log)
    assert last.expires_ms <= last_expiry
    assert taken.epoch == 2 and taken.holder == "standby"
    assert taken.renewed_ms >= last_expiry          # taken only once the lease had expired
    assert L.current_lease(state) == taken
    before = frozen(state)
    with pytest.raises(FencedCoordinatorError, match="epoch 2 is held by standby"):
        L.renew(cluster, last)                      # the dead holder's later renewal
    # and written anyway (as a holder that had not seen the takeover would): refused at replay
    _, after, results = cluster.submit([A.CoordinatorLeaseChange(
        lease_op="renew", epoch=1, holder="holder", address=last.address,
        lease_ms=last.lease_ms, renewed_ms=cluster.now_ms())])
    assert results[0].error == "STALE_CONTROLLER_EPOCH"
    assert frozen(after) == before
