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
from typing import Optional

from ..errors import AlreadyExistsError, KafkaStorageError, StorageNotFoundError
from .base import StorageGuarantees, check_range, storage_errors
from .fsspec_backends import FsspecStorage

# AWS answers 409 ConditionalRequestConflict when two conditional writes to one key overlap; the
# documented reaction is to retry, after which the loser gets its 412.
_CONFLICT_RETRIES = 8
# publish_stream's upload parts: S3 wants at least 5 MiB per part but the last
_PART_BYTES = 8 << 20
# CopyObject's limit; bigger objects would need a multipart copy (segments are 1 GiB by default)
_COPY_MAX = 5 << 30


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
        self._conditional("create", where, lambda: self._fs.pipe_file(full, data, mode="create"))

    def publish_stream(self, path: str, chunks, *, replace: bool = False) -> None:
        """A multipart upload, completed with ``If-None-Match: *`` (unless ``replace``), which
        S3 evaluates as atomically as a conditional PUT; a stream under one part is one PUT.

        Memory holds one part. If ``chunks`` raises (or the upload fails) the upload is
        aborted and nothing appears; a process killed mid-way leaves an incomplete upload,
        invisible to readers, which only a bucket lifecycle rule (AbortIncompleteMultipartUpload)
        reclaims.
        """
        full, where = self._full(path), self._where(path)
        key = full.split("/", 1)[1]
        part = bytearray()
        it = iter(chunks)
        for chunk in it:
            part += chunk
            if len(part) >= _PART_BYTES:
                break
        else:
            (self.replace if replace else self.create_if_absent)(path, bytes(part))
            return
        with storage_errors("create", where):
            upload = self._fs.call_s3("create_multipart_upload", Bucket=self._bucket, Key=key)
        upload_id, parts, done = upload["UploadId"], [], False
        try:
            while True:
                for chunk in it:
                    part += chunk
                    if len(part) >= _PART_BYTES:
                        break
                if not part:
                    break
                with storage_errors("create", where):
                    out = self._fs.call_s3("upload_part", Bucket=self._bucket, Key=key,
                                           UploadId=upload_id, PartNumber=len(parts) + 1,
                                           Body=bytes(part))
                parts.append({"PartNumber": len(parts) + 1, "ETag": out["ETag"]})
                part = bytearray()
            condition = {} if replace else {"IfNoneMatch": "*"}
            self._conditional("create", where, lambda: self._fs.call_s3(
                "complete_multipart_upload", Bucket=self._bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts}, **condition))
            done = True
        finally:
            self._fs.invalidate_cache(full)
            if not done:
                try:
                    self._fs.call_s3("abort_multipart_upload", Bucket=self._bucket, Key=key,
                                     UploadId=upload_id)
                except Exception:   # the error that got us here matters more
                    pass

    def checksum(self, path: str) -> Optional[str]:
        """The object's full CRC-32C where it was stored with one, else its ETag where that is
        the MD5 of the content (a single-part upload; multipart ETags are not, and stores with
        SSE-KMS give other ETags, which then simply do not match)."""
        full, where = self._full(path), self._where(path)
        with storage_errors("stat", where):
            head = self._fs.call_s3("head_object", Bucket=self._bucket,
                                    Key=full.split("/", 1)[1], ChecksumMode="ENABLED")
        if head.get("ChecksumCRC32C") and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            return f"crc32c:{head['ChecksumCRC32C']}"
        etag = str(head.get("ETag", "")).strip('"')
        return f"md5:{etag}" if etag and "-" not in etag else None

    def copy_from(self, src, src_path: str, dst_path: str, *, replace: bool = False) -> bool:
        """CopyObject, when ``src`` is S3 at this endpoint and the object fits one CopyObject
        (5 GiB); also False when the store refuses this client the source (AccessDenied), so
        that the caller streams it with each storage's own credentials.

        Create-if-absent sends ``If-None-Match: *``, which AWS evaluates on CopyObject as on
        PutObject. Moto 5.2 ignores it on CopyObject, and other S3-compatible stores may too:
        there the existence check before the copy is all that stands between a racing copy and
        an existing object, so callers must (as the replica copier does) only ever copy bytes
        that are equal to what they might overwrite, or check afterwards.
        """
        if not isinstance(src, S3Storage) or _endpoint(src._fs) != _endpoint(self._fs):
            return False
        if src.size(src_path) > _COPY_MAX:
            return False
        full, where = self._full(dst_path), self._where(dst_path)
        src_bucket, _, src_key = src._full(src_path).partition("/")
        if not replace and self.exists(dst_path):   # early out; the condition decides
            raise AlreadyExistsError(f"create {where}: already exists")
        condition = {} if replace else {"IfNoneMatch": "*"}
        try:
            self._conditional("copy", where, lambda: self._fs.call_s3(
                "copy_object", Bucket=self._bucket, Key=full.split("/", 1)[1],
                CopySource={"Bucket": src_bucket, "Key": src_key}, **condition))
        except KafkaStorageError as e:
            if _error_code(e.__cause__) == "AccessDenied" or _http_status(e.__cause__) == 403:
                return False
            if _error_code(e.__cause__) in ("NoSuchKey", "NotFound"):
                raise StorageNotFoundError(f"copy {src._where(src_path)}: not found") from e
            raise
        finally:
            self._fs.invalidate_cache(full)
        return True

    def _conditional(self, op: str, where: str, call) -> None:
        """``call()``, a conditional write: 412 is :class:`AlreadyExistsError`, 409
        ConditionalRequestConflict is retried (AWS's documented reaction)."""
        for attempt in range(_CONFLICT_RETRIES):
            try:
                with storage_errors(op, where):
                    try:
                        call()
                        return
                    except Exception as e:
                        if _error_code(e) == "PreconditionFailed" or _http_status(e) == 412:
                            raise AlreadyExistsError(f"{op} {where}: already exists") from e
                        raise
            except KafkaStorageError as e:
                if (isinstance(e, AlreadyExistsError) or attempt == _CONFLICT_RETRIES - 1
                        or _error_code(e.__cause__) != "ConditionalRequestConflict"):
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


def _endpoint(fs) -> str | None:
    """Where an s3fs filesystem sends its requests (None: AWS's own, by region)."""
    return getattr(fs, "endpoint_url", None) or (fs.client_kwargs or {}).get("endpoint_url")


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
