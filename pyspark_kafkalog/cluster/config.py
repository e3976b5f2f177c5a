"""Client-side settings for a kafkalog cluster, from a Java-properties file (conf/cluster.properties).

Only settings of *this* process live here: everything shared (topics, their configs, ACLs) is in
the metadata log. Unknown keys are errors, so a typo never silently falls back to a default.
"""
from __future__ import annotations

from typing import Any, Dict

from ..errors import InvalidConfigError
from ..format.checkpoint import parse_properties

_INT_KEYS = {"transaction.timeout.ms": "transaction_timeout_ms",
             "kafkalog.snapshot.interval": "snapshot_interval",
             "metadata.max.retention.ms": "metadata_max_retention_ms"}
#: settings that may be 0 (the others must be at least 1)
_ZERO_OK = {"metadata.max.retention.ms"}
_STR_KEYS = {"kafkalog.principal": "principal"}
STORAGE_PREFIX = "storage."
#: the ``Cluster`` keyword arguments that are this client's settings, not storage options
CLIENT_SETTINGS = tuple(_INT_KEYS.values()) + tuple(_STR_KEYS.values())


def cluster_options(props: Dict[str, str]) -> Dict[str, Any]:
    """Map properties to ``Cluster(url, **options)`` keyword arguments."""
    out: Dict[str, Any] = {}
    for key, value in props.items():
        if key in _INT_KEYS:
            try:
                out[_INT_KEYS[key]] = int(value)
            except ValueError:
                raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
            least = 0 if key in _ZERO_OK else 1
            if out[_INT_KEYS[key]] < least:
                raise InvalidConfigError(f"{key} must be >= {least}, got {value!r}")
        elif key in _STR_KEYS:
            out[_STR_KEYS[key]] = value
        elif key.startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
            out[key[len(STORAGE_PREFIX):]] = value
        else:
            raise InvalidConfigError(f"unknown cluster setting {key!r}; known: "
                                     f"{sorted(_INT_KEYS) + sorted(_STR_KEYS)} and storage.*")
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
