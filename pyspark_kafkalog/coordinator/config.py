"""The coordinator's settings from a Java-properties file (conf/coordinator.properties).

Settings of the service process only: which port, which token file, how long the lease. Unknown
keys are errors, so a typo never silently falls back to a default. Command-line options win.
"""
from __future__ import annotations

from typing import Any, Dict

from ..errors import InvalidConfigError
from ..format.checkpoint import parse_properties

#: property -> (Coordinator keyword, type)
KEYS = {"coordinator.bind": ("bind", str),
        "coordinator.advertised.address": ("advertised_address", str),
        "coordinator.metrics.port": ("metrics_port", int),
        "coordinator.token.file": ("token_file", str),
        "coordinator.lease.ms": ("lease_ms", int),
        "coordinator.on.fenced": ("on_fenced", str)}


def coordinator_options(props: Dict[str, str]) -> Dict[str, Any]:
    """Map properties to ``Coordinator(cluster, **options)`` keyword arguments (an empty
    value: the default)."""
    out: Dict[str, Any] = {}
    for key, value in props.items():
        if key not in KEYS:
            raise InvalidConfigError(f"unknown coordinator setting {key!r}; known: "
                                     f"{sorted(KEYS)}")
        name, kind = KEYS[key]
        value = value.strip()
        if not value:
            continue
        if kind is int:
            try:
                value = int(value)
            except ValueError:
                raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
        out[name] = value
    return out


def load_coordinator_config(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="latin-1") as f:
            text = f.read()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read coordinator config {path!r}: "
                                 f"{exc.strerror}") from None
    return coordinator_options(parse_properties(text))
