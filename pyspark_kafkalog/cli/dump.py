"""``kafkalog dump``: kafka-dump-log's output and options, plus ``--json`` for scripts.

Text output follows kafka-dump-log line for line. With ``--json`` every line is one JSON object:
a batch, a record (``--deep-iteration``; the fields of the golden ``expected.jsonl``, with key,
value and headers in base64 under ``--print-data-log``), or an index entry. Problems found (CRC
failures, trailing bytes, index entries that disagree with the log) go to stderr and make the
exit status 1.

Problems in a ``.log`` are reported as every reader reports them (one line each: the file, the
error type and ``format.batch``'s message, which names the entry's position): the walk is the
segment's, the CRC check ``batch.validate``. Unlike the readers, dump goes on past a batch that
fails its CRC, as kafka-dump-log does, printing it with ``isvalid: false``.
"""
from __future__ import annotations

import base64
import json
import sys

from ..errors import CorruptRecordError, KafkaLogError, StorageNotFoundError
from ..format import index as idx
from ..format.batch import validate
from ..format.codecs import CODEC_NAMES
from ..format.columnar import decode_records
from ..format.records import CONTROL_ABORT, CONTROL_COMMIT, timestamp_type_name
from ..log.logdir import split_url
from ..log.segment import INDEX_SUFFIX, LogSegment
from ..storage import open_storage
from .cluster_common import add_storage_config, storage_options

RECORD_INDENT = "|"


def add_parser(sub) -> None:
    p = sub.add_parser("dump", help="print the contents of .log/.index/.timeindex/.txnindex files",
                       description="Dump Kafka segment and index files (kafka-dump-log's options).")
    p.add_argument("--files", required=True,
                   help="comma-separated .log/.index/.timeindex/.txnindex paths or URLs")
    p.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    p.add_argument("--print-data-log", action="store_true",
                   help="print keys, values and headers (implies --deep-iteration)")
    p.add_argument("--verify-index-only", action="store_true",
                   help="check index entries against the log without printing them")
    p.add_argument("--index-sanity-check", action="store_true",
                   help="check index sanity (and, for .log files, every batch) without printing")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    add_storage_config(p)
    p.set_defaults(run=run)


class _Out:
    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.problems = 0

    def line(self, text: str, obj=None) -> None:
        if self.as_json:
            if obj is not None:
                sys.stdout.write(json.dumps(obj) + "\n")
        else:
            sys.stdout.write(text + "\n")

    def problem(self, text: str) -> None:
        self.problems += 1
        print(text, file=sys.stderr)

    def corrupt(self, f: str, seg: LogSegment, exc: CorruptRecordError) -> None:
        """``exc`` as one line naming ``f`` (the file as the user gave it, so without the
        segment's own name in front of the message)."""
        detail = str(exc)
        prefix = seg.log_path + ": "
        if detail.startswith(prefix):
            detail = detail[len(prefix):]
        self.problem(f"{f}: {type(exc).__name__}: {detail}")


def run(args) -> int:
    out = _Out(args.json)
    files = [f for f in args.files.split(",") if f.strip()]
    if not files:
        raise CorruptRecordError("--files names no file")
    for f in files:
        f = f.strip()
        parent, name = split_url(f)
        options = storage_options(args)
        storage = (open_storage(parent, **options) if "://" in parent
                   else _existing_local(parent, f, options))
        if not storage.exists(name):
            raise StorageNotFoundError(f"no such file: {f}")
        base_text, _, suffix = name.partition(".")
        if not base_text.isdigit() or suffix not in ("log", "index", "timeindex", "txnindex"):
            print(f"Ignoring unknown file {f}", file=sys.stderr)
            continue
        seg = LogSegment(storage, "", int(base_text))
        out.line(f"Dumping {f}")
        try:
            {"log": _dump_log, "index": _dump_index, "timeindex": _dump_time_index,
             "txnindex": _dump_txn_index}[suffix](seg, f, args, out)
        except KafkaLogError as exc:
            out.problem(f"{f}: {type(exc).__name__}: {exc}")
    return 1 if out.problems else 0


def _existing_local(parent: str, original: str, options: dict):
    import os
    if not os.path.isdir(parent):
        raise StorageNotFoundError(f"no such file: {original}")
    return open_storage(parent, **options)


def _b64(b):
    return None if b is None else base64.b64encode(b).decode("ascii")


