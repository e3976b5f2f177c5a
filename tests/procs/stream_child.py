"""Child processes for tests/system/test_stream_exactly_once.py.

    python stream_child.py producer ROOT NAME STOP       produce "NAME-i" records to topic "in"
                                                          until STOP exists; print one line per
                                                          acknowledged record
    python stream_child.py driver ROOT CKPT [OPTS]       a streaming query in -> out (values
                                                          upper-cased) from checkpoint CKPT, at
                                                          processingTime 0, until killed; OPTS
                                                          is JSON of extra source options.

The driver prints "started" once its query runs and "batch N" after each batch; the parent kills
it with SIGKILL at random points and starts it again.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time


def producer(root: str, name: str, stop: str) -> None:
    from pyspark_kafkalog.admin import Admin
    admin = Admin(root)
    i = 0
    while not os.path.exists(stop):
        n = random.randint(1, 5)
        recs = [(f"{name}-{j}".encode(), f"{name}-{j}".encode()) for j in range(i, i + n)]
        admin.produce("in", recs)
        for k, _ in recs:
            print(k.decode(), flush=True)
        i += n
        # a few records every 0.1 s: every batch and every kill still falls among writes, and
        # the two producers leave the cores to the drivers' JVMs (at 0.025 s a driver took
        # 50 s instead of 33 s to its first batch)
        time.sleep(random.uniform(0, 0.2))


def driver(root: str, ckpt: str, opts: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    import pyspark_kafkalog
    spark = (SparkSession.builder.master("local[2]").appName("stream-child")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pyspark_kafkalog.register(spark)
    reader = (spark.readStream.format("kafkalog").option("subscribe", "in")
              .option("startingOffsets", "earliest").option("kafka.group.id", "etl"))
    for k, v in json.loads(opts or "{}").items():
        reader = reader.option(k, str(v))
    src = reader.load(root)
    out = src.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
    writer = (out.writeStream.format("kafkalog").option("topic", "out")
              .option("checkpointLocation", ckpt))
    q = writer.trigger(processingTime="0 seconds").start(root)
    print("started", flush=True)
    seen = -1
    while q.isActive:
        p = q.lastProgress
        if p and p["batchId"] != seen:
            seen = p["batchId"]
            print(f"batch {seen}", flush=True)
        time.sleep(0.1)
    q.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "producer":
        producer(*sys.argv[2:5])
    else:
        driver(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
