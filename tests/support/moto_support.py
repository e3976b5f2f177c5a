"""A moto S3 server for the tests that run over S3 (``moto_options``, a session fixture: import
it into the test module that uses it), and the environment of child processes that reach it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from support.ci import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
BUCKET = "kafkalog-test"


# -- fixtures -----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Moto's server checks If-None-Match and then stores the object as two steps with no lock between
# them, and serves requests on threads: measured with 8 processes racing, about 1 round in 300 let
# two conditional PUTs both succeed. Real S3 evaluates the condition atomically. So moto's own
# entry point is run with requests served one at a time (threaded=False), which makes each request
# atomic as on S3 and keeps the race test about our client rather than about moto's server.
_MOTO_LAUNCHER = """
import sys
import moto.server
_run_simple = moto.server.run_simple
moto.server.run_simple = lambda *a, **kw: _run_simple(*a, **{**kw, "threaded": False})
moto.server.main(sys.argv[1:])
"""


@pytest.fixture(scope="session")
def moto_options(tmp_path_factory):
    """A moto S3 server in a subprocess; the storage options that reach it."""
    port = _free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    try:
        proc = subprocess.Popen([sys.executable, "-c", _MOTO_LAUNCHER, "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    except OSError as e:
        skip_or_fail(f"moto server could not start: {e}")
    endpoint = f"http://127.0.0.1:{port}"
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 20
    while True:
        try:
            no_proxy.open(endpoint + "/moto-api/", timeout=1).close()
            break
        except Exception as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                skip_or_fail(f"moto server could not start (exit {proc.poll()}): {e}")
            time.sleep(0.1)
    import boto3  # the bucket is set up outside the code under test
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
           "client_kwargs": {"region_name": "us-east-1"}}
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env
