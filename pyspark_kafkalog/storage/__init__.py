"""Storage primitives the log format is built on, per backend; the only package that uses fsspec.

Backends are imported lazily so that opening local storage (the common case in executors and
CLIs) does not pay for importing fsspec, s3fs and botocore.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

from ..config_def import parse_bool
from ..errors import InvalidConfigError
from .base import FileInfo, Storage, StorageGuarantees
from .local import LocalStorage

__all__ = ["FileInfo", "LocalStorage", "Storage", "StorageGuarantees", "open_storage"]


def open_storage(url: str, **storage_options) -> Storage:
    """The :class:`Storage` rooted at ``url``.

    ``url`` is ``file:///abs/path``, a plain local path (relative or absolute; the directory is
    created), ``memory://name``, ``s3://bucket/prefix`` (``s3a://`` too, as Spark users write it;
    ``storage_options`` such as ``endpoint_url``, ``key``, ``secret``, ``client_kwargs`` go to
    s3fs), or any other fsspec URL (see :class:`FsspecStorage` for what that can and cannot do).
    ``fsync`` (default True) applies to local storage and is accepted and ignored elsewhere, so
    callers can pass one set of options whatever the URL. ``direct_io`` (true or false, also as a
    string, as ``storage.direct_io`` in options and cluster.properties) is for local storage only,
    where it defaults to true: segments of 1 MiB and more bypass the page cache
    (:class:`LocalStorage`); ``false`` writes them through it.
    """
    if not isinstance(url, str) or not url:
        raise InvalidConfigError(f"storage url must be a non-empty str, got {url!r}")
    fsync = storage_options.pop("fsync", True)
    # False: a root that is missing is not made (a registered log dir's; local storage only)
    create_root = storage_options.pop("create_root", True)
    direct_io = storage_options.pop("direct_io", None)
    direct_io = None if direct_io is None else _flag("direct_io", direct_io)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if direct_io and scheme not in ("", "file", "local"):
        raise InvalidConfigError(f"{url}: storage option direct_io applies to local storage only")

    if scheme in ("", "file", "local"):
        path = _local_path(url, scheme)
        if storage_options:
            raise InvalidConfigError(f"unknown options for local storage: {sorted(storage_options)}")
        return LocalStorage(path, fsync=fsync, direct_io=direct_io is not False,
                            create_root=create_root)

    rest = url.split("://", 1)[1].strip("/")
    if scheme == "memory":
        if not rest:
            raise InvalidConfigError(f"memory storage needs a name: memory://NAME, got {url!r}")
        if storage_options:
            raise InvalidConfigError(f"unknown options for memory storage: {sorted(storage_options)}")
        from .fsspec_backends import MemoryStorage
        return MemoryStorage(rest)

    if scheme in ("s3", "s3a", "s3n"):
        if not rest or rest.startswith("/"):
            raise InvalidConfigError(f"s3 storage needs a bucket: s3://BUCKET[/PREFIX], got {url!r}")
        from .s3 import S3Storage
        try:
            return S3Storage(rest, **storage_options)
        except ImportError as e:
            raise InvalidConfigError(f"{url}: s3 support needs the s3fs package ({e})") from e

    return _open_generic(url, scheme, storage_options)


def _flag(name: str, value) -> bool:
    try:
        return parse_bool(name, value)
    except InvalidConfigError:
        raise InvalidConfigError(
            f"storage option {name} must be true or false, not {value!r}") from None


def _local_path(url: str, scheme: str) -> str:
    if not scheme:
        return url
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise InvalidConfigError(f"file URL must be file:///absolute/path, got {url!r}")
    if not parts.path:
        raise InvalidConfigError(f"file URL has no path: {url!r}")
    return os.path.abspath(parts.path)


def _open_generic(url: str, scheme: str, storage_options: dict) -> Storage:
    import fsspec

    from .fsspec_backends import FsspecStorage

    try:
        cls = fsspec.get_filesystem_class(scheme)
    except (ValueError, ImportError) as e:
        raise InvalidConfigError(f"{url}: unsupported storage protocol {scheme!r} ({e})") from e
    try:
        fs = cls(**storage_options)
    except TypeError as e:
        raise InvalidConfigError(f"{url}: bad storage options {sorted(storage_options)} ({e})") from e
    root = cls._strip_protocol(url)
    return FsspecStorage(fs, root, url.rstrip("/"))
