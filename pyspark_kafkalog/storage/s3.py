"""Amazon S3 (and S3-compatible stores that implement conditional writes), through s3fs.

Verified against the installed s3fs 2026.9 source: ``pipe_file(path, data, mode="create")`` sends
``PutObject`` (or ``CompleteMultipartUpload`` above 100 MiB) with ``If-None-Match: *``, and
s3fs.errors.translate_boto_error turns the 412 PreconditionFailed whose Condition is If-None-Match
into ``FileExistsError``. Moto 5.2 (the test server) honours ``If-None-Match: *`` on PutObject and
answers with exactly that error.
"""
from __future__ import annotations

import random
import time

from ..errors import AlreadyExistsError, KafkaStorageError, StorageNotFoundError
from .base import StorageGuarantees, check_range, storage_errors
from .fsspec_backends import FsspecStorage

# AWS answers 409 ConditionalRequestConflict when two conditional writes to one key overlap; the
# documented reaction is to retry, after which the loser gets its 412.
_CONFLICT_RETRIES = 8


class S3Storage(FsspecStorage):
    """Objects under ``s3://bucket/prefix``.

    * ``create_if_absent``: a conditional PUT (``If-None-Match: *``), which S3 evaluates
      atomically server-side (since August 2024): exactly one concurrent creator gets 200, the rest
      412; an object appears whole or not at all. One caveat: if the winner's response is lost and
      botocore/s3fs retries the PUT, the retry sees its own object and gets 412, so the winner is
      told :class:`AlreadyExistsError`. No two writers ever both "win"; a caller that must know
      whether the object is its own puts a unique token in the content and reads it back.
    * ``replace``: a plain PUT, atomic by S3's design (readers get the old or new object whole).
      Full reads are single GETs on purpose: s3fs would otherwise split a big read into
      concurrent ranged GETs, which could stitch two versions together across a replace.
    * no ``append`` (objects are immutable); ``truncate`` is read-prefix + PUT.
    * strong read-after-write and list-after-write consistency: S3 has had both since
      December 2020. s3fs's own listing cache would undo list-after-write across processes, so
      it is switched off (``use_listings_cache=False``).
    * ``durable_on_return``: S3 stores an object redundantly before acknowledging the PUT.
    * There are no directories: ``makedirs`` does nothing, and a "directory" is listed only while
      some key lies under it.
    """

    _GUARANTEES = StorageGuarantees(
        atomic_create_if_absent=True, atomic_replace=True, append=False, truncate_in_place=False,
        read_after_write=True, list_after_write=True, durable_on_return=True, multi_process=True)

    def __init__(self, bucket_and_prefix: str, **storage_options):
        import fsspec
        storage_options.setdefault("use_listings_cache", False)
        fs = fsspec.filesystem("s3", **storage_options)
        root = bucket_and_prefix.strip("/")
        super().__init__(fs, root, f"s3://{root}")
        self._bucket, _, self._prefix = root.partition("/")

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        if end is not None and end == start:
            # an empty Range ("bytes=5-4") is invalid, and S3 ignores invalid Ranges: it would
            # send the whole object
            self._file_info(path, "read")
            return b""
        full = self._full(path)
        with storage_errors("read", self._where(path)):
            try:
                if start == 0 and end is None:
                    return self._fs.cat_file(full, max_concurrency=1)
                return self._fs.cat_file(full, start=start, end=end)
            except OSError as e:
                if _error_code(e) == "InvalidRange":  # 416: start at or past the end
                    return b""
                raise

    def create_if_absent(self, path: str, data: bytes) -> None:
        full = self._full(path)
        where = self._where(path)
        data = bytes(data)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                with storage_errors("create", where):
                    try:
                        self._fs.pipe_file(full, data, mode="create")
                        return
                    except OSError as e:
                        if _error_code(e) == "PreconditionFailed" or _http_status(e) == 412:
                            raise AlreadyExistsError(f"create {where}: already exists") from e
                        raise
            except KafkaStorageError as e:
                if isinstance(e, AlreadyExistsError) or _error_code(e.__cause__) != "ConditionalRequestConflict":
                    raise
                if attempt == _CONFLICT_RETRIES - 1:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * 2 ** attempt)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        # S3 DELETE succeeds on a missing key, hence the existence check for missing_ok=False
        # (racy by nature: someone may delete it between the two calls).
        if not missing_ok and not self.exists(path):
            raise StorageNotFoundError(f"delete {self._where(path)}: not found")
        self._delete_keys([self._full(path)], "delete", self._where(path))

    def delete_many(self, paths) -> None:
        self._delete_keys([self._full(p) for p in paths], "delete_many", self.url)

    def delete_tree(self, dir_path: str) -> None:
        full = self._full(dir_path)  # not the root: wiping the whole store is not a tree delete
        where = self._where(dir_path)
        with storage_errors("delete_tree", where):
            try:
                keys = [k for k in self._fs.find(full) if k.startswith(full + "/")]
            except FileNotFoundError:  # (find() returns a file named like the directory too)
                keys = []
        self._delete_keys(keys, "delete_tree", where)

    def _delete_keys(self, full_paths: list[str], op: str, where: str) -> None:
        """DeleteObjects in batches of 1000, raising on per-key errors (s3fs.rm ignores them)."""
        keys = [p.split("/", 1)[1] for p in full_paths]
        with storage_errors(op, where):
            for i in range(0, len(keys), 1000):
                batch = keys[i:i + 1000]
                out = self._fs.call_s3("delete_objects", Bucket=self._bucket, Delete={
                    "Objects": [{"Key": k} for k in batch], "Quiet": True})
                errors = out.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise KafkaStorageError(
                        f"{op} {where}: {len(errors)} key(s) not deleted, e.g. "
                        f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")
            for p in full_paths:
                self._fs.invalidate_cache(p)

    def makedirs(self, dir_path: str) -> None:
        self._full(dir_path, allow_root=True)  # still reject bad paths


def _client_error(e):
    """The botocore ClientError behind an exception that s3fs translated, if any."""
    seen = 0
    while e is not None and seen < 5:
        if getattr(e, "response", None):
            return e
        e = e.__cause__
        seen += 1
    return None


def _error_code(e) -> str | None:
    ce = _client_error(e)
    return ce.response.get("Error", {}).get("Code") if ce is not None else None


def _http_status(e) -> int | None:
    ce = _client_error(e)
    return ce.response.get("ResponseMetadata", {}).get("HTTPStatusCode") if ce is not None else None
