"""Regenerate pyspark_kafkalog/coordinator/kafkalog_rpc_pb2.py from kafkalog_rpc.proto.

Needs grpcio-tools (the test extra). Run from anywhere: ``python tools/gen_rpc_proto.py``;
``--out DIR`` writes there instead (the test that checks the committed module is current).
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "pyspark_kafkalog", "coordinator")
PROTO = "kafkalog_rpc.proto"


def generate(out_dir: str) -> None:
    from grpc_tools import protoc
    # relative to -I, so that the generated module names the .proto the same from any checkout
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
                      os.path.join(PROTO_DIR, PROTO)])
    if rc != 0:
        raise SystemExit(f"protoc failed ({rc})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=PROTO_DIR)
    generate(parser.parse_args().out)
    sys.exit(0)
