"""What the cluster commands share: the ``--cluster/--principal/--json`` options, opening the
cluster, checking option combinations, and the two output forms.

Output contract (every cluster command): a table with aligned columns for people; with ``--json``
one JSON object per line, one per table row, under the lower-case column names (``topics
--describe``: one object per topic). ``consume`` always prints JSON lines. User errors are one
line on stderr and exit status 2, before anything is changed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..cluster.config import CLIENT_SETTINGS as _CLIENT_OPTIONS
from ..errors import InvalidConfigError

OUTPUT_HELP = ("Output: an aligned table; with --json one JSON object per line (one per table "
               "row, keys = the lower-case column names, null for '-').")


def common_parent() -> argparse.ArgumentParser:
    """``--cluster``, ``--principal`` and ``--json`` also after the subcommand. Defaults are
    suppressed so that the global options (before the subcommand) are not overwritten."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--cluster", metavar="URL", default=argparse.SUPPRESS,
                   help="the kafkalog cluster (storage URL); same as the global option")
    p.add_argument("--cluster-config", metavar="FILE", default=argparse.SUPPRESS,
                   help="client settings (conf/cluster.properties); same as the global option")
    p.add_argument("--principal", metavar="P", default=argparse.SUPPRESS,
                   help="principal for ACL checks (default $KAFKALOG_PRINCIPAL, else User:<login>)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="JSON lines instead of a table (consume prints JSON lines either way)")
    return p


# -- opening the cluster ---------------------------------------------------------------------

def _local_path(url: str) -> Optional[str]:
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.scheme.lower() in ("file", "local"):
        return os.path.abspath(parts.path)
    return None




def cluster_options(args) -> dict:
    """``Cluster`` keyword arguments from ``--cluster-config FILE`` (conf/cluster.properties);
    ``--principal`` wins over the file's ``kafkalog.principal``."""
    path = getattr(args, "cluster_config", None)
    opts = {}
    if path:
        from ..cluster.config import load_cluster_config
        opts = load_cluster_config(path)
    if getattr(args, "principal", None):
        opts["principal"] = args.principal
    return opts


def cluster_exists(url: str, options: Optional[dict] = None) -> bool:
    """Whether ``url`` holds a cluster, without creating anything (a local path is not made)."""
    from ..cluster.cluster import CLUSTER_FILE
    local = _local_path(url)
    if local is not None:
        return os.path.isfile(os.path.join(local, CLUSTER_FILE))
    from ..storage import open_storage
    storage_options = {k: v for k, v in (options or {}).items() if k not in _CLIENT_OPTIONS}
    return open_storage(url, **storage_options).exists(CLUSTER_FILE)


def storage_options(args) -> dict:
    """The ``storage.*`` settings of ``--cluster-config FILE`` (S3 endpoint and keys, ...), for
    the log-dir commands, which open storage without a cluster."""
    return {k: v for k, v in cluster_options(args).items() if k not in _CLIENT_OPTIONS}


def add_storage_config(p) -> None:
    """``--cluster-config FILE`` after the subcommand too; only its ``storage.*`` settings (S3
    endpoint and keys, ...) apply to the log-dir commands."""
    import argparse
    p.add_argument("--cluster-config", metavar="FILE", default=argparse.SUPPRESS,
                   help="storage.* settings (S3 endpoint, keys: conf/cluster.properties) for "
                        "opening the files")


def _parent(url: str) -> Optional[str]:
    if "://" not in url:
        return os.path.dirname(url.rstrip("/")) or None
    scheme, rest = url.split("://", 1)
    rest = rest.strip("/")
    if "/" not in rest:
        return None                     # a bucket (or a file:// root) has no parent
    return f"{scheme}://{rest.rsplit('/', 1)[0]}"


def cluster_root_of(url: str, options: Optional[dict] = None) -> Optional[str]:
    """The root of the kafkalog cluster that the directory ``url`` is part of: the root itself,
    one of its log dirs (``<root>/logdir-N``) or a partition dir in one (``<root>/logdir-N/
    <topic>-<p>``); else None. Local paths are resolved first (symlinks, ``..``), so no other
    spelling of a cluster's directory gets past. Nothing is created."""
    local = _local_path(url)
    current: Optional[str] = os.path.realpath(local) if local is not None else url.rstrip("/")
    for _ in range(3):
        if current is None:
            break
        if cluster_exists(current, options):
            return current
        current = _parent(current)
    return None


def refuse_cluster_dir(url: str, args, command: str, instead: str) -> None:
    """Stop a log-dir command that writes before it changes anything, if ``url`` belongs to a
    kafkalog cluster: a cluster's segments are never modified in place (docs/protocol.md §1,
    readers map them) and only its metadata log assigns offsets. ``instead`` is the cluster
    command to use, with ``{root}`` for the cluster's URL."""
    root = cluster_root_of(url, storage_options(args))
    if root is not None:
        from ..errors import ClusterDirectoryError
        raise ClusterDirectoryError(
            f"{url} belongs to the kafkalog cluster {root}, whose segment files are never "
            f"modified in place (readers map them) and whose offsets only its metadata log "
            f"assigns: {command} would corrupt it. Use: {instead.format(root=root)}")


def open_admin(args, command: str, *, create: bool = False):
    """The :class:`~pyspark_kafkalog.admin.Admin` of ``--cluster``; only ``create`` may make a
    new cluster, so a mistyped URL is an error rather than an empty cluster."""
    url = getattr(args, "cluster", None)
    if not url:
        raise InvalidConfigError(f"{command} needs --cluster URL (the storage URL of a kafkalog "
                                 "cluster), e.g. kafkalog --cluster /data/kl " + command)
    options = cluster_options(args)
    if not create and not cluster_exists(url, options):
        raise InvalidConfigError(f"{url} is not a kafkalog cluster (no _kafkalog/cluster.json); "
                                 f"create one with: kafkalog --cluster {url} topics --create "
                                 "--topic NAME")
    from ..admin import Admin
    return Admin(url, create=create, client_id=getattr(args, "client_id", None), **options)


# -- option checks ---------------------------------------------------------------------------

def only_with(args, action: str, allowed: Iterable[str], options: Mapping[str, str]) -> None:
    """Reject options given (not None / not empty) that ``action`` does not take.
    ``options`` maps attribute name -> flag spelling."""
    allowed = set(allowed)
    for attr, flag in options.items():
        value = getattr(args, attr, None)
        given = not (value is None or value is False or value == [])
        if attr not in allowed and given:
            raise InvalidConfigError(f"{flag} does not apply to {action}")


def chosen_action(args, allowed: Mapping[str, Iterable[str]],
                  options: Mapping[str, str]) -> Tuple[str, str]:
    """The action flag given (kafka-topics.sh style: one of ``--list``, ``--describe``, …, an
    argparse group makes it exactly one) and its spelling; options it does not take are
    refused (``only_with``). ``allowed``: per action, the options it takes."""
    action = next(a for a in allowed if getattr(args, a))
    flag = "--" + action.replace("_", "-")
    only_with(args, flag, allowed[action], options)
    return action, flag


def require(args, action: str, *attrs_flags: Tuple[str, str]) -> None:
    for attr, flag in attrs_flags:
        if getattr(args, attr, None) is None:
            raise InvalidConfigError(f"{action} needs {flag}")


def parse_configs(pairs: Sequence[str], flag: str = "--config") -> dict:
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidConfigError(f"{flag} {pair!r}: expected NAME=VALUE")
        if key in out:
            raise InvalidConfigError(f"{flag}: {key} given twice")
        out[key] = value.strip()
    return out


def non_negative(value: Optional[int], flag: str, minimum: int = 0) -> None:
    if value is not None and value < minimum:
        raise InvalidConfigError(f"{flag} must be >= {minimum}, got {value}")


# -- output ----------------------------------------------------------------------------------

Column = Tuple[str, str]   # (key in the row dicts and the JSON, table header)


def columns(*keys: str) -> List[Column]:
    return [(k, k.upper().replace("_", "-")) for k in keys]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    return str(value)


def format_table(cols: Sequence[Column], rows: Sequence[Mapping]) -> List[str]:
    cells = [[header for _, header in cols]] + [[_cell(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def emit_rows(args, cols: Sequence[Column], rows: Sequence[Mapping]) -> None:
    """Rows as a table (header included), or one JSON object per row with ``--json``."""
    if args.json:
        for r in rows:
            emit_json({k: r.get(k) for k, _ in cols})
        return
    if rows:
        sys.stdout.write("\n".join(format_table(cols, rows)) + "\n")


def say(args, text: str, obj=None) -> None:
    """A one-line outcome: ``text`` for people, ``obj`` as one JSON line with ``--json``."""
    if args.json:
        if obj is not None:
            emit_json(obj)
    else:
        sys.stdout.write(text + "\n")
