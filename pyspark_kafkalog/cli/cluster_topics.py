"""``kafkalog --cluster URL topics``: kafka-topics.sh for a kafkalog cluster.

Exactly one action: ``--create``, ``--delete``, ``--list``, ``--describe``, ``--alter`` or
``--increase-partitions``. Every check that can be made without writing is made first, so a
rejected command appends nothing to the metadata log.
"""
from __future__ import annotations

import sys

from ..cluster.cluster import isr_health
from ..errors import InvalidConfigError, InvalidPartitionsError, TopicAlreadyExistsError
from ..format.checkpoint import validate_topic_name
from ..log.config import LogConfig
from .cluster_common import (OUTPUT_HELP, cluster_exists, cluster_options, columns, emit_json,
                             format_table, non_negative, chosen_action, open_admin, parse_configs,
                             require, say)

#: --describe's partition filters (kafka-topics.sh's), one at a time: attribute -> the
#: ``cluster.isr_health`` flag a partition must have to be shown
FILTERS = {"under_replicated_partitions": "under_replicated",
           "under_min_isr_partitions": "under_min_isr", "at_min_isr_partitions": "at_min_isr"}
OPTIONS = {"topic": "--topic", "partitions": "--partitions",
           "replication_factor": "--replication-factor", "config": "--config",
           "delete_config": "--delete-config",
           **{f: "--" + f.replace("_", "-") for f in FILTERS}}
PARTITION_COLUMNS = columns("partition", "leader", "replicas", "isr", "leader_epoch",
                            "log_start_offset", "high_watermark")
#: a topic with a replicated partition (feature replication, RF > 1) shows these too
REPLICATED_COLUMNS = PARTITION_COLUMNS + columns("joining", "last_stable_offset")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "topics", parents=parents, help="create, delete, list, describe and alter topics",
        description="Manage the topics of a kafkalog cluster (kafka-topics.sh's options).",
        epilog=OUTPUT_HELP + " --describe (and --create/--alter/--increase-partitions with "
               "--json) print one object per topic: topic, topic_id, partition_count, "
               "replication_factor, configs, partitions [{partition, leader, replicas, isr, "
               "leader_epoch, log_start_offset, high_watermark}]: leader is the replica where "
               "data is written and read; isr the in-sync replicas, leader first (the leader "
               "alone unless the cluster has the feature replication and the topic more than "
               "one replica). A replicated topic's partitions also have joining (caught-up "
               "replicas about to join the ISR), last_stable_offset (the start of the lowest "
               "open write) and partition_epoch; their high_watermark is the stored one, which "
               "waits for the ISR (docs/protocol.md 1.3). --list prints one name per line "
               "({\"topic\"} with --json); --delete prints {\"topic\", \"deleted\"} with --json.")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--create", action="store_true",
                     help="create --topic (creates the cluster itself if URL holds none)")
    act.add_argument("--delete", action="store_true", help="delete --topic and its data")
    act.add_argument("--list", action="store_true", help="list topic names")
    act.add_argument("--describe", action="store_true", help="describe --topic, or every topic")
    act.add_argument("--alter", action="store_true",
                     help="change --topic's configs (--config/--delete-config), or its partition "
                          "count (--partitions, as kafka-topics.sh --alter does)")
    act.add_argument("--increase-partitions", action="store_true",
                     help="raise --topic's partition count to --partitions")
    p.add_argument("--topic", metavar="T")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="partition count (--create: default 1)")
    p.add_argument("--replication-factor", type=int, metavar="N",
                   help="log dirs holding each partition, placed as Kafka places replicas "
                        "(--create: default 1; at most the number of log dirs, see log-dirs "
                        "--add)")
    p.add_argument("--config", action="append", default=[], metavar="K=V",
                   help="a topic config (repeatable), e.g. retention.ms=86400000")
    p.add_argument("--delete-config", action="append", default=[], metavar="K",
                   help="--alter: remove a topic config, back to its default (repeatable)")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is smaller than their replicas")
    p.add_argument("--under-min-isr-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is smaller than min.insync.replicas "
                        "(at most the replication factor); their high watermark does not move")
    p.add_argument("--at-min-isr-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is exactly min.insync.replicas (at "
                        "most the replication factor)")
    p.set_defaults(run=run)


def run(args) -> int:
    action, flag = chosen_action(
        args, {"create": ("topic", "partitions", "replication_factor", "config"),
               "delete": ("topic",), "list": (), "describe": ("topic", *FILTERS),
               "alter": ("topic", "partitions", "config", "delete_config"),
               "increase_partitions": ("topic", "partitions")}, OPTIONS)
    if action not in ("list", "describe"):
        require(args, flag, ("topic", "--topic T"))
    if args.topic is not None:
        validate_topic_name(args.topic)
    return globals()[f"_{action}"](args)


def _create(args) -> int:
    partitions = 1 if args.partitions is None else args.partitions
    rf = 1 if args.replication_factor is None else args.replication_factor
    non_negative(partitions, "--partitions", 1)
    non_negative(rf, "--replication-factor", 1)
    configs = parse_configs(args.config)
    LogConfig.from_properties(configs)
    if rf > 1 and args.cluster and not cluster_exists(args.cluster, cluster_options(args)):
        raise InvalidConfigError(f"a new cluster has one log dir: --replication-factor {rf} "
                                 "needs a cluster with that many (log-dirs --add URL)")
    admin = open_admin(args, "topics --create", create=True)
    if args.topic in admin.list_topics():
        raise TopicAlreadyExistsError(f"topic {args.topic!r} already exists")
    desc = admin.create_topic(args.topic, partitions, rf, configs)
    say(args, f"Created topic {args.topic}.", _topic_json(desc))
    return 0


