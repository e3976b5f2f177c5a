"""Child process for crash tests: appends deterministic batches forever, acking each on stdout.

    python appender.py ROOT SEED START_BATCH

Batch ``i`` holds records derived from ``i`` only, so the parent can check every acked offset.
"""
import random
import sys

from pyspark_kafkalog.format.encode import encode_records
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

CONFIG = LogConfig.from_properties({"segment.bytes": 40_000, "index.interval.bytes": 700})


def batch_records(i: int):
    rng = random.Random(i)
    return [Record(b"k%d-%d" % (i, j), rng.randbytes(rng.randrange(0, 400)), 1_000_000 + i * 10 + j)
            for j in range(1 + i % 5)]


def batch(i: int):
    magic = (0, 1, 2, 2)[i % 4]
    return encode_records(batch_records(i), magic=magic, compression=(i // 4) % 4)


def main():
    root, start = sys.argv[1], int(sys.argv[2])
    log = PartitionLog(open_storage(root), "crash-0", CONFIG)
    i = start
    while True:
        r = log.append([batch(i)], leader_epoch=1)
        print(f"{i} {r.first_offset} {r.last_offset}", flush=True)
        i += 1


if __name__ == "__main__":
    main()
