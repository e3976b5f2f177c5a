"""Client-side settings for a kafkalog cluster, from a Java-properties file (conf/cluster.properties).

Only settings of *this* process live here: everything shared (topics, their configs, ACLs) is in
the metadata log. Unknown keys are errors, so a typo never silently falls back to a default.
"""
from __future__ import annotations

from typing import Any, Dict

from ..config_def import INT, LONG, STRING, ConfigDef, at_least
from ..errors import InvalidConfigError
from ..format.checkpoint import parse_properties
from .metalog import DEFAULT_METADATA_RETENTION_MS, DEFAULT_SNAPSHOT_INTERVAL

#: this process's settings: the one declaration of each (``Cluster``'s defaults,
#: ``cluster_options``, docs/configuration.md); anything under ``storage.`` goes to the storage
#: backend as it is
CLUSTER_SETTINGS = (
    ConfigDef("cluster setting")
    .define("transaction.timeout.ms", INT, 60_000,
            "how long a write may stay reserved but uncommitted before anyone may abort it",
            validator=at_least(1), attr="transaction_timeout_ms")
    .define("kafkalog.snapshot.interval", INT, DEFAULT_SNAPSHOT_INTERVAL,
            "write a metadata snapshot every this many entries", validator=at_least(1),
            attr="snapshot_interval")
    .define("metadata.max.retention.ms", LONG, DEFAULT_METADATA_RETENTION_MS,
            "how long cleanup keeps metadata entries and snapshots below the newest verified "
            "snapshot", validator=at_least(0), attr="metadata_max_retention_ms")
    .define("kafkalog.principal", STRING, None,
            "who this process is, for ACLs (null: $KAFKALOG_PRINCIPAL, else User:<OS user>)",
            attr="principal"))
STORAGE_PREFIX = "storage."
#: the ``Cluster`` keyword arguments that are this client's settings, not storage options
CLIENT_SETTINGS = tuple(CLUSTER_SETTINGS.attrs())


def cluster_options(props: Dict[str, str]) -> Dict[str, Any]:
    """Map properties to ``Cluster(url, **options)`` keyword arguments."""
    def is_storage(key: str) -> bool:
        return key.startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX)

    for key in props:
        if not is_storage(key) and key not in CLUSTER_SETTINGS:
            raise InvalidConfigError(f"unknown cluster setting {key!r}; known: "
                                     f"{sorted(CLUSTER_SETTINGS.names())} and storage.*")
    rest = {k: v for k, v in props.items() if not is_storage(k)}
    storage = {k[len(STORAGE_PREFIX):]: v for k, v in props.items() if is_storage(k)}
    out: Dict[str, Any] = CLUSTER_SETTINGS.parse(rest, by_attr=True)
    out.update(storage)
    return out


def read_properties_file(path: str, what: str) -> Dict[str, str]:
    """A ``.properties`` file read as Java reads one (Latin-1); an unreadable one is a typed
    error naming ``what`` it was meant to be."""
    try:
        with open(path, encoding="latin-1") as f:
            text = f.read()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read {what} {path!r}: {exc.strerror}") from None
    return parse_properties(text)


def load_cluster_config(path: str) -> Dict[str, Any]:
    return cluster_options(read_properties_file(path, "cluster config"))
