"""The typed error hierarchy.

Every error the product raises on purpose is a :class:`KafkaLogError`. Each subclass carries the
Kafka protocol error code (``error_code``) and name (``error_name``) of the nearest Kafka error, so
code that already speaks Kafka (retry policies, per-partition result tables, the KIP-107 response)
can map ours one to one. Where a Python built-in category also fits, the class inherits it too
(``ValueError`` for bad input, ``FileExistsError`` for a lost create race), so generic handlers work.
"""
from __future__ import annotations


class KafkaLogError(Exception):
    """Base of every error this package raises deliberately."""

    error_code = -1
    error_name = "UNKNOWN_SERVER_ERROR"
    retriable = False
    #: the CLI's exit status: a user error (bad option or input) is 2, trouble with the data or
    #: the storage (corruption, a newer cluster, a lost race, storage unavailable) is 1
    user_error = True


# -- data on storage ----------------------------------------------------------------------------

class CorruptRecordError(KafkaLogError):
    """Bytes on storage or in a buffer fail their CRC, size or structure checks."""
    user_error = False

    error_code = 2
    error_name = "CORRUPT_MESSAGE"

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message)
        #: byte position (in the buffer or segment being read) of the bad batch, when known
        self.position = position


class CorruptIndexError(CorruptRecordError):
    """An ``.index``/``.timeindex``/``.txnindex`` file is malformed or disagrees with its log.

    Indexes are derived data: the fix is always to rebuild them from the log (``kafkalog recover``).
    """


class InvalidRecordError(KafkaLogError, ValueError):
    """A record or batch handed to us to write is not valid (e.g. offsets out of order)."""

    error_code = 87
    error_name = "INVALID_RECORD"


class RecordTooLargeError(KafkaLogError, ValueError):
    error_code = 10
    error_name = "MESSAGE_TOO_LARGE"


class UnsupportedCodecError(KafkaLogError):
    """A compression codec is unknown, not valid for the message format, or its library is missing."""

    error_code = 76
    error_name = "UNSUPPORTED_COMPRESSION_TYPE"


class UnsupportedVersionError(KafkaLogError):
    """A magic byte, file version or on-storage format version we do not understand."""
    user_error = False

    error_code = 35
    error_name = "UNSUPPORTED_VERSION"


class LogSegmentOffsetOverflowError(KafkaLogError):
    """An offset does not fit a segment's 32-bit relative offsets."""
    user_error = False

    error_code = 87
    error_name = "INVALID_RECORD"


# -- requests -----------------------------------------------------------------------------------

class OffsetOutOfRangeError(KafkaLogError, ValueError):
    error_code = 1
    error_name = "OFFSET_OUT_OF_RANGE"


class MissingCommittedDataError(OffsetOutOfRangeError):
    """The metadata says an offset holds committed data, and no segment file holds it: deleted
    since the metadata was read (retention, delete-records), or lost (a machine crash before an
    unflushed write reached the device, docs/protocol.md §3; a deleted file). Still Kafka's
    OFFSET_OUT_OF_RANGE, as a broker answers a fetch past what its log holds, but trouble with
    the data, not the user's input: the CLI's exit status is 1."""
    user_error = False


class UnknownTopicOrPartitionError(KafkaLogError, LookupError):
    error_code = 3
    error_name = "UNKNOWN_TOPIC_OR_PARTITION"


class UnknownTopicIdError(UnknownTopicOrPartitionError):
    """The topic a reader was following by id is gone: deleted, or deleted and created again
    under the same name (a new id). Not the user's doing, unlike naming a topic that does not
    exist, so the CLI's exit status is 1."""
    user_error = False

    error_code = 100
    error_name = "UNKNOWN_TOPIC_ID"


class InvalidTopicError(KafkaLogError, ValueError):
    error_code = 17
    error_name = "INVALID_TOPIC_EXCEPTION"


class TopicAlreadyExistsError(KafkaLogError):
    error_code = 36
    error_name = "TOPIC_ALREADY_EXISTS"


class InvalidPartitionsError(KafkaLogError, ValueError):
    error_code = 37
    error_name = "INVALID_PARTITIONS"


class InvalidConfigError(KafkaLogError, ValueError):
    """A bad option, config value or command-line argument."""

    error_code = 40
    error_name = "INVALID_CONFIG"


class InvalidRequestError(KafkaLogError, ValueError):
    error_code = 42
    error_name = "INVALID_REQUEST"


class ClusterDirectoryError(InvalidRequestError):
    """A raw log-dir command that writes was pointed at a directory of a kafkalog cluster.

    A cluster's segment files are never modified in place (docs/protocol.md §1: readers map
    them), and only the metadata log assigns its offsets; the cluster's own commands do the job.
    """


