"""``pyspark_kafkalog.admin``: the Python API for a kafkalog cluster, at small scale.

Names and shapes follow Kafka's ``Admin`` client where the meaning is the same
(``delete_records_before`` is KIP-107's ``deleteRecordsBefore``); results are typed, and errors
are the typed hierarchy of :mod:`pyspark_kafkalog.errors`. The client is in ``client.py``, its
result types in ``results.py``.
"""
from ..client.consumer import EARLIEST, LATEST, Consumer
from ..client.groups import OffsetAndMetadata
from ..coordinator.follow import Follower
from ..maintenance.repair import LostRange, PartitionRepair, SegmentRepair
from ..maintenance.retention import DeleteRecordsDryRun, DeleteRecordsResult, RetentionPlan
from .client import Admin
from .results import (ConsumerRecord, GroupPartitionLag, ListOffsetsResult, LogDirInfo,
                      PartitionInfo, RecordMetadata, TopicDescription, TopicPartition)

__all__ = ["Admin", "TopicPartition", "TopicDescription", "PartitionInfo", "LogDirInfo",
           "RecordMetadata",
           "ConsumerRecord", "ListOffsetsResult", "GroupPartitionLag", "DeleteRecordsResult",
           "DeleteRecordsDryRun", "RetentionPlan", "PartitionRepair", "SegmentRepair", "LostRange",
           "OffsetAndMetadata", "Consumer", "Follower", "EARLIEST", "LATEST"]
