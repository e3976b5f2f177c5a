"""Client quotas (KIP-13) as the metadata log stores them (docs/protocol.md §12): which byte
rate applies to a client id, for produce and for fetch. One rule, here: the coordinator that
enforces quotas, ``configs --describe`` and the admin API all call :func:`quota_for`.

Two strengths of checks, on purpose. Replay (:func:`check_entity`, :func:`parse_rate`) keeps
the rule entries were first written under, a client id of at most 255 characters and any
finite decimal number > 0, so that every version of this package replays an existing log to
the same state. Writers (:func:`check_new_entity`, :func:`check_new_rate`: the admin API and
``kafkalog configs``) refuse more, as ``kafka-configs.sh`` does: byte rates are Kafka LONG
configs, so a value is a whole number of bytes per second from 1 to Long.MAX_VALUE, and a
client id holds no control character. A value that only replay accepts (``1e-300``, written
by an older client) cannot hurt the coordinator: it bounds every throttle time (§12.1).
"""
from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Dict, Mapping, Optional

from ..errors import InvalidConfigError

PRODUCE, FETCH = "produce", "fetch"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
#: quota kind -> Kafka's config name on a clients entity
CONFIG_OF = {PRODUCE: PRODUCER_BYTE_RATE, FETCH: CONSUMER_BYTE_RATE}
QUOTA_CONFIGS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
#: Kafka's name of the default entity
DEFAULT_ENTITY = "<default>"
MAX_CLIENT_ID = 255
#: Java's Long.MAX_VALUE
LONG_MAX = 2 ** 63 - 1
#: producer_byte_rate and consumer_byte_rate are LONG configs in Kafka
MAX_RATE = LONG_MAX
#: what a writer accepts as a byte rate (docs/protocol.md §12)
RATE_RULE = (f"a whole number of bytes per second from 1 to {MAX_RATE} (Long.MAX_VALUE), in "
             "decimal: 1048576, 1048576.0 or 1e6")
#: a decimal number as Java's Double.valueOf reads one, less hex, NaN, Infinity and the d/f
#: suffixes (Python's float() would also take 1_000, nan and inf)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_MAX_RATE_TEXT = 64


def check_entity(entity: str) -> Optional[str]:
    """What is wrong with ``entity`` as replay judges a ``client_quota`` action, or None."""
    if entity == DEFAULT_ENTITY:
        return None
    if not entity:
        return ("the empty client id shares the default quota (KIP-13): set the default entity "
                "instead")
    if len(entity) > MAX_CLIENT_ID:
        return f"a client id has at most {MAX_CLIENT_ID} characters"
    return None


def check_new_entity(entity: str, *, setting: bool = True) -> Optional[str]:
    """What is wrong with ``entity`` for a new ``client_quota`` action, or None: replay's rule,
    and, for an action that sets a value (``setting``), no control character (Unicode category
    Cc: NUL, CR, LF, DEL, ...) and no lone surrogate, which no client id typed on purpose holds
    and which would reach logs and metric labels as they are. An action that only deletes may
    name any entity replay takes, so that a value an older client set can be removed."""
    if not isinstance(entity, str):
        return f"a client id is a string, got {type(entity).__name__}"
    bad = check_entity(entity)
    if bad is not None or entity == DEFAULT_ENTITY or not setting:
        return bad
    for i, ch in enumerate(entity):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            what = "a lone surrogate" if unicodedata.category(ch) == "Cs" else \
                "a control character"
            return (f"a client id holds no control character or lone surrogate, got {what} "
                    f"(U+{ord(ch):04X}) at position {i}")
    return None


def parse_rate(name: str, value) -> float:
    """A byte rate as replay accepts it: a decimal number > 0 (Kafka's quota configs are
    doubles on the wire). Writers check :func:`check_new_rate` first."""
    try:
        rate = float(str(value).strip())
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{name} must be a number of bytes per second > 0, got {value!r}")
    return rate


def check_new_rate(name: str, value) -> str:
    """``value`` as a writer stores it (its decimal digits), or :class:`InvalidConfigError`
    naming the value and the rule it breaks: :data:`RATE_RULE`, Kafka's for its LONG quota
    configs (kafka-configs.sh takes the value as a double; the controller refuses one below 1
    byte per second, a fraction, or one above Long.MAX_VALUE). Checked exactly, in decimal:
    9223372036854775808 is refused, though it is Long.MAX_VALUE as a double."""
    text = str(value).strip()
    if isinstance(value, bool) or len(text) > _MAX_RATE_TEXT or not _DECIMAL.fullmatch(text):
        raise InvalidConfigError(f"{name}={str(value)[:_MAX_RATE_TEXT]!r} is not a decimal "
                                 f"number; a byte rate is {RATE_RULE}")
    try:
        rate = Decimal(text)
    except InvalidOperation:            # not reached: the pattern is Decimal's syntax
        raise InvalidConfigError(f"{name}={text!r} is not a decimal number; a byte rate is "
                                 f"{RATE_RULE}") from None
    if rate < 1:
        raise InvalidConfigError(f"{name}={text!r} is below 1 byte per second; a byte rate is "
                                 f"{RATE_RULE}")
    if rate > MAX_RATE:
        raise InvalidConfigError(f"{name}={text!r} is above Long.MAX_VALUE ({MAX_RATE}); a byte "
                                 f"rate is {RATE_RULE}")
    if rate != rate.to_integral_value():
        raise InvalidConfigError(f"{name}={text!r} is not a whole number of bytes per second; a "
                                 f"byte rate is {RATE_RULE}")
    return str(int(rate))


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
