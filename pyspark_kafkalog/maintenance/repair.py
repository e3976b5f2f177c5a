"""Repairing a damaged committed segment of a cluster partition (docs/protocol.md §7.1).

Bit rot, a bad disk or a stray tool can damage a segment that is already committed. Kafka's own
answer, log recovery, truncates the segment in place and drops every segment after it: on a
cluster that would kill readers that map the file (SIGBUS, §1), throw away good segments, and
leave the metadata promising offsets that no longer exist. A repair instead:

- never touches a damaged file's bytes: the replacement is written whole under the same name
  with the storage's atomic replace, which on every backend publishes a new file (a new inode on
  local disk), so a reader still holding the old file keeps reading the old bytes;
- keeps the segment's base offset and the offsets it covers. Every batch that passes its CRC
  and offset checks is copied as it is. Each run of offsets whose batches are lost becomes one
  empty batch (record count 0, last offset delta spanning the run: Kafka's
  ``writeEmptyHeader``, which its log cleaner leaves in compacted logs). The metadata still
  calls those offsets committed, and every reader already steps over an empty batch to the
  offset after it, so the loss becomes a gap and no new metadata action is needed;
- rebuilds the segment's ``.index`` and ``.timeindex`` from the new file (also alone, when only
  they are damaged), and reports the offsets lost per partition.

A damaged batch whose size field is intact lets the scan resume at the next batch; otherwise the
rest of the segment is lost. Magic 0/1 has no empty entry: offsets lost between two kept entries
stay a plain gap (readers step over those too), and a loss at the end of such a segment, which
readers would take for deleted data, is refused.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..errors import (AlreadyExistsError, CorruptRecordError, MissingCommittedDataError,
                      StorageNotFoundError, UnknownTopicOrPartitionError, UnsupportedVersionError)
from ..format import index as idx
from ..format.batch import (HEADER_SIZE_UP_TO_MAGIC, LENGTH_OFFSET, LOG_OVERHEAD,
                            RECORD_OVERHEAD_V0, V2_HEADER_SIZE, BatchHeader, EntryScan, validate)
from ..format.columnar import decode_records
from ..format.encode import encode_empty_batch_v2
from ..format.index_builder import IndexBuilder
from ..format.records import CREATE_TIME, MAGIC_V2, NO_TIMESTAMP, DecodedRecord
from ..log.segment import INDEX_SUFFIX, TIMEINDEX_SUFFIX, LogSegment
from ..progress import tracked

_INT32_MAX = 2**31 - 1
_WINDOW = 8 << 20       # bytes read at a time while scanning


# -- what a repair found and did ---------------------------------------------------------------

@dataclass(frozen=True)
class LostRange:
    """Offsets ``first_offset..last_offset`` (inclusive) whose records could not be kept.
    Committed cluster offsets are dense (one record each), so ``records`` is their count."""

    first_offset: int
    last_offset: int

    @property
    def records(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass
class SegmentRepair:
    """One segment: ``action`` is ``none`` (intact), ``indexes`` (only its indexes rebuilt),
    ``replace`` (a new ``.log`` without the damaged batches, and new indexes) or ``create`` (no
    file held these committed offsets: a new segment of one empty batch spanning them)."""

    path: str                  # the .log, relative to the cluster root
    base_offset: int
    size: int
    new_size: int
    action: str = "none"
    error: Optional[str] = None
    lost: List[LostRange] = field(default_factory=list)

    @property
    def records_lost(self) -> int:
        return sum(r.records for r in self.lost)


@dataclass
class PartitionRepair:
    topic: str
    partition: int
    dry_run: bool
    segments: List[SegmentRepair] = field(default_factory=list)

    @property
    def lost(self) -> List[LostRange]:
        return [r for s in self.segments for r in s.lost]

    @property
    def records_lost(self) -> int:
        return sum(r.records for r in self.lost)

    @property
    def changed(self) -> List[SegmentRepair]:
        return [s for s in self.segments if s.action != "none"]


# -- telling readers where the damage is -------------------------------------------------------

def repair_command(url: str, topic: str, partition: int) -> str:
    return f"kafkalog --cluster {url} repair --topic {topic} --partition {partition}"


def damaged_segment_error(exc: CorruptRecordError, seg: LogSegment, position: Optional[int],
                          fix: str) -> CorruptRecordError:
    """``exc``, raised while decoding bytes read from ``seg`` at ``position``, as an error that
    names the file, the batch's position in it, and the command ``fix`` that repairs it.

    A decoder only knows its buffer, so the batch is located again by walking the file from
    ``position`` and checking each batch's CRC (this costs a read, on the error path only)."""
    detail = str(exc)
    if position is not None:
        detail = f"{detail} (in the batches read from position {position})"
        try:
            for header, body in seg.walk(position, with_body=True, window=_WINDOW, strict=True):
                validate(body, header, header.position)
                if header.position > position + _WINDOW:
                    break
        except CorruptRecordError as located:
            detail = str(located)
        except StorageNotFoundError:
            pass
    prefix = seg.log_path + ": "
    if detail.startswith(prefix):
        detail = detail[len(prefix):]
    where = f"{seg.storage.url.rstrip('/')}/{seg.log_path}"
    rewrites = (" (it rewrites that directory: run it on a copy of a Kafka log dir, never on a "
                "broker's)" if fix.startswith("kafkalog recover") else "")
    err = CorruptRecordError(f"{where}: {detail}. The segment is damaged. `kafkalog dump "
                             f"--index-sanity-check --files {where}` shows where (it only reads); "
                             f"`{fix} --dry-run` shows what mending it would lose, and `{fix}` "
                             f"replaces it with its intact batches{rewrites}", exc.position)
    return err


