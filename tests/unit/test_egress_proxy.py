"""The egress proxy of the allowlist network mode (sandbox/egress.py), without Docker.

Parsing, matching and address classification are pure functions. The end-to-end tests run the
real proxy in a thread on 127.0.0.1 with a real HTTP server and a real TCP echo server behind
it; ``--test-allow-network 127.0.0.0/8`` is what lets it reach them. Nothing is sent anywhere
but 127.0.0.1: refused names are refused before any resolution. Synchronisation is by sockets
and conditions, never sleeps. One test runs the script the way the container does
(``python3 -I -S egress.py``) to prove it needs nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import http.server
import io
import ipaddress
import json
import selectors
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from sandbox import egress
from sandbox.egress import Allowlist, EgressProxy, Entry, address_refusal, check_address

SCRIPT = Path(egress.__file__).resolve()
TIMEOUT = 5.0


# --- pure parsing and matching ---------------------------------------------------------------

@pytest.mark.parametrize(("text", "canonical"), [
    ("api.github.com", "api.github.com"),
    ("API.GitHub.com.", "api.github.com"),
    ("api.github.com:443", "api.github.com:443"),
    ("*.PyPI.org", "*.pypi.org"),
    ("*.pypi.org.:8443", "*.pypi.org:8443"),
    ("localhost", "localhost"),
    ("my_host.internal", "my_host.internal"),
    ("10.0.0.1", "10.0.0.1"),
    ("8.8.8.8:53", "8.8.8.8:53"),
    ("[::1]:8080", "[::1]:8080"),
    ("[2001:DB8:0::1]", "2001:db8::1"),
    ("2001:db8::1", "2001:db8::1"),
])
def test_valid_entries_are_normalised(text: str, canonical: str) -> None:
    assert str(Entry.parse(text)) == canonical


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty"),
    (" a.com", "whitespace"),
    ("a.com:", "bad port"),
    ("a.com:0", "bad port"),
    ("a.com:65536", "bad port"),
    ("a.com:https", "bad port"),
    ("*", "wildcard must be '*.'"),
    ("*example.com", "wildcard must be '*.'"),
    ("a.*.com", "wildcard must be '*.'"),
    ("*.*.com", "wildcard must be '*.'"),
    ("*.", "empty host"),
    ("*.10.0.0.1", "not an IP address"),
    ("bücher.de", "non-ASCII"),
    ("exa mple.com", "invalid host name"),
    ("-a.com", "invalid host name"),
    ("a..com", "invalid host name"),
    ("a.com:80:90", "invalid host name"),
    ("[1.2.3.4]:80", "brackets must hold an IPv6"),
    ("[::1:80", "bad bracketed"),
    ("127.1", "neither an IP address nor a host name"),
    ("1.2.3.04", "neither an IP address nor a host name"),
])
def test_invalid_entries_are_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid allowlist entry") as info:
        Allowlist.parse(["ok.example.com", text])
    assert message in str(info.value)
    assert repr(text) in str(info.value)


ALLOWLIST = Allowlist.parse(["api.github.com:443", "*.pypi.org", "example.net", "10.0.0.1", "[::1]:8080",
                             "8.8.8.8:53"])


@pytest.mark.parametrize(("host", "port", "allowed"), [
    ("api.github.com", 443, True),
    ("API.GitHub.COM.", 443, True),
    ("api.github.com", 80, False),          # an explicit port allows only that port
    ("files.pypi.org", 443, True),
    ("a.b.c.pypi.org", 80, True),           # wildcards match any depth
    ("pypi.org", 443, False),               # ... but not the apex
    ("evilpypi.org", 443, False),
    ("files.pypi.org", 8080, False),        # no port in the entry: 80 and 443 only
    ("example.net", 80, True),
    ("example.net.", 443, True),
    ("example.net", 22, False),
    ("www.example.net", 443, False),        # an exact name does not cover subdomains
    ("10.0.0.1", 80, True),                 # listed literal (the address check refuses it later)
    ("10.0.0.2", 80, False),
    ("::1", 8080, True),
    ("[0:0::1]", 8080, True),               # literals compare after normalising
    ("::1", 443, False),
    ("8.8.8.8", 53, True),
    ("8.8.8.8", 443, False),
    ("8.8.4.4", 53, False),
    ("example.org", 443, False),
])
def test_allowlist_matching(host: str, port: int, allowed: bool) -> None:
    assert (ALLOWLIST.permits(host, port) is None) is allowed


def test_refusal_reasons_name_the_problem_and_the_allowlist() -> None:
    listed = "api.github.com:443, *.pypi.org, example.net, 10.0.0.1, [::1]:8080, 8.8.8.8:53"
    assert ALLOWLIST.permits("example.org", 443) == f"not in this sandbox's allowlist (allowed: {listed})"
    assert "port 8080 is not allowed for files.pypi.org" in str(ALLOWLIST.permits("files.pypi.org", 8080))
    assert "80 and 443 only" in str(ALLOWLIST.permits("files.pypi.org", 8080))
    assert "IP addresses must be listed exactly" in str(ALLOWLIST.permits("10.0.0.2", 80))
    assert "invalid host name" in str(ALLOWLIST.permits("bad host", 80))
    assert Allowlist.parse([]).permits("example.org", 443) == "not in this sandbox's allowlist (allowed: nothing)"


# --- address classification ------------------------------------------------------------------

@pytest.mark.parametrize(("address", "refusal"), [
    ("127.0.0.1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),
    ("100.64.0.1", "100.64.0.0/10"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("255.255.255.255", "private"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"),       # IPv4-mapped: the IPv4 address is what counts
    ("::ffff:10.0.0.1", "private"),
    ("2002:a00:1::", "embedded"),           # 6to4 around 10.0.0.1
    ("64:ff9b::a9fe:a9fe", "embedded"),     # NAT64 around 169.254.169.254
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("2001:4860:4860::8888", None),
    ("::ffff:8.8.8.8", None),
])
def test_address_classification(address: str, refusal: str | None) -> None:
    why = address_refusal(ipaddress.ip_address(address))
    assert why is None if refusal is None else refusal in str(why)
    assert (check_address(ipaddress.ip_address(address)).refusal is None) is (refusal is None)


def test_the_test_override_allows_exactly_its_own_network() -> None:
    net = ipaddress.ip_network("127.0.0.0/8")
    for inside in ("127.0.0.1", "127.255.255.255", "::ffff:127.0.0.2"):
        verdict = check_address(ipaddress.ip_address(inside), net)
        assert verdict.refusal is None
        assert verdict.test_override
        assert verdict.address.version == 4      # mapped addresses are unwrapped for the connection
    for outside in ("128.0.0.1", "10.0.0.1", "::1", "::7f00:1", "169.254.169.254"):
        verdict = check_address(ipaddress.ip_address(outside), net)
        assert not verdict.test_override
        assert (verdict.refusal is None) is (outside == "128.0.0.1")


# --- end to end, in-process ------------------------------------------------------------------

class Log:
    """An injectable log sink that tests can wait on."""

    def __init__(self) -> None:
        self.records: list[dict[str, object]] = []
        self.cond = threading.Condition()

    def __call__(self, record: dict[str, object]) -> None:
        json.dumps(record)  # what the real sink does; must not fail
        with self.cond:
            self.records.append(record)
            self.cond.notify_all()

    def of(self, event: str) -> list[dict[str, object]]:
        with self.cond:
            return [r for r in self.records if r["event"] == event]

    def wait_for(self, event: str, count: int) -> list[dict[str, object]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.of(event)) >= count, TIMEOUT), self.records
            return self.of(event)


class Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str], bytes]]

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        reply = b"hello from upstream " + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        self.request.sendall(b"<eof>")  # after the client's half-close: the other direction still works


@pytest.fixture
def servers() -> Iterator[tuple[int, int, list[tuple[str, dict[str, str], bytes]]]]:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    handler = type("Handler", (Upstream,), {"seen": seen})
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in (web, echo)]
    for thread in threads:
        thread.start()
    yield web.server_address[1], echo.server_address[1], seen
    for server in (web, echo):
        server.shutdown()
        server.server_close()


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., tuple[tuple[str, int], Log]]]:
    running: list[tuple[EgressProxy, threading.Thread]] = []

    def start(*allow: str, override: str | None = "127.0.0.0/8", **config: object) -> tuple[tuple[str, int], Log]:
        argv = ["--listen", "127.0.0.1:0", "--sandbox-id", "sb-test"] + [f"--allow={a}" for a in allow]
        if override:
            argv += ["--test-allow-network", override]
        log = Log()
        proxy = EgressProxy(dataclasses.replace(egress.parse_args(argv), **config), log=log)  # type: ignore[arg-type]
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        running.append((proxy, thread))
        return proxy.address, log

    yield start
    for proxy, thread in running:
        proxy.stop()
        thread.join(TIMEOUT)
        proxy.close()
        assert not thread.is_alive()


def exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data``, read until the proxy closes."""
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1)
        assert chunk, data
        data += chunk
    return data