class TopicAuthorizationFailedError(KafkaLogError, PermissionError):
    error_code = 29
    error_name = "TOPIC_AUTHORIZATION_FAILED"


class FencedLeaderEpochError(KafkaLogError):
    """A writer's leader epoch (its right to write) was taken over: it is a zombie."""
    user_error = False

    error_code = 74
    error_name = "FENCED_LEADER_EPOCH"


class InvalidReplicationFactorError(KafkaLogError, ValueError):
    error_code = 38
    error_name = "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(KafkaLogError, ValueError):
    error_code = 39
    error_name = "INVALID_REPLICA_ASSIGNMENT"


class InvalidTxnStateError(KafkaLogError):
    """A commit or abort names a transaction that is unknown or already decided otherwise."""
    user_error = False

    error_code = 48
    error_name = "INVALID_TXN_STATE"


class GroupIdNotFoundError(KafkaLogError, LookupError):
    error_code = 69
    error_name = "GROUP_ID_NOT_FOUND"


class InvalidGroupIdError(KafkaLogError, ValueError):
    error_code = 24
    error_name = "INVALID_GROUP_ID"


class FetchSessionIdNotFoundError(KafkaLogError, LookupError):
    """An incremental fetch named a session the cache no longer holds (evicted, or never made).

    The fetcher recovers with a full fetch (KIP-227), so it is retriable and not the user's doing.
    """
    user_error = False
    retriable = True

    error_code = 70
    error_name = "FETCH_SESSION_ID_NOT_FOUND"


class InvalidFetchSessionEpochError(KafkaLogError):
    """An incremental fetch's epoch is not the one its session expects: a request or response
    was lost or repeated, so the two sides' cached partition states may differ (KIP-227)."""
    user_error = False
    retriable = True

    error_code = 71
    error_name = "INVALID_FETCH_SESSION_EPOCH"


# -- the coordinator (docs/protocol.md §11) ----------------------------------------------------

class CoordinatorLeaseHeldError(KafkaLogError):
    """Another process holds the coordinator lease, and it has not expired by our clock (or it
    won the race for the epoch we asked for).

    Kafka's NOT_COORDINATOR (16), not COORDINATOR_NOT_AVAILABLE (15): Kafka answers 15 when
    there is no coordinator at all, and 16 when the one asked is not the coordinator and the
    client must find the one that is. Here there is one, and the log names it (``holder``,
    ``address``): the caller stands by or talks to it. Retriable, as in Kafka: the lease may
    lapse."""
    user_error = False
    retriable = True

    error_code = 16
    error_name = "NOT_COORDINATOR"

    def __init__(self, message: str, *, holder: str | None = None, address: str | None = None,
                 epoch: int | None = None, expires_ms: int | None = None):
        super().__init__(message)
        self.holder, self.address, self.epoch, self.expires_ms = holder, address, epoch, expires_ms


class FencedCoordinatorError(KafkaLogError):
    """A coordinator's epoch is no longer the current one (another took over, or it released
    the lease): nothing it writes takes effect, and it must stop acting at once. Kafka's
    STALE_CONTROLLER_EPOCH (11), the error a deposed controller's requests get."""
    user_error = False

    error_code = 11
    error_name = "STALE_CONTROLLER_EPOCH"

    def __init__(self, message: str, *, epoch: int | None = None,
                 current_epoch: int | None = None, holder: str | None = None):
        super().__init__(message)
        self.epoch, self.current_epoch, self.holder = epoch, current_epoch, holder


# -- storage ------------------------------------------------------------------------------------

class KafkaStorageError(KafkaLogError, OSError):
    """Storage failed or behaved outside what its backend guarantees."""
    user_error = False

    error_code = 56
    error_name = "KAFKA_STORAGE_ERROR"
    retriable = True


class AlreadyExistsError(KafkaStorageError, FileExistsError):
    """Create-if-absent lost: the object already exists (someone else won the race)."""

    retriable = False


class StorageNotFoundError(KafkaStorageError, FileNotFoundError):
    """A path that must exist does not."""
    user_error = True     # mostly a path the user named

    retriable = False


class UnsupportedOperationError(KafkaStorageError):
    """The backend cannot do this operation with the guarantee asked for."""

    retriable = False


# -- log dirs on other roots (docs/protocol.md §1.1) --------------------------------------------