def _text(b) -> str:
    return "null" if b is None else b.decode("utf-8", errors="replace")


def _dump_log(seg: LogSegment, f: str, args, out: _Out) -> None:
    deep = args.deep_iteration or args.print_data_log
    before = out.problems
    check_only = args.index_sanity_check or args.verify_index_only
    if not check_only:
        out.line(f"Log starting offset: {seg.base_offset}")
    valid_bytes = 0
    last_offset = None
    size = seg.size()
    try:
        # strict: a dumped file is taken as complete, so a partial entry at its end is damage
        for h, body in seg.walk(0, size, with_body=True, window=8 << 20, strict=True):
            try:
                validate(body, h, h.position)
                is_valid = True
            except CorruptRecordError as exc:
                is_valid = False
                out.corrupt(f, seg, exc)
            if not check_only and not (deep and out.as_json):
                _print_batch(h, is_valid, out)
            if deep and is_valid and not check_only:
                for r in decode_records(body, validate=False):
                    if last_offset is not None and r.offset != last_offset + 1:
                        pass  # gaps are legal (compaction); kafka-dump-log only notes them
                    last_offset = r.offset
                    _print_record(seg, h, r, args.print_data_log, out)
            valid_bytes = h.end
    except CorruptRecordError as exc:
        out.corrupt(f, seg, exc)
    trailing = size - valid_bytes
    if trailing > 0:
        out.problem(f"Found {trailing} invalid bytes at the end of {f.rsplit('/', 1)[-1]}")
    elif check_only and out.problems == before:
        out.line(f"{f} passed sanity check.", {"file": f, "sanity_check": "passed"})


def _print_batch(h, is_valid: bool, out: _Out) -> None:
    ts_name = timestamp_type_name(h.timestamp_type)
    codec = CODEC_NAMES.get(h.compression, str(h.compression))
    if h.magic >= 2:
        last_seq = -1 if h.base_sequence < 0 else h.base_sequence + (h.last_offset - h.base_offset)
        head = (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
                f"baseSequence: {h.base_sequence} lastSequence: {last_seq} producerId: "
                f"{h.producer_id} producerEpoch: {h.producer_epoch} partitionLeaderEpoch: "
                f"{h.partition_leader_epoch} isTransactional: {str(h.is_transactional).lower()} "
                f"isControl: {str(h.is_control).lower()} deleteHorizonMs: "
                f"{'OptionalLong[%d]' % h.base_timestamp if h.has_delete_horizon else 'OptionalLong.empty'}")
    else:
        head = f"offset: {h.last_offset}"
    text = (f"{head} position: {h.position} {ts_name}: {h.max_timestamp} size: {h.size} "
            f"magic: {h.magic} compresscodec: {codec} crc: {h.crc} isvalid: {str(is_valid).lower()}")
    out.line(text, {
        "baseOffset": h.base_offset, "lastOffset": h.last_offset, "count": h.record_count,
        "position": h.position, "timestampType": h.timestamp_type, "maxTimestamp": h.max_timestamp,
        "size": h.size, "magic": h.magic, "compresscodec": codec, "crc": h.crc,
        "isvalid": is_valid, "producerId": h.producer_id, "producerEpoch": h.producer_epoch,
        "baseSequence": h.base_sequence, "partitionLeaderEpoch": h.partition_leader_epoch,
        "isTransactional": h.is_transactional, "isControl": h.is_control})