def body_of(response: bytes) -> str:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"\r\nContent-Type: text/plain\r\n" in head and b"\r\nConnection: close" in head
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    return body.decode()


def check_decision(record: dict[str, object], **expected: object) -> None:
    assert set(record) == {"ts", "event", "sandbox_id", "decision", "status", "method", "host", "port", "address",
                           "reason", "client", "test_override"}
    assert isinstance(record["ts"], float)
    assert record["sandbox_id"] == "sb-test"
    assert record["client"] == "127.0.0.1"
    assert record["event"] == "decision"
    for key, value in expected.items():
        assert record[key] == value, (key, record)


def test_forward_request_reaches_the_server_in_origin_form(servers, start_proxy) -> None:
    web_port, _, seen = servers
    address, log = start_proxy(f"localhost:{web_port}")
    response = exchange(address, (
        f"GET http://LOCALHOST.:{web_port}/path/x?q=1&r=2#frag HTTP/1.1\r\n"
        "Host: evil.example\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\n"
        "Keep-Alive: timeout=5\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Keep: yes\r\n\r\n").encode())
    assert response.startswith(b"HTTP/1.0 200 ")
    assert response.endswith(b"hello from upstream ")
    [(path, headers, _)] = seen
    assert path == "/path/x?q=1&r=2"
    assert headers["connection"] == "close"
    assert headers["host"] == f"localhost:{web_port}"  # from the URL, so the Host header cannot pick another site
    assert headers["x-keep"] == "yes"
    assert not {"proxy-connection", "proxy-authorization", "keep-alive", "x-hop"} & set(headers)
    [decision] = log.of("decision")
    check_decision(decision, decision="allow", status=200, method="GET", host="localhost", port=web_port,
                   address="127.0.0.1", reason=None, test_override=True)
    [close] = log.wait_for("close", 1)
    assert close["bytes_down"] == len(response)
    assert isinstance(close["bytes_up"], int) and close["bytes_up"] > 0