def names_damaged_segments(fetch):
    """Decorates a reading generator ``fetch(view, start, ...)`` of records or of ``(records,
    next offset)`` pairs (``consumer.fetch_chunks``) so that a corrupt batch fails with an error
    naming the segment file, the batch's position in it and the repair command, rather than a
    position in a buffer."""
    @functools.wraps(fetch)
    def fetch_naming(view, start, *args, **kwargs):
        offset = start
        try:
            for item in fetch(view, start, *args, **kwargs):
                offset = item.offset + 1 if isinstance(item, DecodedRecord) else item[1]
                yield item
        except CorruptRecordError as exc:
            raise _read_error(view, exc, offset) from None
        except MissingCommittedDataError as exc:
            fix = repair_command(view.log.storage.url, view.topic, view.partition)
            raise MissingCommittedDataError(
                f"{exc}. If it was lost, `{fix}` makes the lost offsets a gap that readers step "
                "over (add --dry-run to see them)") from None
    return fetch_naming


def _read_error(view, exc: CorruptRecordError, offset: int) -> CorruptRecordError:
    """``exc`` met while reading ``view`` from ``offset``, located in its segment file."""
    log = view.log
    fix = repair_command(log.storage.url, view.topic, view.partition)
    seg = next((s for s in log.segments if str(exc).startswith(s.log_path + ":")), None)
    position = None                     # the log layer's errors already tell the position
    if seg is None and log.segments:
        seg = log.segments[log.segment_for(offset) or 0]
        try:
            first = seg.find_batch(offset)
        except (CorruptRecordError, StorageNotFoundError):
            first = None
        position = 0 if first is None else first.position
    if seg is None:
        return CorruptRecordError(f"{exc}. Repair the partition with `{fix}`", exc.position)
    return damaged_segment_error(exc, seg, position, fix)


# -- scanning one segment ----------------------------------------------------------------------

