"""The log cleaner (log/cleaner.py, log/offset_map.py) against a model of Kafka's cleaner.

The model is Kafka's rules written the plain way: a log is a list of segments, a segment a
list of batches (dicts), a batch a list of records; the offset map is a dict with Kafka's
capacity rule; a data batch is aborted iff the next control batch of its producer after it is
an ABORT; a marker may go once no data batch of its transaction is left before it. Random keyed
workloads (overwrites, tombstones, several producers, committed and aborted transactions,
magic 2 with every codec, magic 0/1 logs) are cleaned by both, several times at advancing
clocks and with tiny maps that force many rounds; the survivors must match offset for offset
(key, value, headers, timestamp) and batch for batch (offsets, delete horizon, emptiness).

``KAFKALOG_CLEANER_EXAMPLES`` sizes the slow property run.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kafkalog.format import accel
from pyspark_kafkalog.format.batch import scan_entries
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import (encode_batch_v2, encode_control_batch,
                                            encode_message_set)
from pyspark_kafkalog.format.records import CONTROL_ABORT, CONTROL_COMMIT, Record
from pyspark_kafkalog.log import cleaner as cl
from pyspark_kafkalog.log import offset_map as om

T0 = 1_700_000_000_000
KEYS = [b"k%d" % i for i in range(8)]


# -- workloads ------------------------------------------------------------------------------

@st.composite
def workloads(draw, legacy: bool = False):
    """A log as phases: each phase appends batches (as model dicts with offsets) and then
    cleans. Returns (phases, legacy magic or None)."""
    magic = draw(st.sampled_from([0, 1])) if legacy else 2
    codecs = [0, 1, 2, 3] + ([] if legacy else [4])
    nprod = 0 if legacy else draw(st.integers(0, 3))
    open_txn = {}
    offset = 0
    ts = T0 - 10_000
    phases = []
    for _ in range(draw(st.integers(1, 3))):
        batches = []
        for _ in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["plain", "plain", "txn", "end"])) if nprod else "plain"
            pid = 1000 + draw(st.integers(0, nprod - 1)) if nprod else -1
            if kind == "end":
                if pid not in open_txn:
                    kind = "txn"
                else:
                    ctype = draw(st.sampled_from([CONTROL_ABORT, CONTROL_COMMIT]))
                    ts += 1
                    batches.append(dict(base=offset, last=offset, control=ctype, txn=True,
                                        pid=pid, epoch=0, codec=0, horizon=None, magic=2,
                                        records=[dict(offset=offset, key=None, value=None,
                                                      ts=ts, headers=())]))
                    offset += 1
                    del open_txn[pid]
                    continue
            txn = kind == "txn"
            if not txn and pid >= 0 and pid in open_txn:
                pid = -1 if draw(st.booleans()) else pid
                txn = pid in open_txn
            if txn:
                open_txn[pid] = True
            n = draw(st.integers(1, 5))
            recs = []
            for i in range(n):
                ts += draw(st.integers(0, 3))
                key = draw(st.sampled_from(KEYS))
                value = None if draw(st.integers(0, 4)) == 0 else draw(st.binary(max_size=6))
                headers = (() if legacy or draw(st.integers(0, 3)) else
                           (("h", draw(st.one_of(st.none(), st.binary(max_size=3)))),))
                recs.append(dict(offset=offset + i, key=key, value=value, ts=ts,
                                 headers=headers))
            codec = draw(st.sampled_from(codecs))
            if legacy and not codec:
                for r in recs:     # uncompressed magic 0/1: one entry per message
                    batches.append(dict(base=r["offset"], last=r["offset"], control=None,
                                        txn=False, pid=-1, epoch=-1, codec=0, horizon=None,
                                        magic=magic, records=[r]))
            else:
                batches.append(dict(base=offset, last=offset + n - 1, control=None, txn=txn,
                                    pid=pid, epoch=0 if pid >= 0 else -1, codec=codec,
                                    horizon=None, magic=magic, records=recs))
            offset += n
        if not draw(st.booleans()) or len(phases) == 2:
            for pid in sorted(open_txn):     # close what is open (the LSO is never cleaned)
                ctype = draw(st.sampled_from([CONTROL_ABORT, CONTROL_COMMIT]))
                ts += 1
                batches.append(dict(base=offset, last=offset, control=ctype, txn=True, pid=pid,
                                    epoch=0, codec=0, horizon=None, magic=2,
                                    records=[dict(offset=offset, key=None, value=None, ts=ts,
                                                  headers=())]))
                offset += 1
            open_txn.clear()
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(batches) - 1)), max_size=3)))
        phases.append((batches, cuts))
    return phases, magic


def encode(b: dict) -> bytes:
    if b["control"] is not None:
        return encode_control_batch(b["control"], producer_id=b["pid"], producer_epoch=0,
                                    timestamp=b["records"][0]["ts"],
                                    base_offset=b["base"]).data
    recs = [Record(r["key"], r["value"], r["ts"] if b["magic"] else -1, r["headers"])
            for r in b["records"]]
    if b["magic"] < 2:
        return encode_message_set(recs, magic=b["magic"], base_offset=b["base"],
                                  compression=b["codec"]).data
    return encode_batch_v2(recs, base_offset=b["base"], compression=b["codec"],
                           producer_id=b["pid"], producer_epoch=b["epoch"],
                           base_sequence=0 if b["pid"] >= 0 else -1,
                           transactional=b["txn"]).data


# -- the model ------------------------------------------------------------------------------

def model_aborted(batches):
    """AbortedTxn of every aborted transaction: (pid, first data offset, marker offset)."""
    out, first = [], {}
    for b in batches:
        if b["control"] is None and b["txn"]:
            first.setdefault(b["pid"], b["base"])
        elif b["control"] is not None:
            f = first.pop(b["pid"], None)
            if b["control"] == CONTROL_ABORT and f is not None:
                out.append((b["pid"], f, b["base"]))
    return out


def model_clean(segments, aborted_txns, dirty, uncleanable, capacity, now, retention,
                last_records):
    """One pass of Kafka's cleaner over model segments; returns (segments, end)."""
    flat = [b for seg in segments for b in seg]

    def aborted(b):       # the next control batch of its producer is an ABORT
        if b["control"] is not None or not b["txn"]:
            return False
        later = [c for c in flat if c["pid"] == b["pid"] and c["control"] is not None
                 and c["base"] > b["last"]]
        if later:
            return later[0]["control"] == CONTROL_ABORT
        return any(p == b["pid"] and f <= b["last"] <= l for p, f, l in aborted_txns)

    # the map: keys of the dirty range, up to `capacity` distinct keys
    keymap, end, latest, full = {}, uncleanable, -1, False
    for b in flat:
        if b["last"] < dirty or b["base"] >= uncleanable:
            continue
        if b["control"] is None and not aborted(b):
            for r in b["records"]:
                if r["key"] is None or r["offset"] < dirty:
                    continue
                if r["key"] not in keymap and len(keymap) >= capacity:
                    full = True
                    break
                keymap[r["key"]] = r["offset"]
                latest = r["offset"]
        if full:
            end = latest + 1
            break
        latest = max(latest, b["last"])
    # the segments below the end, cleaned
    ncl = 0               # (a segment cleaned empty keeps its place, its base below the end)
    while ncl < len(segments) and not (segments[ncl] and segments[ncl][0]["base"] >= end):
        ncl += 1
    clean_batches = [b for seg in segments[:ncl] for b in seg]
    legacy_retain = dirty == 0 or retention > 0    # every segment has the same mtime
    out = []
    for i, b in enumerate(clean_batches):
        if b["control"] is not None:
            data_left = False
            for c in reversed(clean_batches[:i]):
                if c["pid"] == b["pid"] and c["control"] is not None:
                    break
                if c["pid"] == b["pid"] and c["txn"]:
                    data_left = True
            if b["records"]:
                can_discard = not data_left
            else:
                can_discard = True
            discard = can_discard and b["horizon"] is not None and b["horizon"] <= now
        else:
            can_discard = discard = aborted(b)
        lr = last_records.get(b["pid"]) if b["pid"] >= 0 else None
        last_of_producer = lr is not None and (
            b["last"] == lr[0] if lr[0] is not None else
            (b["control"] is not None and lr[1] == b["epoch"]))
        if discard:
            kept = []
        elif b["control"] is not None:
            kept = list(b["records"])
        else:
            if b["magic"] == 2:
                retain_deletes = b["horizon"] is None or now < b["horizon"]
            else:
                retain_deletes = legacy_retain
            kept = [r for r in b["records"] if r["offset"] >= end or (
                r["key"] is not None and keymap.get(r["key"], -1) <= r["offset"]
                and (r["value"] is not None or retain_deletes))]
        if kept:
            nb = dict(b, records=kept)
            if b["magic"] < 2:
                nb["base"], nb["last"] = kept[0]["offset"], kept[-1]["offset"]
            tomb = any(r["value"] is None for r in kept) and b["control"] is None
            if b["magic"] == 2 and b["horizon"] is None and (
                    tomb or (can_discard and b["control"] is not None)):
                nb["horizon"] = now + retention
            out.append(nb)
        elif last_of_producer:
            out.append(dict(b, records=[], codec=0, horizon=None))
    return [out] + segments[ncl:], end


