"""Client quotas (KIP-13) as the metadata log stores them (docs/protocol.md §12): which byte
rate applies to a client id, for produce and for fetch. One rule, here: the coordinator that
enforces quotas, ``configs --describe`` and the admin API all call :func:`quota_for`.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

PRODUCE, FETCH = "produce", "fetch"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
#: quota kind -> Kafka's config name on a clients entity
CONFIG_OF = {PRODUCE: PRODUCER_BYTE_RATE, FETCH: CONSUMER_BYTE_RATE}
QUOTA_CONFIGS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
#: Kafka's name of the default entity
DEFAULT_ENTITY = "<default>"
MAX_CLIENT_ID = 255


def check_entity(entity: str) -> Optional[str]:
    if entity == DEFAULT_ENTITY:
        return None
    if not entity:
        return ("the empty client id shares the default quota (KIP-13): set the default entity "
                "instead")
    if len(entity) > MAX_CLIENT_ID:
        return f"a client id has at most {MAX_CLIENT_ID} characters"
    return None


def parse_rate(name: str, value) -> float:
    """A byte rate: a decimal number > 0 (Kafka's quota configs are doubles)."""
    try:
        rate = float(str(value).strip())
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{name} must be a number of bytes per second > 0, got {value!r}")
    return rate


def quota_for(quotas: Mapping[str, Mapping[str, str]], client_id: Optional[str], kind: str,
              defaults: Optional[Mapping[str, float]] = None) -> Optional[float]:
    """Bytes per second for ``client_id``'s ``kind`` (produce or fetch), or None for no quota:
    its own value (never for the empty client id), the default entity's, then the
    coordinator's ``quota.producer.default`` / ``quota.consumer.default``."""
    name = CONFIG_OF[kind]
    if client_id:
        own = quotas.get(client_id, {}).get(name)
        if own is not None:
            return float(own)
    default = quotas.get(DEFAULT_ENTITY, {}).get(name)
    if default is not None:
        return float(default)
    return (defaults or {}).get(kind)


def describe(quotas: Mapping[str, Mapping[str, str]]) -> Dict[str, Dict[str, float]]:
    return {entity: {k: float(v) for k, v in values.items()}
            for entity, values in sorted(quotas.items())}