def _delete(args) -> int:
    admin = open_admin(args, "topics --delete")
    admin.delete_topic(args.topic)
    say(args, f"Deleted topic {args.topic}.", {"topic": args.topic, "deleted": True})
    return 0


def _list(args) -> int:
    admin = open_admin(args, "topics --list")
    for name in admin.list_topics():
        say(args, name, {"topic": name})
    return 0


def _describe(args) -> int:
    chosen = [f for f in FILTERS if getattr(args, f, False)]
    if len(chosen) > 1:
        raise InvalidConfigError(f"{OPTIONS[chosen[0]]} and {OPTIONS[chosen[1]]} do not go "
                                 "together (one partition filter at a time)")
    admin = open_admin(args, "topics --describe")
    names = [args.topic] if args.topic else admin.list_topics()
    descs = [admin.describe_topic(n) for n in names]   # all or nothing: unknown topic -> error
    shown = 0
    for desc in descs:
        t = _topic_json(desc)
        if chosen:   # kafka-topics.sh: only the matching partitions, topics without any left out
            flag = FILTERS[chosen[0]]
            min_isr = LogConfig.from_properties(desc.configs).min_insync_replicas
            t["partitions"] = [p for p in t["partitions"]
                               if isr_health(len(p["isr"]), len(p["replicas"]), min_isr)[flag]]
            if not t["partitions"]:
                continue
        if args.json:
            emit_json(t)
            continue
        if shown:
            sys.stdout.write("\n")
        _print_description(t)
        shown += 1
    return 0


def _alter(args) -> int:
    set_configs = parse_configs(args.config)
    deletes = list(dict.fromkeys(args.delete_config))
    if args.partitions is not None:
        if set_configs or deletes:
            raise InvalidConfigError("--alter takes either --partitions or --config/"
                                     "--delete-config, not both (run it twice)")
        return _increase_partitions(args)
    if not set_configs and not deletes:
        raise InvalidConfigError("--alter needs --config K=V, --delete-config K or --partitions N")
    both = sorted(set(set_configs) & set(deletes))
    if both:
        raise InvalidConfigError(f"{', '.join(both)}: both --config and --delete-config")
    LogConfig.from_properties(set_configs)
    admin = open_admin(args, "topics --alter")
    current = admin.describe_topic(args.topic).configs
    unset = [k for k in deletes if k not in current]
    if unset:
        raise InvalidConfigError(f"--delete-config {', '.join(unset)}: not set on topic "
                                 f"{args.topic!r} (set: {', '.join(sorted(current)) or 'none'})")
    merged = {k: v for k, v in current.items() if k not in deletes}
    merged.update(set_configs)
    LogConfig.from_properties(merged)
    desc = admin.alter_configs(args.topic, set_configs, deletes)
    say(args, f"Updated configs of topic {args.topic}: "
              f"{_configs_text(desc.configs)}.", _topic_json(desc))
    return 0


def _increase_partitions(args) -> int:
    require(args, "--increase-partitions" if args.increase_partitions else "--alter",
            ("partitions", "--partitions N"))
    admin = open_admin(args, "topics")
    current = len(admin.describe_topic(args.topic).partitions)
    if args.partitions <= current:
        raise InvalidPartitionsError(f"topic {args.topic!r} has {current} partitions; "
                                     f"--partitions must be larger, got {args.partitions}")
    desc = admin.create_partitions(args.topic, args.partitions)
    say(args, f"Topic {args.topic} now has {len(desc.partitions)} partitions.", _topic_json(desc))
    return 0


def _replicated(desc) -> bool:
    return any(p.partition_epoch is not None for p in desc.partitions)


def _topic_json(desc) -> dict:
    replicated = _replicated(desc)
    return {"topic": desc.name, "topic_id": desc.topic_id,
            "partition_count": len(desc.partitions),
            "replication_factor": len(desc.partitions[0].replicas) if desc.partitions else 0,
            "configs": dict(sorted(desc.configs.items())),
            "partitions": [_partition_json(p, replicated) for p in desc.partitions]}


def _partition_json(p, replicated: bool) -> dict:
    out = {"partition": p.partition, "leader": p.leader, "replicas": list(p.replicas),
           "isr": list(p.isr), "leader_epoch": p.leader_epoch,
           "log_start_offset": p.log_start_offset, "high_watermark": p.high_watermark}
    if replicated:
        out.update(joining=list(p.joining), last_stable_offset=p.last_stable_offset,
                   partition_epoch=p.partition_epoch)
    return out


def _configs_text(configs) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(configs.items())) or "(defaults)"


def _print_description(t: dict) -> None:
    """A topic's line, then its partitions as a table (``t``: :func:`_topic_json`'s form)."""
    replicated = any("partition_epoch" in p for p in t["partitions"])
    sys.stdout.write(f"Topic: {t['topic']}  TopicId: {t['topic_id']}  PartitionCount: "
                     f"{t['partition_count']}  ReplicationFactor: {t['replication_factor']}  "
                     f"Configs: {_configs_text(t['configs'])}\n")
    cols = REPLICATED_COLUMNS if replicated else PARTITION_COLUMNS
    sys.stdout.write("\n".join(format_table(cols, t["partitions"])) + "\n")

