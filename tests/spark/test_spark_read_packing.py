"""Issue #18: the batch reader packs the ranges of many Kafka partitions into few Spark tasks, as
Spark's file sources pack small files (cluster/read_plan.pack), and minPartitions /
maxRecordsPerPartition keep their meaning from Spark's Kafka source."""
import os

import pytest

from pyspark_kafkalog.connector.read_plan import ReadTask, pack, range_bytes
from pyspark_kafkalog.connector.sources import PartitionHandle

MB = 1 << 20


pytestmark = pytest.mark.slow   # many-partition Spark reads (~4 s)


def task(partition, start, end, nbytes, topic="t"):
    handle = PartitionHandle("cluster", "mem://x", {}, topic, partition, f"{topic}-{partition}",
                             0, end)
    return ReadTask(handle, start, end, [], nbytes)


def covered(splits):
    """Every offset the splits read, as (topic, partition, offset)."""
    return sorted((r.topic, r.partition, o) for s in splits for r in s.ranges
                  for o in range(r.start, r.end))


def all_offsets(tasks):
    return sorted((t.topic, t.partition, o) for t in tasks for o in range(t.start, t.end))


# -- planning, without Spark --------------------------------------------------------------------

def test_many_small_ranges_share_a_task_charged_their_open_cost():
    tasks = [task(p, 0, 100, 10_000) for p in range(1000)]
    splits = pack(tasks, 128 * MB, 4 * MB)
    # Spark's rule: a range joins while the task's charge so far plus its bytes stays within
    # the budget; 31 * (4 MB + 10 KB) + 10 KB fits, 32 * (4 MB + 10 KB) + 10 KB does not
    assert [len(s.ranges) for s in splits] == [32] * 31 + [8]
    assert covered(splits) == all_offsets(tasks)
    assert len(pack(tasks, 128 * MB, 0)) == 1
    # an open cost of the whole budget: one range per task, as before packing
    assert len(pack(tasks, 128 * MB, 128 * MB)) == 1000


def test_the_default_open_cost_packs_a_thousand_small_partitions_onto_the_cores():
    """kafkalog's own default (64KB, measured: docs/performance.md) rather than Spark's 4MB:
    1,000 partitions of 100KB on two cores make two or three tasks, not 32."""
    from pyspark_kafkalog.connector.read_plan import DEFAULT_OPEN_COST_IN_BYTES
    from pyspark_kafkalog.spark.read_options import ReadOptions
    assert DEFAULT_OPEN_COST_IN_BYTES == 64 << 10
    assert ReadOptions.parse({"path": "/x", "subscribe": "t"}).open_cost_in_bytes == 64 << 10
    # a session that sets spark.sql.files.openCostInBytes still decides, and the option over it
    assert ReadOptions.parse({"path": "/x", "subscribe": "t"},
                             session={"openCostInBytes": "4m"}).open_cost_in_bytes == 4 * MB
    assert ReadOptions.parse({"path": "/x", "subscribe": "t", "openCostInBytes": "1k"},
                             session={"openCostInBytes": "4m"}).open_cost_in_bytes == 1024
    tasks = [task(p, 0, 1000, 100_000) for p in range(1000)]
    splits = pack(tasks, min_partition_num=2)
    assert len(splits) in (2, 3) and covered(splits) == all_offsets(tasks)
    assert len(pack(tasks, 128 * MB, 4 * MB, min_partition_num=2)) == 32


def test_ranges_inside_a_task_come_partition_by_partition_in_offset_order():
    tasks = [task(p, 0, 10 * (p + 1), 1000 * (p + 1), topic) for topic in ("b", "a")
             for p in range(5)]
    for split in pack(tasks, 128 * MB, 0) + pack(tasks, 20_000, 1000):
        keys = [(r.topic, r.partition, r.start) for r in split.ranges]
        assert keys == sorted(keys)


def test_a_range_above_the_budget_is_split_by_offsets():
    splits = pack([task(0, 1000, 4000, 300 * MB)], 128 * MB, 4 * MB)
    assert [(r.start, r.end) for s in splits for r in s.ranges] == \
        [(1000, 2000), (2000, 3000), (3000, 4000)]
    assert all(r.bytes == 100 * MB for s in splits for r in s.ranges)