def test_forward_request_body_is_spliced_through(servers, start_proxy) -> None:
    web_port, _, seen = servers
    address, _ = start_proxy(f"localhost:{web_port}")
    head = f"POST http://localhost:{web_port}/submit HTTP/1.1\r\nHost: localhost\r\nContent-Length: 9\r\n\r\n"
    response = exchange(address, head.encode() + b"some body")
    assert response.endswith(b"hello from upstream some body")
    assert seen[0][0] == "/submit" and seen[0][2] == b"some body"


def test_connect_tunnels_both_ways_with_half_close(servers, start_proxy) -> None:
    _, echo_port, _ = servers
    address, log = start_proxy(f"localhost:{echo_port}")
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        sock.sendall(f"CONNECT localhost:{echo_port} HTTP/1.1\r\nHost: localhost:{echo_port}\r\n\r\nearly|".encode())
        assert read_head(sock) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        sock.sendall(b"ping")
        received = b""
        while len(received) < len(b"early|ping"):
            received += sock.recv(65536)
        sock.shutdown(socket.SHUT_WR)
        received += read_all(sock)
    assert received == b"early|ping<eof>"
    [decision] = log.of("decision")
    check_decision(decision, decision="allow", status=200, method="CONNECT", host="localhost", port=echo_port,
                   address="127.0.0.1", reason=None, test_override=True)
    [close] = log.wait_for("close", 1)
    assert (close["bytes_up"], close["bytes_down"]) == (len(b"early|ping"), len(b"early|ping<eof>"))
    assert close["host"] == "localhost" and close["sandbox_id"] == "sb-test"