def model_last_records(batches):
    state = {}
    for b in batches:
        if b["pid"] < 0:
            continue
        prev = state.get(b["pid"], (None, 0))
        state[b["pid"]] = (b["last"] if b["control"] is None else prev[0], b["epoch"])
    return state


# -- running both ---------------------------------------------------------------------------

def segments_of(batches, cuts, mtime):
    bounds = [0] + list(cuts) + [len(batches)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        if a < b:
            out.append(batches[a:b])
    return out


def survivors_from_bytes(segments):
    recs, batches = [], []
    for seg in segments:
        data = seg.data
        for h in scan_entries(data, validate_crc=True, strict=True):
            batches.append((h.last_offset, h.record_count if h.magic == 2 else None,
                            h.base_timestamp if h.has_delete_horizon else None))
        for r in decode_records(data):
            if r.is_control:
                continue
            recs.append((r.offset, r.key, r.value, r.headers, r.timestamp))
    return recs, batches


def survivors_from_model(segments):
    recs, batches = [], []
    for seg in segments:
        for b in seg:
            batches.append((b["last"], len(b["records"]) if b["magic"] == 2 else None,
                            b["horizon"]))
            if b["control"] is not None:
                continue
            for r in b["records"]:
                recs.append((r["offset"], r["key"], r["value"], tuple(r["headers"]),
                             r["ts"] if b["magic"] else -1))
    return recs, batches


def run_both(phases, memory, retention, segment_bytes=1 << 30):
    """Append each phase, then clean (at advancing clocks); compare after every clean."""
    real: list = []        # SourceSegment
    model: list = []       # lists of batch dicts
    all_batches: list = []
    dirty = 0
    now = T0
    omap = om.OffsetMap(memory)
    aborted: list = []     # the log's .txnindex, as the cleaner leaves it
    for batches, cuts in phases:
        new_markers = {b["base"] for b in batches if b["control"] is not None}
        all_batches += batches
        aborted += [t for t in model_aborted(all_batches) if t[2] in new_markers]
        segs = segments_of(batches, cuts, T0)
        for seg in segs:
            real.append(cl.SourceSegment(seg[0]["base"], b"".join(encode(b) for b in seg), T0))
            model.append([dict(b) for b in seg])
        last_records = model_last_records(all_batches)
        # the last segment is the active one
        uncleanable = real[-1].base_offset
        for clean_now in (now, now + retention + 1, now + 2 * retention + 2):
            result = cl.clean_log(real, first_dirty_offset=dirty,
                                  first_uncleanable_offset=uncleanable, offset_map=omap,
                                  now_ms=clean_now, delete_retention_ms=retention,
                                  aborted=aborted, segment_bytes=segment_bytes)
            real = result.segments
            model_txns = aborted
            aborted = result.aborted_txns
            d = dirty
            while d < uncleanable:
                model, end = model_clean(model, model_txns, d, uncleanable, omap.max_entries,
                                         clean_now, retention, last_records)
                d = end
            assert survivors_from_bytes(real) == survivors_from_model(model)
            # the next clean finds nothing dirty: clean everything again from the start,
            # as a cleaner that lost its checkpoint does (the same rules apply)
            dirty = 0
        dirty = uncleanable
        now += 3 * retention + 10
    return real


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=40, **SETTINGS)
@given(workloads(), st.sampled_from([24 * 3, 24 * 5, 24 * 1000]),
       st.sampled_from([0, 100]))
