"""A real process that takes the coordinator lease, for tests/coordinator/test_coordinator_lease.py.

    python lease_child.py race ROOT HOLDER LEASE_MS GO_PREFIX ROUNDS
        per round i: waits for GO_PREFIX-i, acquires once, prints one JSON line
        {"won": lease} or {"lost": error type, "holder": the holder the error names}
    python lease_child.py hold ROOT HOLDER LEASE_MS STATE_FILE
        acquires, then renews every LEASE_MS/5 forever; after every acquire or renewal its
        lease (JSON) replaces STATE_FILE, so the test knows the last lease it held
    python lease_child.py standby ROOT HOLDER LEASE_MS REFUSED_FILE
        tries to acquire every 50 ms; touches REFUSED_FILE at its first refusal, and prints
        {"won": lease, "refused": n} once it holds the lease

Anything else that happens is printed with its traceback.
"""
import dataclasses
import json
import os
import sys
import time
import traceback

from pyspark_kafkalog.cluster import lease as L
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.errors import CoordinatorLeaseHeldError


def put(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def say(data: dict) -> None:
    print(json.dumps(data), flush=True)


def main() -> None:
    mode, root, holder, lease_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cluster = Cluster(root, create=False)
    cluster.state()                       # warm: the racers start from the same replay
    if mode == "race":
        prefix, rounds = sys.argv[5], int(sys.argv[6])
        for i in range(rounds):
            while not os.path.exists(f"{prefix}-{i}"):
                time.sleep(0.001)
            try:
                say({"won": dataclasses.asdict(L.acquire(cluster, holder, f"{holder}:1",
                                                         lease_ms))})
            except CoordinatorLeaseHeldError as exc:
                say({"lost": type(exc).__name__, "holder": exc.holder})
    elif mode == "hold":
        state_file = sys.argv[5]
        lease = L.acquire(cluster, holder, "127.0.0.1:1", lease_ms)
        while True:
            put(state_file, dataclasses.asdict(lease))
            time.sleep(lease_ms / 5000)
            lease = L.renew(cluster, lease)
    elif mode == "standby":
        refused_file, refused = sys.argv[5], 0
        while True:
            try:
                lease = L.acquire(cluster, holder, "127.0.0.1:2", lease_ms)
                break
            except CoordinatorLeaseHeldError:
                refused += 1
                if refused == 1:
                    put(refused_file, {})
                time.sleep(0.05)
        say({"won": dataclasses.asdict(lease), "refused": refused})
    else:
        raise SystemExit(f"unknown mode {mode}")


try:
    main()
except BaseException:
    say({"error": traceback.format_exc()})
    raise
