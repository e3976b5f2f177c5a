"""PartitionState's committed ranges and its copy-on-write clone: ``add_committed`` keeps the
ranges sorted and merged exactly as a brute-force model says, in any order of writes, and a
clone taken at any point shares the ranges but never sees the other side's changes."""
from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kafkalog.cluster.partition_state import PartitionState


def model(writes):
    """Brute force: per offset its epoch, then maximal runs of consecutive offsets with one
    epoch (``add_committed``'s merge rule: touching and of the same epoch)."""
    epoch_at = {}
    for start, end, epoch in writes:
        for o in range(start, end):
            epoch_at[o] = epoch
    out = []
    for o in sorted(epoch_at):
        if out and out[-1][1] == o and out[-1][2] == epoch_at[o]:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1, epoch_at[o]])
    return out


@st.composite
def disjoint_writes(draw):
    """Disjoint ranges over a few consecutive blocks, committed in a drawn order (mostly
    ascending, as writes are), each with a drawn epoch."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=12))
    gaps = draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
    epochs = draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
    writes, at = [], 0
    for size, gap, epoch in zip(sizes, gaps, epochs):
        at += gap
        writes.append((at, at + size, epoch))
        at += size
    if draw(st.booleans()):
        writes = draw(st.permutations(writes))
    return writes


@settings(max_examples=300, deadline=None)
@given(disjoint_writes(), st.integers(0, 12))
def test_committed_ranges_match_the_model_and_a_clone_never_moves(writes, clone_at):
    ps = PartitionState()
    frozen = None
    for i, (start, end, epoch) in enumerate(writes):
        if i == clone_at:
            frozen = (ps.clone(), copy.deepcopy(ps.committed))
        ps.add_committed(start, end, epoch)
        assert ps.committed == model(writes[:i + 1])
    if frozen is not None:
        clone, before = frozen
        assert clone.committed == before          # the writes after the clone did not reach it
        clone.add_committed(10_000, 10_001, 9)    # nor does a write to the clone reach ps
        assert ps.committed == model(writes)


def test_a_clone_shares_ranges_and_an_append_that_merges_replaces_the_shared_one():
    ps = PartitionState(committed=[[0, 5, 1]])
    clone = ps.clone()
    assert clone.committed[0] is ps.committed[0]   # shared, not copied
    clone.add_committed(5, 9, 1)                   # merges with the shared range
    assert clone.committed == [[0, 9, 1]] and ps.committed == [[0, 5, 1]]
    clone.open["t"] = [9, 12, 1]
    assert ps.open == {}


@settings(max_examples=300, deadline=None)
@given(disjoint_writes(), st.lists(st.tuples(st.integers(0, 40), st.integers(1, 4)), max_size=4),
       st.integers(0, 10), st.integers(0, 60))
def test_lookups_match_brute_force(writes, aborts, log_start, next_offset):
    """is_committed, is_visible, segment_visible and is_aborted against the offsets they cover
    (the lookups bisect on each range's start)."""
    ps = PartitionState(next_offset=next_offset, log_start_offset=log_start)
    for w in sorted(writes):
        ps.add_committed(*w)
    for start, n in aborts:
        ps.add_aborted(start, start + n)
    committed = {o for s, e, _ in ps.committed for o in range(s, e)}
    aborted = {o for s, e in ps.aborted for o in range(s, e)}
    for o in range(-2, 70):
        assert ps.is_committed(o) == (o in committed)
        assert ps.is_aborted(o) == (o in aborted)
        assert ps.is_visible(o) == (o in committed and log_start <= o < ps.high_watermark)
        assert ps.segment_visible(o) == (o in committed and o < ps.high_watermark)