def test_magic2_matches_the_model(workload, memory, retention):
    phases, _ = workload
    run_both(phases, memory, retention)


@settings(max_examples=25, **SETTINGS)
@given(workloads(legacy=True), st.sampled_from([24 * 3, 24 * 1000]), st.sampled_from([0, 100]))
def test_legacy_matches_the_model(workload, memory, retention):
    phases, _ = workload
    run_both(phases, memory, retention)


@settings(max_examples=15, **SETTINGS)
@given(workloads(), st.sampled_from([24 * 3, 24 * 1000]))
def test_groups_of_small_segments(workload, memory):
    phases, _ = workload
    run_both(phases, memory, 100, segment_bytes=300)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("KAFKALOG_CLEANER_EXAMPLES", "200")), **SETTINGS)
@given(st.booleans().flatmap(workloads), st.sampled_from([24 * 3, 24 * 5, 24 * 7, 24 * 1000]),
       st.sampled_from([0, 1, 100]))
def test_long_run_matches_the_model(workload, memory, retention):
    phases, _ = workload
    run_both(phases, memory, retention)


# -- C and Python twins ---------------------------------------------------------------------

@pytest.fixture
def pure_python(monkeypatch):
    monkeypatch.setattr(om, "_key_digests", None)
    monkeypatch.setattr(om, "_map_put", None)
    monkeypatch.setattr(om, "_map_get", None)
    monkeypatch.setattr(cl, "_filter_v2", None)


