"""``kafkalog --cluster URL coordinator``: the coordinator service in the foreground (with the
scheduled maintenance unless ``--no-maintenance``), and ``coordinator --status``: which one is
active, and its own answer.

The service runs until SIGTERM or SIGINT, then releases its lease (a standby takes over at once)
and exits 0. gRPC and prometheus_client are imported only here, when the command runs.
"""
from __future__ import annotations

import logging
import signal
import sys
import time

from .cluster_common import OUTPUT_HELP, columns, emit_json, emit_rows, only_with, open_admin

STATUS_COLUMNS = columns("epoch", "holder", "address", "lease_expires", "active", "uptime_s",
                         "metrics_url", "metrics")
SERVICE_OPTIONS = {"bind": "--bind", "advertised_address": "--advertised-address",
                   "metrics_port": "--metrics-port", "lease_ms": "--lease-ms",
                   "on_fenced": "--on-fenced", "no_maintenance": "--no-maintenance"}


def _help(name: str) -> str:
    """An option's help: its setting's doc and default (``coordinator/config.py``), and the
    property that sets it in --coordinator-config."""
    from ..coordinator.config import COORDINATOR_SETTINGS
    return f"{COORDINATOR_SETTINGS.help_text(name)}; property {name}".replace("%", "%%")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "coordinator", parents=parents, help="run the coordinator service, or show its status",
        description="Run the cluster's coordinator in the foreground: it serves authenticated "
                    "gRPC and Prometheus metrics, and acts only while it holds the lease in the "
                    "metadata log (a second one stands by and takes over when the lease lapses "
                    "or is released). While active it runs the scheduled maintenance "
                    "(retention every log.retention.check.interval.ms, cleanup, checkpoint "
                    "rewrites, deletion after consumption), unless --no-maintenance. "
                    "SIGTERM or SIGINT: release the lease and exit 0. "
                    "--status: the active coordinator's lease and its Status answer. The token: "
                    "--token-file F, else $KAFKALOG_COORDINATOR_TOKEN; there is no "
                    "unauthenticated mode. See docs/operations.md.",
        epilog=OUTPUT_HELP + " The service prints one line when it serves (holder, address, "
               "metrics_url, epoch: empty while it stands by). --status columns: epoch, "
               "holder, address, lease_expires (UTC), active, uptime_s, metrics_url, metrics; "
               "exit status 1 when no coordinator is active or it does not answer, 2 when it "
               "refuses the token. The service exits 1 if it was fenced with --on-fenced exit.")
    p.add_argument("--status", action="store_true",
                   help="show the active coordinator (from the metadata log) and its answer")
    p.add_argument("--bind", "--listen", dest="bind", metavar="HOST:PORT", default=None,
                   help=_help("coordinator.bind"))
    p.add_argument("--advertised-address", metavar="HOST:PORT", default=None,
                   help=_help("coordinator.advertised.address"))
    p.add_argument("--metrics-port", type=int, metavar="N", default=None,
                   help=_help("coordinator.metrics.port"))
    p.add_argument("--token-file", "--secret-file", dest="token_file", metavar="F",
                   default=None, help=_help("coordinator.token.file"))
    p.add_argument("--lease-ms", type=int, metavar="N", default=None,
                   help=_help("coordinator.lease.ms"))
    p.add_argument("--on-fenced", choices=("standby", "exit"), default=None,
                   help=_help("coordinator.on.fenced"))
    p.add_argument("--no-maintenance", action="store_true",
                   help="turn off: " + _help("coordinator.maintenance.enable") + "=false; the "
                        "service still holds the lease and serves")
    p.add_argument("--coordinator-config", metavar="FILE", default=None,
                   help="settings file of the service and its scheduled maintenance "
                        "(conf/coordinator.properties; docs/configuration.md); the options "
                        "above win")
    p.set_defaults(run=run_coordinator)


def run_coordinator(args) -> int:
    if args.status:
        only_with(args, "--status", (), SERVICE_OPTIONS)
    settings = {}
    if args.coordinator_config:
        from ..coordinator.config import load_coordinator_config
        settings = load_coordinator_config(args.coordinator_config)
    given = {name: getattr(args, name) for name in (*SERVICE_OPTIONS, "token_file")
             if name != "no_maintenance"}
    settings.update({k: v for k, v in given.items() if v is not None})
    if args.no_maintenance:
        settings["maintenance"] = False
    return run_status(args, settings) if args.status else run_service(args, settings)


def _flat(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kind}": n for kind, n in v.items()})
        else:
            out[k] = v
    return out


def run_status(args, settings: dict) -> int:
    from ..coordinator.discovery import connect
    cluster = open_admin(args, "coordinator --status").cluster
    with connect(cluster, token_file=settings.get("token_file")) as client:
        answer = client.status()
    lease = client.lease
    row = {"epoch": lease.epoch, "holder": lease.holder, "address": lease.address,
           "lease_expires": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                          time.gmtime(lease.expires_ms / 1000)),
           "active": answer.get("active"), "uptime_s": answer.get("uptime_s"),
           "metrics_url": answer.get("metrics_url"), "metrics": answer.get("metrics")}
    if args.json:
        emit_json(dict(row, lease_expires_ms=lease.expires_ms, status=answer))
    else:
        emit_rows(args, STATUS_COLUMNS, [dict(row, metrics=_flat(row["metrics"] or {}))])
    return 0


def run_service(args, settings: dict) -> int:
    from ..coordinator.config import CoordinatorConfig
    from ..coordinator.service import Coordinator
    from ..errors import FencedCoordinatorError
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = open_admin(args, "coordinator").cluster
    coordinator = Coordinator(cluster, CoordinatorConfig.of(**settings))
    ended = []

    def request_stop(signum, frame):
        ended.append(signum)
        coordinator.request_stop()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        coordinator.start()
        _announce(args, coordinator)
        while not coordinator.wait(1.0):
            pass
    finally:
        coordinator.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if coordinator.exit_reason == "fenced":
        raise FencedCoordinatorError(f"coordinator {coordinator.holder} was fenced by a newer "
                                     "epoch and exits (--on-fenced exit)")
    return 0


def _announce(args, coordinator) -> None:
    obj = {"holder": coordinator.holder, "address": coordinator.address,
           "metrics_url": coordinator.metrics_url, "epoch": coordinator.epoch,
           "maintenance": coordinator.maintenance_intervals()}
    if args.json:
        emit_json(obj)
    else:
        state = (f"active with epoch {coordinator.epoch}" if coordinator.epoch is not None
                 else "standing by")
        if obj["maintenance"] is None:
            state += ", scheduled maintenance off"
        sys.stdout.write(f"Coordinator {obj['holder']} serving on {obj['address']}, metrics at "
                         f"{obj['metrics_url']}: {state}.\n")
    sys.stdout.flush()
