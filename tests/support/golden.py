"""The Kafka-written golden log dir (``support.shared_paths.GOLDEN``): its cases and their
expected records, in the shape ``expected.jsonl`` stores them."""
from __future__ import annotations

import base64
import json

from support.shared_paths import GOLDEN

CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) if GOLDEN.is_dir() else []
DAMAGED = [c for c in CASES if (GOLDEN / c / "expected-recovery.json").exists()]
UNDAMAGED = [c for c in CASES if c not in DAMAGED]


def expected_records(case: str) -> list:
    with open(GOLDEN / case / "expected.jsonl") as f:
        return [json.loads(line) for line in f]


def b64(b):
    return None if b is None else base64.b64encode(b).decode("ascii")


def record_json(r, segment=None) -> dict:
    """A DecodedRecord in the golden expected.jsonl shape."""
    out = {"offset": r.offset, "timestamp": r.timestamp, "timestampType": r.timestamp_type,
           "magic": r.magic, "control": r.is_control, "transactional": r.is_transactional,
           "producerId": r.producer_id, "key": b64(r.key), "value": b64(r.value),
           "headers": [{"key": k, "value": b64(v)} for k, v in r.headers]}
    if segment is not None:
        out = {"segment": segment, **out}
    return out