needs_c = pytest.mark.skipif(accel.ENCODE is None, reason="_encode_accel is not built")


def test_murmur3_known_values():
    # mmh3.hash128(b"hello") == 0x5b1e906a48ae1d19cbd8a7b341bd9b02 (h2 << 64 | h1)
    assert om.murmur3_128(b"hello") == (0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19)
    assert om.murmur3_128(b"") == (0, 0)


@needs_c
@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30))
def test_c_and_python_digests_agree(keys):
    got = om.digests_of(keys)
    want = np.array([om.murmur3_128(k) for k in keys], dtype=np.uint64).reshape(-1, 2)
    assert (got == want).all()


def _map_results(memory, load, runs, probes):
    m = om.OffsetMap(memory, load)
    out = []
    for keys, first in runs:
        d = om.digests_of(keys)
        offs = np.arange(first, first + len(keys), dtype=np.int64)
        out.append((m.put_many(d, offs), m.size, m.latest_offset))
    out.append(m.get_many(om.digests_of(probes)).tolist())
    assert m.nbytes <= memory
    return out


@needs_c
@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60), st.sampled_from([0.5, 0.9, 1.0]),
       st.lists(st.lists(st.sampled_from([b"k%d" % i for i in range(40)]), max_size=30),
                max_size=4))
def test_c_and_numpy_maps_agree(slots, load, key_runs):
    runs, first = [], 0
    for keys in key_runs:
        runs.append((keys, first))
        first += len(keys) + 3
    probes = [b"k%d" % i for i in range(45)]
    want = _map_results(24 * slots, load, runs, probes)
    saved = om._map_put, om._map_get
    om._map_put = om._map_get = None
    try:
        assert _map_results(24 * slots, load, runs, probes) == want
    finally:
        om._map_put, om._map_get = saved


def test_the_map_holds_the_latest_offset_and_refuses_new_keys_when_full():
    m = om.OffsetMap(24 * 11, 0.9)           # 11 slots (prime), 9 keys
    assert (m.slots, m.max_entries, m.nbytes) == (11, 9, 264)
    keys = [b"a", b"b", b"a"] + [b"x%d" % i for i in range(10)]
    d = om.digests_of(keys)
    done = m.put_many(d, np.arange(len(keys)))
    # a, b + 7 new keys fit; the 8th new key (x7, record 10) does not
    assert done == 10 and m.size == 9 and m.latest_offset == 9
    assert m.get_many(om.digests_of([b"a", b"b", b"x6", b"x7", b"zz"])).tolist() == \
        [2, 1, 9, -1, -1]
    # known keys still update when full
    assert m.put_many(om.digests_of([b"a"]), np.array([50])) == 1
    assert m.get_many(om.digests_of([b"a"])).tolist() == [50]


@needs_c
@settings(max_examples=20, **SETTINGS)
@given(workloads(), st.sampled_from([24 * 3, 24 * 1000]))
def test_c_and_python_cleaners_write_the_same_bytes(workload, memory):
    phases, _ = workload
    want = [s.data for s in run_both(phases, memory, 100)]
    saved = om._key_digests, om._map_put, om._map_get, cl._filter_v2
    om._key_digests = om._map_put = om._map_get = cl._filter_v2 = None
    try:
        assert [s.data for s in run_both(phases, memory, 100)] == want
    finally:
        om._key_digests, om._map_put, om._map_get, cl._filter_v2 = saved