def test_min_partitions_and_session_parallelism_spread_the_bytes():
    tasks = [task(p, 0, 100, MB) for p in range(10)]
    assert len(pack(tasks, 128 * MB, 0)) == 1
    # Spark's file sources: total / default parallelism caps the budget
    two = pack(tasks, 128 * MB, 0, min_partition_num=2)
    assert [len(s.ranges) for s in two] == [5, 5]
    for n in range(1, 11):
        splits = pack(tasks, 128 * MB, 4 * MB, min_partitions=n)
        assert len(splits) >= n
        assert covered(splits) == all_offsets(tasks)
    # even when the sizes are skewed
    skewed = [task(0, 0, 1000, 100 * MB)] + [task(p, 0, 10, 1000) for p in range(1, 8)]
    assert len(pack(skewed, 128 * MB, 4 * MB, min_partitions=8)) >= 8


def test_max_records_per_partition_caps_each_task():
    tasks = [task(p, 0, 7, 100) for p in range(20)]
    splits = pack(tasks, 128 * MB, 0, max_records=25)
    assert all(s.records <= 25 for s in splits)
    assert [s.records for s in splits].count(21) == 6   # three ranges of 7 fit, a fourth not
    assert covered(splits) == all_offsets(tasks)
    assert pack([], 128 * MB, 4 * MB) == []


class _Seg:
    def __init__(self, base, size):
        self.base_offset, self._size = base, size

    def size(self):
        return self._size


class _Log:
    def __init__(self, segments):
        self.segments = segments


def test_range_bytes_are_estimated_from_segment_sizes():
    log = _Log([_Seg(0, 1000), _Seg(100, 2000), _Seg(300, 500)])
    # offsets 0..99, 100..299, 300..(high watermark 400)
    assert range_bytes(log, 0, 400, 400) == 3500                    # whole segments: exact
    assert range_bytes(log, 50, 200, 400) == 500 + 1000              # halves of two
    assert range_bytes(log, 350, 360, 400) == 50
    assert range_bytes(_Log([]), 0, 10, 10) == 0


# -- a real SparkSession ----------------------------------------------------------------------

PARTITIONS, PER = 12, 30


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.client.producer import Producer
    from pyspark_kafkalog.format.records import Record
    root = tmp_path_factory.mktemp("packing")
    admin = Admin(str(root))
    admin.create_topic("many", PARTITIONS)
    prod = Producer(admin.cluster)
    prod.send({("many", p): prod.encode("many", [Record(b"k%d-%d" % (p, i), b"v" * (i + 1),
                                                        1_700_000_000_000 + i)
                                                 for i in range(PER + p)], batch_records=7)
               for p in range(PARTITIONS)})
    return str(root)


def load(spark, root, **options):
    reader = spark.read.format("kafkalog").option("subscribe", "many")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(root)


def tasks_rows(df):
    """[(spark partition id, [(partition, offset) in the order the task returned them])]."""
    from pyspark.sql import functions as F
    got = (df.select(F.spark_partition_id().alias("sp"),
                     F.monotonically_increasing_id().alias("i"), "partition", "offset")
           .collect())
    out = {}
    for r in sorted(got, key=lambda r: r.i):
        out.setdefault(r.sp, []).append((r.partition, r.offset))
    return out


def test_spark_packs_partitions_into_few_tasks_with_the_same_rows(ks, many):
    total = sum(PER + p for p in range(PARTITIONS))
    packed = load(ks, many)
    # local[2]: the default parallelism spreads the bytes over two tasks
    assert packed.rdd.getNumPartitions() == 2
    one_each = load(ks, many, openCostInBytes="128MB")
    assert one_each.rdd.getNumPartitions() == PARTITIONS
    cols = ["topic", "partition", "offset", "timestamp", "timestampType", "key", "value"]
    want = sorted(tuple(r) for r in one_each.select(*cols).collect())
    assert len(want) == total
    assert sorted(tuple(r) for r in packed.select(*cols).collect()) == want
    assert packed.schema == one_each.schema
    by_task = tasks_rows(load(ks, many))
    assert len(by_task) == 2
    for rows in by_task.values():
        assert rows == sorted(rows)   # partition by partition, each in offset order
        assert len({p for p, _ in rows}) > 1


