"""``kafkalog --cluster URL configs``: Kafka's ``kafka-configs.sh`` for client quotas (KIP-13,
docs/protocol.md §12): ``--entity-type clients`` with ``--entity-name X`` or
``--entity-default``, and ``--alter --add-config K=V[,K=V] / --delete-config K[,K]`` or
``--describe``. Topic configs stay with ``topics --alter --config``."""
from __future__ import annotations

from ..cluster.quotas import DEFAULT_ENTITY, QUOTA_CONFIGS, check_new_entity, check_new_rate
from ..errors import InvalidConfigError
from .cluster_common import OUTPUT_HELP, columns, emit_rows, open_admin, say

QUOTA_COLUMNS = columns("entity", "producer_byte_rate", "consumer_byte_rate")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "configs", parents=parents, help="client quotas (kafka-configs.sh --entity-type clients)",
        description="Byte-rate quotas per client id (KIP-13): producer_byte_rate and "
                    "consumer_byte_rate, bytes per second, for one client id (--entity-name) or "
                    "the default entity (--entity-default), which the empty client id shares. "
                    "They are stored in the metadata log and take effect without a restart; the "
                    "coordinator enforces them (docs/operations.md).",
        epilog=OUTPUT_HELP + " --describe columns: entity, producer_byte_rate, "
               "consumer_byte_rate (empty: not set on that entity).")
    p.add_argument("--entity-type", required=True, choices=("clients", "topics", "users",
                                                             "brokers"))
    who = p.add_mutually_exclusive_group()
    who.add_argument("--entity-name", metavar="CLIENT_ID")
    who.add_argument("--entity-default", action="store_true")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--alter", action="store_true")
    act.add_argument("--describe", action="store_true")
    p.add_argument("--add-config", metavar="K=V[,K=V]", default=None)
    p.add_argument("--delete-config", metavar="K[,K]", default=None)
    p.set_defaults(run=run_configs)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def _pairs(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"--add-config takes K=V[,K=V], got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _check_alter(entity: str, add: dict) -> None:
    """The admin API's checks (docs/protocol.md §12), made first: a bad client id or value is
    exit status 2 with one line naming it, and nothing is read or written."""
    bad = check_new_entity(entity, setting=bool(add))
    if bad:
        raise InvalidConfigError(f"--entity-name {entity!r}: {bad}")
    for key, value in add.items():
        if key not in QUOTA_CONFIGS:
            raise InvalidConfigError(f"unknown quota config {key!r}; known: "
                                     f"{', '.join(QUOTA_CONFIGS)}")
        check_new_rate(key, value)


def run_configs(args) -> int:
    if args.entity_type != "clients":
        hint = ("use topics --alter --topic T --config K=V" if args.entity_type == "topics"
                else "only client quotas exist here")
        raise InvalidConfigError(f"--entity-type {args.entity_type}: {hint}")
    entity = DEFAULT_ENTITY if args.entity_default else args.entity_name
    if args.alter:
        if entity is None:
            raise InvalidConfigError("--alter needs --entity-name CLIENT_ID or --entity-default")
        if not args.add_config and not args.delete_config:
            raise InvalidConfigError("--alter needs --add-config and/or --delete-config")
        add = _pairs(args.add_config or "")
        _check_alter(entity, add)            # before the cluster is even opened
        admin = open_admin(args, "configs")
        values = admin.alter_client_quotas(
            None if args.entity_default else entity, add,
            [k.strip() for k in (args.delete_config or "").split(",") if k.strip()])
        say(args, f"Completed updating config for client {entity}: " + (", ".join(
            f"{k}={_num(v)}" for k, v in sorted(values.items())) or "no quota left") + ".",
            {"entity": entity, **values})
        return 0
    if args.add_config or args.delete_config:
        raise InvalidConfigError("--add-config and --delete-config go with --alter")
    admin = open_admin(args, "configs")
    quotas = admin.describe_client_quotas(entity)
    emit_rows(args, QUOTA_COLUMNS, [{"entity": e, **v} for e, v in quotas.items()])
    if not args.json and not quotas:
        say(args, "No client quotas." if entity is None else f"No quotas for {entity}.")
    return 0
