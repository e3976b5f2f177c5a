"""A process that creates one topic as soon as GO exists, for tests/test_topic_create_race.py.

    python create_child.py ROOT TOPIC PARTITIONS GO

Prints {"won": topic_id} or {"lost": error type}; any other outcome is printed with its traceback.
"""
import json
import os
import sys
import time
import traceback

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import TopicAlreadyExistsError

root, topic, partitions, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
admin = Admin(root, create=False)
admin.cluster.state()                     # warm: both sides start from the same replay
while not os.path.exists(go):
    time.sleep(0.001)
try:
    desc = admin.create_topic(topic, partitions)
    print(json.dumps({"won": desc.topic_id}))
except TopicAlreadyExistsError as exc:
    print(json.dumps({"lost": type(exc).__name__}))
except BaseException:
    print(json.dumps({"error": traceback.format_exc()}))