def test_spark_min_partitions_and_max_records_per_partition_still_hold(ks, many):
    total = sum(PER + p for p in range(PARTITIONS))
    df = load(ks, many, minPartitions=5)
    assert df.rdd.getNumPartitions() >= 5
    assert df.count() == total
    by_task = tasks_rows(load(ks, many, maxRecordsPerPartition=80))
    assert all(len(rows) <= 80 for rows in by_task.values())
    assert any(len({p for p, _ in rows}) > 1 for rows in by_task.values())   # still packed
    assert sum(len(rows) for rows in by_task.values()) == total
    for rows in by_task.values():
        assert rows == sorted(rows)


def test_packing_options_are_checked(ks, many):
    from pyspark.errors import PythonException, AnalysisException
    for bad in ("lots", "-1", "0"):
        with pytest.raises((PythonException, AnalysisException), match="maxPartitionBytes"):
            load(ks, many, maxPartitionBytes=bad).count()
    assert load(ks, many, maxPartitionBytes="1k", openCostInBytes="0").count() == \
        sum(PER + p for p in range(PARTITIONS))


def _planned_small_topic(root: str, topic: str, partitions: int, records: int):
    """A topic of small partitions and a batch reader's plan of it: (reader, splits)."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record
    from pyspark_kafkalog.spark.read_options import ReadOptions
    from pyspark_kafkalog.spark.reader import KafkaLogReader
    admin = Admin(root)
    admin.create_topic(topic, partitions)
    for p in range(partitions):
        admin.produce(topic, [Record(b"k", b"v%d" % i, 1_700_000_000_000)
                              for i in range(records)], partition=p)
    reader = KafkaLogReader(ReadOptions.parse({"path": root, "subscribe": topic}), None)
    return reader, reader.partitions()


def test_data_loss_inside_a_packed_task_names_the_partition_and_range(tmp_path):
    """A segment deleted after planning, in the second range of a packed task: the error names
    that partition and its offsets (Spark's reader path, without a session)."""
    from pyspark_kafkalog.errors import OffsetOutOfRangeError
    from pyspark_kafkalog.spark.read_options import ReadOptions
    from pyspark_kafkalog.spark.reader import KafkaLogInputPartition, KafkaLogReader
    root = str(tmp_path / "c")
    reader, splits = _planned_small_topic(root, "lost", 3, 5)
    assert len(splits) == 1 and len(splits[0].value.ranges) == 3
    victim = splits[0].value.ranges[1]
    log_dir = os.path.join(root, victim.handle.dir)
    for name in os.listdir(log_dir):
        if name.endswith(".log"):
            os.remove(os.path.join(log_dir, name))
    rows = []
    with pytest.raises(OffsetOutOfRangeError,
                       match=rf"lost-{victim.partition}: offset 0 was deleted .*\(the planned "
                             rf"range: lost-{victim.partition} offsets 0 to 4"):
        for batch in reader.read(KafkaLogInputPartition(splits[0].value)):
            rows += batch.column("partition").to_pylist()
    lenient = KafkaLogReader(ReadOptions.parse({"path": root, "subscribe": "lost",
                                                "failOnDataLoss": "false"}), None)
    got = [p for b in lenient.read(KafkaLogInputPartition(splits[0].value))
           for p in b.column("partition").to_pylist()]
    assert sorted(set(got)) == sorted({0, 1, 2} - {victim.partition}) and len(got) == 10


def test_a_packed_task_opens_its_partitions_from_the_planners_listing(tmp_path, monkeypatch):
    """The planner listed every partition's segments: the task reads from that listing (no
    listing of its own) and, the segments being mapped, reads no offset index to bound its
    chunks; the rows are the same."""
    from pyspark_kafkalog.spark.reader import KafkaLogInputPartition
    from pyspark_kafkalog.storage.local import LocalStorage
    reader, splits = _planned_small_topic(str(tmp_path / "c"), "many", 20, 7)
    calls = []
    for name in ("list", "read", "read_into", "map"):
        real = getattr(LocalStorage, name)
        monkeypatch.setattr(LocalStorage, name, lambda self, path, *a, _r=real, _n=name, **k:
                            (calls.append((_n, path)), _r(self, path, *a, **k))[1])
    got = [(p, o) for s in splits for b in reader.read(KafkaLogInputPartition(s.value))
           for p, o in zip(b.column("partition").to_pylist(), b.column("offset").to_pylist())]
    assert sorted(got) == [(p, o) for p in range(20) for o in range(7)]
    assert not [c for c in calls if c[0] == "list"]
    assert not [c for c in calls if c[1].endswith((".index", ".timeindex"))]
    assert {c[0] for c in calls} == {"map"}
