"""The agent defers modules gRPC and protobuf import but the agent never uses (asyncio, gRPC's
asyncio API, protobuf's pure-Python messages):
importing gRPC and serving leaves them unloaded, and the first real use loads them."""

from __future__ import annotations

import subprocess
import sys

# A fresh interpreter: this one has imported asyncio long ago.
PROBE = """
import sys
from concurrent import futures
from sandbox.__main__ import DEFERRED_MODULES, _defer
_defer(DEFERRED_MODULES)
import grpc
from sandbox import health
from sandbox.health import SERVING, HealthService
import sandbox.server
server = grpc.server(futures.ThreadPoolExecutor(2))
service = HealthService()
server.add_generic_rpc_handlers((service.handler(),))
service.set("", SERVING)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    assert health.check(channel, 10) == SERVING
assert "asyncio.events" not in sys.modules and "ssl" not in sys.modules, sorted(sys.modules)
assert "google.protobuf.text_format" not in sys.modules, sorted(sys.modules)
import asyncio
assert asyncio.run(asyncio.sleep(0, "real")) == "real"
assert "asyncio.events" in sys.modules and grpc.aio.insecure_channel is not None
server.stop(0)
print("ok")
"""


def test_grpc_serves_without_asyncio_and_a_real_use_loads_it() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