class _Window:
    """Reads of a segment in large windows, so the scan costs a few requests, not one per batch."""

    def __init__(self, seg: LogSegment, size: int):
        self.seg, self.size = seg, size
        self.start, self.buf = 0, b""

    def get(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start < self.start or end > self.start + len(self.buf):
            self.start = start
            self.buf = self.seg.read(start, min(self.size, max(end, start + _WINDOW)))
        return self.buf[start - self.start:end - self.start]


@dataclass
class _Plan:
    """The new content of a segment, in file order: ``("copy", position, size)`` runs of the
    old file and ``("empty", bytes)`` batches; the index state they produce; what is lost."""

    pieces: list
    builder: IndexBuilder
    lost: List[LostRange]
    error: Optional[str]


def _check_entry(win: _Window, seg: LogSegment, pos: int, prev_last: int, end_offset: int,
                 resync: bool = False) -> Tuple[Optional[BatchHeader], str]:
    """The entry at ``pos`` if it is whole, passes its CRC and its offsets follow ``prev_last``
    and stay below ``end_offset``; else why not.

    A magic 2 base offset lies outside the CRC, so only its place tells a flipped bit there:
    committed offsets are dense, and a segment a repair wrote marks its gaps with empty batches,
    so a magic 2 batch must start right after ``prev_last`` (``resync``: anywhere after it, for
    the batch after a damaged one). Magic 0/1 segments may have gaps (a repair leaves them).

    The walk's own rules and messages are ``format.batch.EntryScan``'s (its looser offset rule
    aside: this one is stricter). The report names the segment, so the messages do not."""
    size = win.size
    scan = EntryScan(check_offsets=False)
    if pos + HEADER_SIZE_UP_TO_MAGIC >= size:
        return None, str(scan.trailing(pos, size - pos))
    try:
        entry_size = scan.entry_size(win.get(pos, pos + V2_HEADER_SIZE), 0, pos)
    except CorruptRecordError as exc:
        return None, str(exc)
    if pos + entry_size > size:
        return None, str(scan.torn(pos, size - pos, entry_size))
    body = win.get(pos, pos + entry_size)
    try:
        header = scan.header(body, 0, pos)
        validate(body, header, pos)
        if header.magic < 2 and header.compression:
            # the wrapper offset is outside the CRC, and only the inner messages tell the first
            inner = decode_records(body, validate=False)
            if not inner:
                raise CorruptRecordError(f"compressed wrapper at position {pos} holds nothing")
            header = header._replace(base_offset=inner[0].offset)
    except CorruptRecordError as exc:
        return None, str(exc)
    base = header.base_offset if header.base_offset >= 0 else header.last_offset
    misplaced = (base != prev_last + 1 if header.magic >= MAGIC_V2 and not resync
                 else base <= prev_last)
    if (misplaced or base > header.last_offset or header.last_offset >= end_offset
            or header.last_offset - seg.base_offset > _INT32_MAX):
        return None, (f"offsets {base}..{header.last_offset} at position {pos} do not follow "
                      f"{prev_last} below {end_offset} in segment {seg.base_offset}")
    return header, ""


def _plan(seg: LogSegment, size: int, end_offset: int, index_interval: int, magic: int,
          epoch_at) -> _Plan:
    """Walk the segment entry by entry; keep what is intact, turn what is not into lost ranges.

    ``end_offset`` is where the segment's offsets must end (the next visible segment's base
    offset, or the end of the committed range): offsets the file does not reach are lost too.
    ``magic`` is the topic's, for a segment with no intact entry to tell its own."""
    win = _Window(seg, size)
    pieces: list = []                   # ("copy", position, header) | ("lost", first, last)
    error = None
    pos, prev_last = 0, seg.base_offset - 1
    while pos < size:
        header, why = _check_entry(win, seg, pos, prev_last, end_offset)
        if header is not None:
            pieces.append(("copy", pos, header))
            prev_last, pos = header.last_offset, header.end
            magic = header.magic
            continue
        error = error or why
        # the damaged entry's size field may still be right: resume at the entry after it if
        # that one is intact
        length = int.from_bytes(win.get(pos + LENGTH_OFFSET, pos + LOG_OVERHEAD), "big",
                                signed=True) if pos + LOG_OVERHEAD <= size else -1
        nxt = pos + LOG_OVERHEAD + length
        if length >= RECORD_OVERHEAD_V0 and nxt < size:
            following, _ = _check_entry(win, seg, nxt, prev_last, end_offset, resync=True)
            if following is not None:
                first = following.base_offset if following.base_offset >= 0 \
                    else following.last_offset
                if first > prev_last + 1:
                    pieces.append(("lost", prev_last + 1, first - 1))
                prev_last, pos = first - 1, nxt
                continue
        break
    if error is None and prev_last + 1 < end_offset:
        error = (f"the file ends at offset {prev_last}, but offsets up to {end_offset - 1} are "
                 "committed in it")
    if prev_last + 1 < end_offset:
        pieces.append(("lost", prev_last + 1, end_offset - 1))
    return _materialize(seg, pieces, error, index_interval, magic, epoch_at)


def _materialize(seg: LogSegment, pieces: list, error: Optional[str], index_interval: int,
                 magic: int, epoch_at) -> _Plan:
    """Lost ranges as empty batches (magic 2), and the index state of the result.

    Magic 0/1 has no empty entry: a range lost between two kept entries stays a plain gap,
    which readers step over (they look for the first entry at or after an offset), but one at
    the end of the segment would look to readers like deleted data, so it is refused."""
    builder = IndexBuilder(seg.base_offset, index_interval)
    out: list = []
    lost: List[LostRange] = []
    last_good: Optional[BatchHeader] = None
    for piece in pieces:
        if piece[0] == "copy":
            header = piece[2]
            if out and out[-1][0] == "copy" and out[-1][1] + out[-1][2] == piece[1]:
                out[-1] = ("copy", out[-1][1], out[-1][2] + header.size)   # one read per run
            else:
                out.append(("copy", piece[1], header.size))
            builder.add(header.size, header.last_offset, header.max_timestamp)
            last_good = header
            continue
        first, last = piece[1], piece[2]
        lost.append(LostRange(first, last))
        if magic < MAGIC_V2:
            if piece is pieces[-1]:
                raise UnsupportedVersionError(
                    f"{seg.log_path}: {error}; offsets {first}..{last} at the end of this magic "
                    f"{magic} segment would be lost, and magic {magic} cannot mark lost offsets "
                    "(an empty batch needs magic 2): nothing was changed")
            continue
        ts = last_good.max_timestamp if last_good is not None else NO_TIMESTAMP
        ts_type = last_good.timestamp_type if last_good is not None else CREATE_TIME
        empty = encode_empty_batch_v2(first, last, timestamp=ts, timestamp_type=ts_type,
                                      partition_leader_epoch=epoch_at(first))
        out.append(("empty", empty.data))
        builder.add(len(empty.data), last, ts)
    return _Plan(out, builder, lost, error)


def _stored_indexes(seg: LogSegment) -> Tuple[Optional[bytes], Optional[bytes]]:
    out = []
    for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
        try:
            out.append(seg.storage.read(seg.path(suffix)))
        except StorageNotFoundError:
            out.append(None)
    return out[0], out[1]


# -- the repair --------------------------------------------------------------------------------

def _segment_ends(ps, segments) -> List[int]:
    """Per visible segment, the offset its data must reach: the next visible segment's base
    offset, or the end of the committed range (below the high watermark) holding its base."""
    ends = []
    for i, seg in enumerate(segments):
        end = ps.high_watermark
        for start, stop, _ in ps.committed:
            if start <= seg.base_offset < stop:
                end = min(end, stop)
                break
        if i + 1 < len(segments):
            end = min(end, segments[i + 1].base_offset)
        ends.append(end)
    return ends


def _epoch_at(ps, default: int):
    def at(offset: int) -> int:
        for start, stop, epoch in ps.committed:
            if start <= offset < stop:
                return epoch
        return default
    return at


def _plan_partition(cluster, state, topic: str, partition: int, dry_run: bool):
    """Scan every visible segment of ``topic-partition`` and plan its repair; no writes."""
    ps = state.partition(topic, partition)
    if ps is None:
        raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
    config = state.topic_config(topic)
    view = cluster.partition_view(topic, partition, state)
    segments = [s for s in view.log.segments if s.base_offset < ps.high_watermark]
    result = PartitionRepair(topic, partition, dry_run)
    work = []
    epoch_at = _epoch_at(ps, ps.leader_epoch)
    for i, (seg, end) in enumerate(zip(segments, _segment_ends(ps, segments))):
        if i + 1 < len(segments) and segments[i + 1].base_offset <= ps.log_start_offset:
            continue                        # wholly below the log start offset: garbage
        try:
            size = seg.size(refresh=True)
        except StorageNotFoundError:
            continue                        # deleted since listing (retention, delete-records)
        plan = _plan(seg, size, end, config.index_interval_bytes, config.magic, epoch_at)
        new_size = sum(p[2] if p[0] == "copy" else len(p[1]) for p in plan.pieces)
        rep = SegmentRepair(seg.log_path, seg.base_offset, size, new_size, error=plan.error,
                            lost=plan.lost)
        offset_index = idx.encode_offset_index(plan.builder.offset_entries, seg.base_offset)
        time_index = idx.encode_time_index(plan.builder.final_time_entries(), seg.base_offset)
        if plan.error is not None:
            rep.action = "replace"
        elif _stored_indexes(seg) != (offset_index, time_index):
            rep.action, rep.error = "indexes", "its .index or .timeindex differs from the log"
        result.segments.append(rep)
        if rep.action != "none":
            work.append((seg, rep, plan, offset_index, time_index))
    for first, last in _holes(ps, segments):
        seg = LogSegment(cluster.storage, view.log.dir, first, config)
        plan = _materialize(seg, [("lost", first, last)],
                            f"no segment file holds offsets {first}..{last}, which are committed",
                            config.index_interval_bytes, config.magic, epoch_at)
        rep = SegmentRepair(seg.log_path, first, 0, sum(len(p[1]) for p in plan.pieces),
                            action="create", error=plan.error, lost=plan.lost)
        result.segments.append(rep)
        work.append((seg, rep, plan,
                     idx.encode_offset_index(plan.builder.offset_entries, first),
                     idx.encode_time_index(plan.builder.final_time_entries(), first)))
    result.segments.sort(key=lambda r: r.base_offset)
    return result, work


def _holes(ps, segments) -> List[Tuple[int, int]]:
    """Runs of committed offsets (inclusive) that no visible segment holds: a write's first
    segments lost in a machine crash before it was flushed (docs/protocol.md §3, "Durability"),
    or deleted by hand. Each committed range's segments are named from offsets inside it, so
    what lies before the first of them, from the range's start or the log start offset, is
    held by none."""
    bases = sorted(s.base_offset for s in segments)
    holes = []
    for start, stop, _ in ps.committed:
        lo, hi = max(start, ps.log_start_offset), min(stop, ps.high_watermark)
        if lo >= hi:
            continue
        first = next((b for b in bases if start <= b < stop), hi)
        if first > lo:
            holes.append((lo, min(first, hi) - 1))
    return holes


def _apply(work) -> None:
    """Write the planned replacements: whole files by atomic replace, never in place. A
    segment whose size changed since it was scanned (another repair ran) is left alone;
    running the repair again finishes the job."""
    for seg, rep, plan, offset_index, time_index in work:
        if rep.action == "create":
            # indexes first, as any writer (§3); stale ones a lost .log left are replaced
            seg.storage.replace(seg.path(TIMEINDEX_SUFFIX), time_index)
            seg.storage.replace(seg.path(INDEX_SUFFIX), offset_index)
            try:
                seg.storage.create_if_absent(seg.log_path, b"".join(p[1] for p in plan.pieces))
            except AlreadyExistsError:
                rep.action, rep.error = "none", "created while being repaired; run again"
            seg.invalidate()
            continue
        if rep.action == "replace":
            try:
                if seg.size(refresh=True) != rep.size:
                    rep.action, rep.error = "none", "changed while being repaired; run again"
                    continue
                data = b"".join(seg.read(p[1], p[1] + p[2]) if p[0] == "copy" else p[1]
                                for p in plan.pieces)
            except StorageNotFoundError:
                rep.action, rep.error = "none", "deleted while being repaired"
                continue
            # the log first: indexes left stale by a crash here are what the next run rebuilds
            seg.storage.replace(seg.log_path, data)
        seg.storage.replace(seg.path(TIMEINDEX_SUFFIX), time_index)
        seg.storage.replace(seg.path(INDEX_SUFFIX), offset_index)
        seg.invalidate()


def repair(cluster, topic: str, partition: Optional[int] = None, *, dry_run: bool = False
           ) -> List[PartitionRepair]:
    """Validate every batch of the committed segments of one partition of ``topic`` (or all
    of them) and, unless ``dry_run``, replace each damaged segment and each wrong index as the
    module doc says. Every partition is planned before anything is written, so a refusal
    (magic 0/1 data to lose at a segment's end) changes nothing."""
    state = cluster.state()
    info = state.topics.get(topic)
    if info is None:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    if partition is not None and not (isinstance(partition, int)
                                      and 0 <= partition < info["partitions"]):
        raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
    parts = range(info["partitions"]) if partition is None else [partition]
    planned = [_plan_partition(cluster, state, topic, p, dry_run)
               for p in tracked(f"checking {topic}", parts, len(parts))]
    if not dry_run:
        cluster.check_writable(state)
        for _, work in tracked(f"repairing {topic}", planned):
            _apply(work)
    return [result for result, _ in planned]