def _print_record(seg, h, r, print_data: bool, out: _Out) -> None:
    ts_name = timestamp_type_name(h.timestamp_type)
    ksize = -1 if r.key is None else len(r.key)
    vsize = -1 if r.value is None else len(r.value)
    parts = [f"{RECORD_INDENT} offset: {r.offset} {ts_name}: {r.timestamp} keySize: {ksize} "
             f"valueSize: {vsize}"]
    if h.magic >= 2:
        seq = -1 if h.base_sequence < 0 else h.base_sequence + (r.offset - h.base_offset)
        parts.append(f" sequence: {seq} headerKeys: [{','.join(k for k, _ in r.headers)}]")
    if h.is_control and r.key is not None and len(r.key) >= 4:
        ctype = int.from_bytes(r.key[2:4], "big", signed=True)
        if ctype in (CONTROL_ABORT, CONTROL_COMMIT) and r.value is not None and len(r.value) >= 6:
            epoch = int.from_bytes(r.value[2:6], "big", signed=True)
            parts.append(f" endTxnMarker: {'COMMIT' if ctype == CONTROL_COMMIT else 'ABORT'} "
                         f"coordinatorEpoch: {epoch}")
        else:
            parts.append(f" controlType: UNKNOWN({ctype})")
    if print_data and not h.is_control:
        parts.append(f" key: {_text(r.key)} payload: {_text(r.value)}")
    obj = {"segment": seg.base_offset, "offset": r.offset, "timestamp": r.timestamp,
           "timestampType": r.timestamp_type, "magic": r.magic, "control": r.is_control,
           "transactional": r.is_transactional, "producerId": r.producer_id}
    if print_data:
        obj.update(key=_b64(r.key), value=_b64(r.value),
                   headers=[{"key": k, "value": _b64(v)} for k, v in r.headers])
    else:
        obj.update(keySize=ksize, valueSize=vsize, headerKeys=[k for k, _ in r.headers])
    out.line("".join(parts), obj)


def _read_index(seg: LogSegment, suffix: str) -> bytes:
    return seg.storage.read(seg.path(suffix))


def _check_offset_entries(seg, f, offsets, positions, out) -> None:
    size = seg.size()
    for off, pos in zip(offsets.tolist(), positions.tolist()):
        found = None
        if pos < size:
            try:
                found = next(seg.walk(pos, size), (None, None))[0]
            except CorruptRecordError:
                found = None
        log_offset = -1 if found is None else found.last_offset
        if log_offset != off:
            out.problem(f"Mismatches in :{f}\n  Index offset: {off}, log offset: {log_offset}")


def _dump_index(seg: LogSegment, f: str, args, out: _Out) -> None:
    buf = _read_index(seg, INDEX_SUFFIX)
    before = out.problems
    if not buf:
        out.line(f"{f} is empty.", {"file": f, "entries": 0})
        return
    if args.index_sanity_check:
        idx.sanity_check_offset_index(buf, seg.base_offset)
    offsets, positions = idx.decode_offset_index(buf, seg.base_offset)
    _check_offset_entries(seg, f, offsets, positions, out)
    if args.index_sanity_check:
        if out.problems == before:
            out.line(f"{f} passed sanity check.", {"file": f, "sanity_check": "passed"})
        return
    if not args.verify_index_only:
        for off, pos in zip(offsets.tolist(), positions.tolist()):
            out.line(f"offset: {off} position: {pos}", {"offset": off, "position": pos})


def _dump_time_index(seg: LogSegment, f: str, args, out: _Out) -> None:
    buf = _read_index(seg, ".timeindex")
    before = out.problems
    if args.index_sanity_check:
        idx.sanity_check_time_index(buf, seg.base_offset)
    timestamps, offsets = idx.decode_time_index(buf, seg.base_offset)
    size = seg.size()
    for ts, off in zip(timestamps.tolist(), offsets.tolist()):
        header = None
        for h, _ in seg.walk(seg.lookup_position(off), size):
            if h.last_offset >= off:
                header = h
                break
        if header is None or header.last_offset != off:
            out.problem(f"The following indexed offsets are not found in the log.\n"
                        f"  Indexed offset: {off}, found log offset: "
                        f"{-1 if header is None else header.last_offset}")
        elif header.max_timestamp != ts:
            out.problem(f"Found timestamp mismatch in :{f}\n  Index timestamp: {ts}, "
                        f"log timestamp: {header.max_timestamp}")
        if not (args.index_sanity_check or args.verify_index_only):
            out.line(f"timestamp: {ts} offset: {off}", {"timestamp": ts, "offset": off})
    if args.index_sanity_check and out.problems == before:
        out.line(f"{f} passed sanity check.", {"file": f, "sanity_check": "passed"})


def _dump_txn_index(seg: LogSegment, f: str, args, out: _Out) -> None:
    for t in idx.decode_txn_index(seg.storage.read(seg.path(".txnindex"))):
        out.line(f"version: {t.version} producerId: {t.producer_id} firstOffset: {t.first_offset} "
                 f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}",
                 {"version": t.version, "producerId": t.producer_id, "firstOffset": t.first_offset,
                  "lastOffset": t.last_offset, "lastStableOffset": t.last_stable_offset})
