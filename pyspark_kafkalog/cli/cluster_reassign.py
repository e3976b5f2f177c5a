"""``kafkalog --cluster URL reassign-partitions``: Kafka's ``kafka-reassign-partitions.sh``
(``--reassignment-json-file F --execute | --verify``), with log dirs in place of brokers: a
replica is a log dir's number (Kafka's broker id) or its name (``logdir-2``). The coordinator
copies to the new replicas and completes each move once they are in sync (docs/protocol.md
§1.3)."""
from __future__ import annotations

import json

from ..cluster.log_dirs import log_dir_name
from ..errors import InvalidConfigError
from .cluster_common import OUTPUT_HELP, columns, emit_rows, open_admin, say

REASSIGN_COLUMNS = columns("topic", "partition", "status", "replicas", "target")

EXAMPLE = ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 1], '
           '"log_dirs": ["any", "any"]}]}')


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "reassign-partitions", parents=parents,
        help="move partition replicas to other log dirs (kafka-reassign-partitions.sh)",
        description="--execute starts moving each partition of the JSON file to its target "
                    "replicas; a running coordinator copies to the new ones and completes the "
                    "move once they are in the ISR (the leader moves to a target if needed, the "
                    "removed replicas' files are deleted). --verify shows whether each is done. "
                    f"The file is Kafka's reassignment JSON, e.g. {EXAMPLE}; replicas are log "
                    "dir numbers (Kafka's broker ids) or names; log_dirs is accepted and must be "
                    "\"any\". --execute checks the whole file first: a partition that does not "
                    "exist, or replicas that are empty, name a log dir twice or name one the "
                    "cluster does not have, are a user error (exit status 2) and nothing is "
                    "written.",
        epilog=OUTPUT_HELP + " Columns: topic, partition, status (started, refused: <error>, "
               "in progress, complete), replicas, target. --execute exits 1 when a partition "
               "was refused (REASSIGNMENT_IN_PROGRESS); --verify exits 1 while any is in "
               "progress.")
    p.add_argument("--reassignment-json-file", required=True, metavar="F")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--execute", action="store_true", help="start the reassignment")
    g.add_argument("--verify", action="store_true", help="show whether it is complete")
    p.set_defaults(run=run_reassign)


def parse_reassignment(text: str) -> dict:
    """{(topic, partition): [replica, ...]} from Kafka's reassignment JSON, checked."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidConfigError(f"the reassignment file is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise InvalidConfigError(f'the reassignment file needs "partitions": a list, e.g. '
                                 f"{EXAMPLE}")
    if doc.get("version", 1) != 1:
        raise InvalidConfigError(f"reassignment JSON version {doc.get('version')!r} is not 1")
    out = {}
    for i, e in enumerate(doc["partitions"]):
        if not (isinstance(e, dict) and isinstance(e.get("topic"), str)
                and isinstance(e.get("partition"), int) and isinstance(e.get("replicas"), list)
                and all(isinstance(r, (int, str)) and not isinstance(r, bool)
                        for r in e["replicas"])):
            raise InvalidConfigError(f"partitions[{i}]: needs topic (string), partition (int) "
                                     f"and replicas (log dir numbers or names): {e!r:.120}")
        dirs = e.get("log_dirs")
        if dirs is not None and (not isinstance(dirs, list) or any(d != "any" for d in dirs)):
            raise InvalidConfigError(f"partitions[{i}]: log_dirs must be \"any\" (a replica is a "
                                     "log dir here)")
        key = (e["topic"], e["partition"])
        if key in out:
            raise InvalidConfigError(f"partition {key[0]}-{key[1]} is listed twice")
        out[key] = e["replicas"]
    return out


def run_reassign(args) -> int:
    try:
        with open(args.reassignment_json_file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read {args.reassignment_json_file}: {exc}") from None
    wanted = parse_reassignment(text)
    admin = open_admin(args, "reassign-partitions")
    if args.execute:
        # the whole file is checked before anything is written: a bad partition or target
        # list is a user error (exit status 2) that writes nothing, not even a feature
        answers = admin.reassign_partitions(wanted)
    names = {k: [log_dir_name(r) for r in v] for k, v in wanted.items()}
    if args.execute:
        state = admin.cluster.state()
        rows = [{"topic": t, "partition": p,
                 "status": "started" if answers.get((t, p)) == "NONE"
                 else f"refused: {answers.get((t, p))}",
                 "replicas": ",".join(state.topics[t]["replicas"][p]),
                 "target": ",".join(names[(t, p)])} for t, p in sorted(wanted)]
        emit_rows(args, REASSIGN_COLUMNS, rows)
        return 0 if all(a == "NONE" for a in answers.values()) else 1
    moving = admin.list_partition_reassignments()
    state = admin.cluster.state()
    rows = []
    for t, p in sorted(wanted):
        info = state.topics.get(t)
        replicas = info["replicas"][p] if info and p < info["partitions"] else []
        status = ("in progress" if (t, p) in moving else
                  "complete" if replicas == names[(t, p)] else "not started or replaced")
        rows.append({"topic": t, "partition": p, "status": status,
                     "replicas": ",".join(replicas), "target": ",".join(names[(t, p)])})
    emit_rows(args, REASSIGN_COLUMNS, rows)
    if not args.json and not moving:
        say(args, "No reassignment is in progress.")
    return 1 if any(r["status"] != "complete" for r in rows) else 0
