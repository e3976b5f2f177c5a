"""A process that creates topics on cue, for tests/cluster/test_topic_create_race.py.

    python create_child.py ROOT PARTITIONS

Per line ``TOPIC GO`` read from stdin: opens the cluster afresh (as a new process would),
replays it, prints ``ready``, waits until the file GO exists, creates TOPIC and prints
{"won": topic_id} or {"lost": error type}; any other outcome is printed with its traceback.
One process serves every round: a Python start per round was most of the test's time.
"""
import json
import os
import sys
import time
import traceback

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import TopicAlreadyExistsError

root, partitions = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    topic, go = line.split()
    admin = Admin(root, create=False)
    admin.cluster.state()                     # warm: both sides start from the same replay
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        desc = admin.create_topic(topic, partitions)
        out = {"won": desc.topic_id}
    except TopicAlreadyExistsError as exc:
        out = {"lost": type(exc).__name__}
    except BaseException:
        out = {"error": traceback.format_exc()}
    print(json.dumps(out), flush=True)
