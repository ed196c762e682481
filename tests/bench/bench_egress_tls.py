"""Rows 7e-7g: what the egress proxy's TLS interception (a ``[[secret]]``'s host) costs
against the plain CONNECT tunnel (any other allowed host).

A TLS server in a network namespace of its own (``tests/netdest.py``, root needed, as for
the network rows) answers as ``secret.bench.test`` (a secret's host: the proxy terminates TLS
with the sandbox's CA, fills the secret in, opens TLS to the server itself) and as
``plain.bench.test`` (tunnelled), with a certificate from a bench CA the engine gives the
proxy as its test-only extra CA. One allowlist sandbox; a Python client in it alternates
the two hosts, timing each request itself (so no process start is counted):

- 7e: a ``GET`` of 2 bytes on a new connection (CONNECT, TLS handshake(s), request);
- 7f: a ``GET`` of 2 bytes on a kept-alive connection;
- 7g: a ``GET`` of :data:`BIG` bytes (throughput).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.engine.docker.engine import DockerEngine
from harness.engine.exec_result import collect
from harness.engine.secrets import SecretSpec
from harness.engine.spec import SandboxSpec

PORT = 8443
BIG = 32 << 20
HOSTS = ("secret.bench.test", "plain.bench.test")
TOKEN_VAR = "CALLBOX_BENCH_SECRET"

SERVER = f"""
import http.server, ssl, sys, threading
BIG = b"x" * {BIG}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # its header and body go as two writes: no 40 ms delayed-ACK wait between
    def do_GET(self):
        body = BIG if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT}), Handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

CLIENT = r"""
import http.client, json, os, ssl, sys, time
from urllib.parse import urlsplit
hosts, port, samples, big = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
proxy = urlsplit(os.environ["HTTPS_PROXY"])
context = ssl.create_default_context()
token = {"Authorization": "Bearer " + os.environ["BENCH_TOKEN"]}
def connection(host):
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=60)
    conn.set_tunnel(host, port)
    return conn
def get(conn, path):
    conn.request("GET", path, headers=token)
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200, response.status
    return len(data)
out = {}
kept = {host: connection(host) for host in hosts}
for host in hosts:
    get(kept[host], "/small")  # warm: handshake done
for i in range(samples):
    for host in (hosts if i % 2 else hosts[::-1]):
        t0 = time.perf_counter()
        conn = connection(host)
        get(conn, "/small")
        out.setdefault("new_" + host, []).append((time.perf_counter() - t0) * 1000)
        conn.close()
        t0 = time.perf_counter()
        get(kept[host], "/small")
        out.setdefault("kept_" + host, []).append((time.perf_counter() - t0) * 1000)
for i in range(max(samples // 3, 5)):
    for host in (hosts if i % 2 else hosts[::-1]):
        t0 = time.perf_counter()
        assert get(kept[host], "/big") == big
        out.setdefault("big_" + host, []).append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
"""


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(directory, "req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=callbox bench CA", "-addext", "basicConstraints=critical,CA:TRUE")
    (directory / "ext").write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in HOSTS) + "\n")
    _openssl(directory, "req", "-new", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj",
             f"/CN={HOSTS[0]}")
    _openssl(directory, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext", "-out", "server.crt")
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


def bench_egress_tls(engine: DockerEngine, spec: SandboxSpec, samples: int,
                     progress: Callable[[str], None]) -> dict[str, list[float]]:
    from tests.netdest import Destination

    with tempfile.TemporaryDirectory(prefix="callbox-bench-tls-") as temporary, Destination() as destination:
        directory = Path(temporary)
        ca, cert, key = _certificates(directory)
        server = subprocess.Popen(["ip", "netns", "exec", destination.namespace, sys.executable, "-u", "-c", SERVER,
                                   str(cert), str(key)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        old = os.environ.get(TOKEN_VAR)
        os.environ[TOKEN_VAR] = "bench-secret-value-0123456789"
        box = None
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            tls_engine = DockerEngine(engine.client, run_root=engine.run_root, reap_on_start=False,
                                      egress_test_network=destination.network,
                                      egress_test_hosts={h: destination.address for h in HOSTS},
                                      egress_test_ca=str(ca))
            secret = SecretSpec(name="BENCH_TOKEN", env=TOKEN_VAR, hosts=(f"{HOSTS[0]}:{PORT}",),
                                header="Authorization: Bearer {value}")
            box = tls_engine.create(spec.model_copy(update={
                "network": "allowlist", "allow_hosts": tuple(f"{h}:{PORT}" for h in HOSTS), "secrets": (secret,)}))
            result = collect(box.agent.exec(["python3", "-c", CLIENT, ",".join(HOSTS), str(PORT), str(samples),
                                             str(BIG)], env=box.spec.env, rpc_timeout=600, timeout_ms=600_000))
            if result.exit_code != 0:
                raise RuntimeError(f"the TLS bench client failed: {result.stderr.data().decode(errors='replace')}")
            data: dict[str, Any] = json.loads(result.stdout.data())
            progress(f"egress TLS interception: {samples} samples")
            return {f"egress_tls_{kind}_{'intercepted' if host == HOSTS[0] else 'tunnel'}": values
                    for name, values in data.items() for kind, _, host in [name.partition("_")]}
        finally:
            if box is not None:
                box.destroy()
            if old is None:
                os.environ.pop(TOKEN_VAR, None)
            else:
                os.environ[TOKEN_VAR] = old
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=10)


def add_egress_tls_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 7e-7g (``add`` takes ``Row``'s arguments)."""
    if "egress_tls_new_intercepted" not in data:
        return
    tunnel = "the same through the plain CONNECT tunnel (interleaved)"
    add("7e. HTTPS GET through the egress proxy, new connection, TLS terminated for a secret's host", "time",
        data["egress_tls_new_intercepted"], tunnel, data["egress_tls_new_tunnel"], "— (info)")
    add("7f. HTTPS GET through the egress proxy, kept-alive connection, TLS terminated for a secret's host", "time",
        data["egress_tls_kept_intercepted"], tunnel, data["egress_tls_kept_tunnel"], "— (info)")
    add(f"7g. HTTPS download through the egress proxy ({BIG >> 20} MiB), TLS terminated for a secret's host",
        "rate", data["egress_tls_big_intercepted"], tunnel, data["egress_tls_big_tunnel"], "— (info)",
        rate_bytes=BIG)
