"""A network destination the test suite owns: a network namespace with servers inside.

Network tests must never send traffic anywhere but to servers they start themselves.
``Destination`` creates a network namespace joined to the host by a veth pair,
addresses it in 198.18.0.0/15 (reserved for benchmarks, never on the internet) plus one
link-local stand-in for a cloud metadata service, and runs a small HTTP server and a
TCP echo server in it. The host routes to it like to any other network, so a sandbox
reaches it exactly as it would reach the outside world — unless callbox stops it.
Needs root and iproute2 (the CI machine has both).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from types import TracebackType

NETWORK = "198.18.77.0/24"
HOST_ADDRESS = "198.18.77.1"
ADDRESS = "198.18.77.2"
METADATA_STANDIN = "169.254.77.77"
"""A link-local address served by the destination: what 169.254.169.254 is on a cloud host."""
HTTP_PORT = 8080
ECHO_PORT = 7007
BANNER = "callbox-test-destination"

_SERVERS = f"""
import http.server, socket, socketserver, sys, threading

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("{BANNER} " + self.path + " connection=" + str(self.headers.get("Connection"))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)

socketserver.ThreadingTCPServer.allow_reuse_address = True
http_server = http.server.ThreadingHTTPServer(("0.0.0.0", {HTTP_PORT}), Handler)
echo_server = socketserver.ThreadingTCPServer(("0.0.0.0", {ECHO_PORT}), Echo)
for server in (http_server, echo_server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()  # runs until the test closes our stdin
"""


NAMESPACE_PREFIX = "callbox-test-"
"""A destination's namespace is ``callbox-test-PID-TAG``: PID is the test process that made it."""


def remove_stale_destinations() -> None:
    """Remove the namespaces of destinations whose test process is gone (a run killed before its
    clean-up): they hold this module's fixed addresses, so a new destination could not route.
    Removing a namespace removes the veth pair that joins it to the host."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    for line in listing.stdout.splitlines():
        name = line.split(" ", 1)[0]
        if not name.startswith(NAMESPACE_PREFIX):
            continue
        pid, _, _ = name[len(NAMESPACE_PREFIX):].partition("-")
        if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            continue  # a live run's (names without a PID are from older runs: stale too)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Destination:
    """``with Destination() as dest:`` — servers at ``dest.address`` until the block ends."""

    address = ADDRESS
    network = NETWORK
    metadata_standin = METADATA_STANDIN

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.namespace = f"{NAMESPACE_PREFIX}{os.getpid()}-{tag}"
        self.host_if = f"cbt{tag}"  # not cbx…: callbox's own filter must not match it
        self.peer_if = f"cbp{tag}"
        self._server: subprocess.Popen[str] | None = None

    def __enter__(self) -> Destination:
        if os.geteuid() != 0:
            raise RuntimeError("the test destination needs root (network namespaces)")
        remove_stale_destinations()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        ns = self.namespace
        _ip("netns", "add", ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
        _ip("link", "set", self.peer_if, "netns", ns)
        _ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("route", "add", f"{METADATA_STANDIN}/32", "via", ADDRESS, "dev", self.host_if)
        _ip("-n", ns, "addr", "add", f"{ADDRESS}/24", "dev", self.peer_if)
        _ip("-n", ns, "addr", "add", f"{METADATA_STANDIN}/32", "dev", self.peer_if)
        _ip("-n", ns, "link", "set", self.peer_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", HOST_ADDRESS)
        self._server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-u", "-c", _SERVERS],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self._server.stdout is not None
        line = self._server.stdout.readline()  # blocks until the servers are bound
        if line.strip() != "ready":
            raise RuntimeError(f"the test destination's servers did not start: {line!r}")

    def close(self) -> None:
        if self._server is not None:
            if self._server.stdin is not None:
                self._server.stdin.close()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30, check=False)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


CONNECT_SCRIPT = r"""
import json, socket, sys, threading, time
timeout = float(sys.argv[1])
targets = [(host, int(port)) for host, port in zip(sys.argv[2::2], sys.argv[3::2])]
outcomes = [None] * len(targets)
def attempt(i, host, port):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(timeout)
    started = time.monotonic()
    try:
        s.connect((host, port))
        outcome = "connected"
    except TimeoutError:
        outcome = "timeout"
    except OSError as exc:
        outcome = "error:" + (exc.strerror or type(exc).__name__)
    finally:
        s.close()
    outcomes[i] = [outcome, round(time.monotonic() - started, 3)]
threads = [threading.Thread(target=attempt, args=(i, *t)) for i, t in enumerate(targets)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(outcomes))
"""


def connect_many(box: object, targets: list[tuple[str, int]], *, timeout: float = 2.0) -> list[str]:
    """Try plain TCP connections from inside ``box`` (ignoring any proxy) to every target at
    once, in one process (one command in the sandbox, however many targets); each outcome is
    ``connected``, ``timeout`` or ``error:<reason>``, in the targets' order."""
    import json

    from tests.integration.helpers import run

    argv = [str(part) for target in targets for part in target]
    result = run(box, ["python3", "-c", CONNECT_SCRIPT, str(timeout), *argv], timeout_ms=int(timeout * 1000) + 15_000)
    assert result.exit_code == 0, result.stderr.data().decode(errors="replace")
    return [str(outcome) for outcome, _seconds in json.loads(result.stdout.data().decode())]


def connect_from(box: object, host: str, port: int, *, timeout: float = 2.0) -> str:
    """Try a plain TCP connection from inside ``box`` (ignoring any proxy); the outcome:
    ``connected``, ``timeout`` or ``error:<reason>``."""
    return connect_many(box, [(host, port)], timeout=timeout)[0]