class InconsistentClusterIdError(KafkaLogError):
    """A log dir's ``meta.properties`` names another cluster: it belongs to that one (Kafka's
    broker refuses such a log dir the same way)."""

    error_code = 104
    error_name = "INCONSISTENT_CLUSTER_ID"


class LogDirNotEmptyError(InvalidRequestError):
    """A URL to register as a log dir holds files, and is not a log dir of this cluster that
    was never registered: registering it would mix its files with the cluster's."""


class OfflineLogDirError(KafkaStorageError):
    """Maintenance (retention, cleanup, checkpoints) did everything it could reach and skipped
    the log dirs it could not: Kafka's broker takes a failed log dir offline and goes on with
    the others (KIP-112), rather than letting one disk stop them all. ``offline``: each
    skipped log dir's name and why; ``skipped``: the partitions skipped there; ``done``: what
    the run did, as its call returns it normally. Nothing in a skipped log dir changed; the
    next run there catches up."""

    def __init__(self, message: str, *, offline=None, skipped=(), done=None):
        super().__init__(message)
        self.offline = dict(offline or {})
        self.skipped = list(skipped)
        self.done = done


# -- replication (docs/protocol.md §1.3) ---------------------------------------------------------

class NotEnoughReplicasError(KafkaLogError):
    """An acks=all write was refused before anything was reserved: the ISR of a partition is
    smaller than its min.insync.replicas. Nothing was written."""
    user_error = False
    retriable = True

    error_code = 19
    error_name = "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(KafkaLogError):
    """An acks=all write was written but the ISR could not hold it (the ISR shrank below
    min.insync.replicas, or a member had not copied it yet); the writer aborts it, so nothing of
    it becomes visible."""
    user_error = False
    retriable = True

    error_code = 20
    error_name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class RequestTimedOutError(KafkaLogError):
    """An acks=all write waited request.timeout.ms for the ISR to hold it; it was aborted."""
    user_error = False
    retriable = True

    error_code = 7
    error_name = "REQUEST_TIMED_OUT"


class InvalidUpdateVersionError(KafkaLogError):
    """An ISR change or election was planned against a partition epoch that is not current."""
    user_error = False
    retriable = True

    error_code = 95
    error_name = "INVALID_UPDATE_VERSION"


class IneligibleReplicaError(KafkaLogError):
    """A replica may not join the ISR: it does not hold everything the ISR must hold."""
    user_error = False

    error_code = 107
    error_name = "INELIGIBLE_REPLICA"


class EligibleLeadersNotAvailableError(KafkaLogError):
    """No replica may lead: none in the ISR is online, and unclean election is off."""
    user_error = False

    error_code = 83
    error_name = "ELIGIBLE_LEADERS_NOT_AVAILABLE"


class ReassignmentInProgressError(KafkaLogError):
    """A partition already has a reassignment in progress: wait for it (``--verify``)."""
    error_code = 60
    error_name = "REASSIGNMENT_IN_PROGRESS"


class ElectionNotNeededError(KafkaLogError):
    error_code = 84
    error_name = "ELECTION_NOT_NEEDED"


# -- the coordinator service --------------------------------------------------------------------

class CoordinatorNotAvailableError(KafkaLogError):
    """No coordinator is active (its lease was never taken, or lapsed), or the one the metadata
    log names does not answer. Everything but the coordinator's own services works without one."""
    user_error = False
    retriable = True

    error_code = 15
    error_name = "COORDINATOR_NOT_AVAILABLE"


class NotControllerError(KafkaLogError):
    """A request that changes something reached a coordinator that is not (or no longer) the
    active one: a standby, or one fenced by a newer epoch. Ask the one the metadata log names."""
    user_error = False
    retriable = True

    error_code = 41
    error_name = "NOT_CONTROLLER"


class CoordinatorAuthenticationError(KafkaLogError, PermissionError):
    """The coordinator refused the request's token (missing or wrong)."""

    error_code = 58
    error_name = "SASL_AUTHENTICATION_FAILED"


_BY_NAME = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, KafkaLogError):
        _BY_NAME.setdefault(_cls.error_name, _cls)
_BY_NAME["INVALID_RECORD"] = InvalidRecordError
_BY_NAME["CORRUPT_MESSAGE"] = CorruptRecordError
_BY_NAME["KAFKA_STORAGE_ERROR"] = KafkaStorageError


def error_for(error_name: str, message: str) -> KafkaLogError:
    """The typed error for a Kafka error name (as recorded in metadata-log results)."""
    return _BY_NAME.get(error_name, KafkaLogError)(message or error_name)


__all__ = [name for name, obj in globals().items()
           if isinstance(obj, type) and issubclass(obj, KafkaLogError)] + ["error_for"]
