"""CowMap against a plain dict: random operations on a map and its copies (hypothesis), each
copy unaffected by what the others do."""
from hypothesis import given, settings, strategies as st

from pyspark_kafkalog.cluster import cow_map
from pyspark_kafkalog.cluster.cow_map import CowMap

KEYS = st.sampled_from([f"t:{i}" for i in range(40)])
OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "copy", "switch"]), KEYS,
                         st.integers(0, 9)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(1, 8))
def test_cow_map_behaves_like_independent_dicts(ops, fold_min):
    old = cow_map.FOLD_MIN
    cow_map.FOLD_MIN = fold_min          # fold often, to test folding too
    try:
        maps, dicts, i = [CowMap({"t:0": -1})], [{"t:0": -1}], 0
        for op, key, value in ops:
            m, d = maps[i], dicts[i]
            if op == "set":
                m[key] = value
                d[key] = value
            elif op == "del" and key in d:
                del m[key]
                del d[key]
            elif op == "copy":
                maps.append(m.copy())
                dicts.append(dict(d))
            elif op == "switch":
                i = value % len(maps)
            for mm, dd in zip(maps, dicts):
                assert dict(mm.items()) == dd and len(mm) == len(dd)
                assert all((k in mm) == (k in dd) and mm.get(k) == dd.get(k) for k in dd)
    finally:
        cow_map.FOLD_MIN = old