def test_unlisted_host_is_refused_with_the_reason(servers, start_proxy) -> None:
    _, echo_port, _ = servers
    address, log = start_proxy(f"localhost:{echo_port}", "*.pypi.org")
    response = exchange(address, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert body_of(response) == ("callbox egress proxy refused example.org:443: not in this sandbox's allowlist "
                                 f"(allowed: localhost:{echo_port}, *.pypi.org)\n")
    [decision] = log.of("decision")
    check_decision(decision, decision="deny", status=403, method="CONNECT", host="example.org", port=443,
                   address=None, test_override=False)
    assert "not in this sandbox's allowlist" in str(decision["reason"])


def test_listed_name_resolving_to_loopback_is_refused_without_the_override(servers, start_proxy) -> None:
    web_port, _, seen = servers
    address, log = start_proxy(f"localhost:{web_port}", override=None)
    response = exchange(address, f"GET http://localhost:{web_port}/ HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.1 403 ")
    assert (f"refused localhost:{web_port}: localhost resolves to 127.0.0.1, which is a loopback address"
            in body_of(response))
    assert not seen
    check_decision(log.of("decision")[0], decision="deny", status=403, method="GET", address="127.0.0.1")


def test_ip_literals_must_be_listed_and_globally_routable(servers, start_proxy) -> None:
    _, echo_port, _ = servers
    address, log = start_proxy(f"localhost:{echo_port}", f"127.0.0.1:{echo_port}", "10.0.0.1:80",
                               override="127.0.0.1/32")
    response = exchange(address, f"CONNECT 127.0.0.2:{echo_port} HTTP/1.1\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.1 403 ")
    assert "IP addresses must be listed exactly" in body_of(response)
    response = exchange(address, b"CONNECT 10.0.0.1:80 HTTP/1.1\r\n\r\n")   # listed, but private: never dialled
    assert body_of(response) == ("callbox egress proxy refused 10.0.0.1:80: 10.0.0.1 is a private address; "
                                 "only globally routable addresses are allowed\n")
    with socket.create_connection(address, timeout=TIMEOUT) as sock:   # listed and inside the override
        sock.sendall(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\n".encode())
        assert read_head(sock) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    decisions = log.wait_for("decision", 3)
    assert [(d["decision"], d["address"]) for d in decisions] == [
        ("deny", None), ("deny", "10.0.0.1"), ("allow", "127.0.0.1")]


@pytest.mark.parametrize(("request_bytes", "message"), [
    (b"GET https://localhost/ HTTP/1.1\r\nHost: localhost\r\n\r\n", "use CONNECT for https"),
    (b"GET ftp://localhost/ HTTP/1.1\r\n\r\n", "ftp:// URLs cannot be forwarded"),
    (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "send absolute-form requests"),
    (b"hello there\r\n\r\n", "malformed request line"),
    (b"GET http://localhost/ HTTP/2.0\r\n\r\n", "malformed request line"),
    (b"CONNECT localhost HTTP/1.1\r\n\r\n", "CONNECT needs host:port"),
    (b"GET http://user:pw@localhost/ HTTP/1.1\r\n\r\n", "credentials"),
    (b"GET http://localhost/ HTTP/1.1\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "not an HTTP request"),  # TLS, no head end: answered at once
])
def test_malformed_or_unsupported_requests_get_400(start_proxy, request_bytes: bytes, message: str) -> None:
    address, log = start_proxy("localhost:80")
    response = exchange(address, request_bytes)
    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert body_of(response).startswith("callbox egress proxy: bad request: ")
    assert message in body_of(response)
    [decision] = log.of("decision")
    check_decision(decision, decision="deny", status=400)


def test_oversized_head_gets_431(start_proxy) -> None:
    address, log = start_proxy("localhost:80")
    response = exchange(address, b"GET http://localhost/ HTTP/1.1\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 431 ")
    assert log.of("decision")[0]["status"] == 431


def test_a_slow_request_head_gets_408(start_proxy) -> None:
    address, log = start_proxy("localhost:80", head_timeout=0.2)
    response = exchange(address, b"GET http://localhost/ HTTP/1.1\r\nHost: loc")   # never finished
    assert response.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert "timed out waiting for the request head" in body_of(response)
    check_decision(log.of("decision")[0], decision="deny", status=408, method=None, host=None)


def test_upstream_connect_failure_gets_502(start_proxy) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        closed_port = placeholder.getsockname()[1]
    address, log = start_proxy(f"localhost:{closed_port}")
    response = exchange(address, f"CONNECT localhost:{closed_port} HTTP/1.1\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert body_of(response).startswith(f"callbox egress proxy could not reach localhost:{closed_port}: cannot connect")
    check_decision(log.of("decision")[0], decision="deny", status=502, address="127.0.0.1")


def test_connections_beyond_the_limit_get_503(servers, start_proxy) -> None:
    _, echo_port, _ = servers
    address, log = start_proxy(f"localhost:{echo_port}", max_clients=1)
    with socket.create_connection(address, timeout=TIMEOUT) as held:
        held.sendall(f"CONNECT localhost:{echo_port} HTTP/1.1\r\n\r\n".encode())
        assert read_head(held).startswith(b"HTTP/1.1 200 ")   # the one slot is now in use
        response = exchange(address, f"CONNECT localhost:{echo_port} HTTP/1.1\r\n\r\n".encode())
        assert response.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert body_of(response) == "callbox egress proxy is busy: more than 1 open connections\n"
    log.wait_for("close", 1)
    response = exchange(address, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")  # the slot is free again
    assert response.startswith(b"HTTP/1.1 403 ")


def test_json_lines_sink_writes_one_flushed_line_per_record() -> None:
    stream = io.StringIO()
    sink = egress.json_lines(stream)
    sink({"event": "decision", "host": "a"})
    sink({"event": "close", "bytes_up": 1})
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == [
        {"event": "decision", "host": "a"}, {"event": "close", "bytes_up": 1}]


def test_usage_errors_return_2(capsys) -> None:
    assert egress.main(["--sandbox-id", "x", "--allow", "*bad.example"]) == 2
    assert "invalid allowlist entry '*bad.example': a wildcard must be" in capsys.readouterr().err
    assert egress.main(["--sandbox-id", "x", "--listen", "nowhere"]) == 2
    assert egress.main(["--sandbox-id", "x", "--test-allow-network", "10.0.0.1/8"]) == 2
    assert egress.main(["--allow", "a.com"]) == 2                  # --sandbox-id is required
    assert capsys.readouterr().out == ""


# --- the script as the container runs it -----------------------------------------------------

def run_script(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-I", "-S", str(SCRIPT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd="/")


def read_line(stream: IO[str]) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        assert sel.select(TIMEOUT), "no line within the timeout"
    return stream.readline()


def test_script_runs_standalone_and_stops_on_sigterm() -> None:
    proc = run_script("--listen", "127.0.0.1:0", "--sandbox-id", "sb-script", "--allow", "localhost:1")
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = read_line(proc.stderr)
        assert line.startswith("egress proxy for sandbox sb-script listening on 127.0.0.1:"), line
        port = int(line.split("listening on 127.0.0.1:")[1].split()[0])
        response = exchange(("127.0.0.1", port), b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
        assert response.startswith(b"HTTP/1.1 403 ")
        record = json.loads(read_line(proc.stdout))
        assert record["event"] == "decision" and record["decision"] == "deny"
        assert record["sandbox_id"] == "sb-script" and record["host"] == "example.org"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
        assert proc.stdout.read() == ""                           # nothing on stdout but decisions
    finally:
        proc.kill()
        proc.communicate()


def test_script_rejects_bad_entries_and_a_busy_address() -> None:
    proc = run_script("--sandbox-id", "x", "--allow", "api.github.com:99999")
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 2 and out == ""
    assert "invalid allowlist entry 'api.github.com:99999': bad port" in err
    with socket.create_server(("127.0.0.1", 0)) as busy:
        proc = run_script("--listen", f"127.0.0.1:{busy.getsockname()[1]}", "--sandbox-id", "x",
                          "--test-allow-network", "127.0.0.0/8")
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1 and out == ""
    assert "WARNING: --test-allow-network 127.0.0.0/8" in err
    assert "cannot listen on 127.0.0.1:" in err and "in use" in err


def test_expiry_file_semantics(tmp_path) -> None:
    from sandbox.egress import expired

    path = tmp_path / "expires"
    assert not expired(str(path))  # missing: never
    path.write_text("garbage\n")
    assert not expired(str(path))  # unreadable: never
    path.write_text("1000\n")
    assert expired(str(path), now=1000.0) and not expired(str(path), now=999.0)


def test_the_proxy_stops_itself_when_its_sandbox_expires(tmp_path) -> None:
    import threading as _threading

    from sandbox.egress import Allowlist, Config, EgressProxy, _stop_when_expired

    proxy = EgressProxy(Config(listen=("127.0.0.1", 0), sandbox_id="x", allowlist=Allowlist.parse([])),
                        log=lambda record: None)
    path = tmp_path / "expires"
    path.write_text("9999999999\n")  # far future: keeps serving
    served = _threading.Thread(target=proxy.serve_forever)
    served.start()
    watcher = _threading.Thread(target=_stop_when_expired, args=(proxy, str(path), 0.01), daemon=True)
    watcher.start()
    try:
        assert served.is_alive()
        path.write_text("1\n")  # moved into the past, as the engine would
        served.join(timeout=10)
        assert not served.is_alive()
    finally:
        proxy.stop()
        served.join(timeout=10)
        proxy.close()