# -- what is preserved ----------------------------------------------------------------------

def _headers(data):
    return {h.base_offset if h.magic == 2 else h.last_offset: (h, data[h.position:h.end])
            for h in scan_entries(data, validate_crc=True, strict=True)}


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_batches_keep_their_fields_and_untouched_ones_their_bytes(codec):
    b0 = encode_batch_v2([Record(b"a", b"1", T0), Record(b"b", b"1", T0 + 1, [("h", b"v")]),
                          Record(b"c", b"1", T0 + 2)], base_offset=0, compression=codec,
                         producer_id=7, producer_epoch=3, base_sequence=10,
                         partition_leader_epoch=5).data
    b1 = encode_batch_v2([Record(b"x", b"1", T0 + 5)], base_offset=3, compression=codec,
                         partition_leader_epoch=5).data
    b2 = encode_batch_v2([Record(b"a", b"2", T0 + 6), Record(b"b", None, T0 + 7)],
                         base_offset=4, compression=codec, producer_id=7, producer_epoch=3,
                         base_sequence=13, partition_leader_epoch=6).data
    b3 = encode_batch_v2([Record(b"a", b"3", T0 + 9)], base_offset=6, compression=codec,
                         producer_id=7, producer_epoch=3, base_sequence=15).data
    segs = [cl.SourceSegment(0, b0 + b1 + b2, T0), cl.SourceSegment(6, b3, T0)]
    res = cl.clean_log(segs, first_dirty_offset=0, first_uncleanable_offset=6,
                       offset_map=om.OffsetMap(1 << 16), now_ms=T0 + 100,
                       delete_retention_ms=1000,
                       last_records={7: cl.LastRecord(6, 3)})
    out = _headers(res.segments[0].data)
    before = _headers(b0 + b1 + b2)
    assert out[3][1] == before[3][1]                 # untouched: byte for byte
    for base in (0, 4):                              # re-encoded
        h, old = out[base][0], before[base][0]
        for f in ("magic", "last_offset", "partition_leader_epoch", "producer_id",
                  "producer_epoch", "base_sequence", "compression", "timestamp_type"):
            assert getattr(h, f) == getattr(old, f), f
    assert out[0][0].record_count == 1 and not out[0][0].has_delete_horizon
    assert out[4][0].has_delete_horizon and out[4][0].base_timestamp == T0 + 100 + 1000
    recs = [(r.offset, r.key, r.value, r.timestamp, r.headers)
            for r in decode_records(res.segments[0].data)]
    assert recs == [(2, b"c", b"1", T0 + 2, ()), (3, b"x", b"1", T0 + 5, ()),
                    (4, b"a", b"2", T0 + 6, ()), (5, b"b", None, T0 + 7, ())]
    assert res.segments[1].data == b3                # the active segment is never cleaned


def test_the_last_batch_of_a_producer_stays_empty():
    b0 = encode_batch_v2([Record(b"a", b"1", T0)], base_offset=0, producer_id=9,
                         producer_epoch=2, base_sequence=0, compression=1).data
    b1 = encode_batch_v2([Record(b"a", b"2", T0 + 1)], base_offset=1).data
    b2 = encode_batch_v2([Record(b"z", b"1", T0 + 2)], base_offset=2).data
    res = cl.clean_log([cl.SourceSegment(0, b0 + b1, T0), cl.SourceSegment(2, b2, T0)],
                       first_dirty_offset=0, first_uncleanable_offset=2,
                       offset_map=om.OffsetMap(1 << 12), now_ms=T0)
    out = list(scan_entries(res.segments[0].data, validate_crc=True, strict=True))
    assert [(h.base_offset, h.last_offset, h.record_count, h.producer_id, h.producer_epoch,
             h.base_sequence, h.compression) for h in out] == [(0, 0, 0, 9, 2, 0, 0),
                                                                (1, 1, 1, -1, -1, -1, 0)]


def test_offset_map_stays_within_its_budget():
    for memory in (24 * 2, 100, 24 * 1000 + 7, 1 << 20):
        m = om.OffsetMap(memory)
        assert m.nbytes <= memory and m.slots * 24 == m.nbytes
    with pytest.raises(ValueError):
        om.OffsetMap(24)
