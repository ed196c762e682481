"""The egress proxy of the ``allowlist`` network mode: one per sandbox, standard library only.

The engine runs it in its own container, the only peer the sandbox's internal network reaches::

    python3 -I -S egress.py --listen 0.0.0.0:3128 --sandbox-id ID [--allow HOST[:PORT]]... [--rules-file FILE]
        [--test-allow-network CIDR]

Besides the standard library it imports only ``sandbox.egress_policy`` (what may be reached; standard
library only too), never ``harness``. Requests it understands:

- ``CONNECT host:port HTTP/1.x``: answered ``200 Connection established``, then bytes are spliced both
  ways (half-close aware) until both sides close or nothing moves for 300 s;
- absolute-form ``METHOD http://host[:port]/path HTTP/1.x``: sent upstream in origin form (``/path?q``)
  without ``Proxy-Connection``, ``Proxy-Authorization``, ``Connection``, ``Keep-Alive`` (and what
  ``Connection`` names), with ``Host`` set from the URL (RFC 9112 3.2.2) and ``Connection: close``;
  the body and the response are spliced through. ``https://`` URLs must use CONNECT.

Allowlist entries (``--allow``, repeatable): ``host``, ``host:port``, ``*.example.com[:port]``, an IPv4
literal, ``[v6]:port`` or a bare IPv6 literal. Names are case-insensitive and a trailing dot is ignored.
``*.example.com`` matches subdomains at any depth but not ``example.com`` itself. **An entry without a port
allows ports 80 and 443 only.** An IP literal in a request must be listed exactly, or lie in a listed CIDR
network (``10.1.0.0/16``, ``[2001:db8::/32]:443``); a name matches a CIDR entry when every address it resolves
to lies in it (so such a name is resolved before it is allowed or refused).

``--rules-file FILE`` narrows the allowlist while the proxy runs: a JSON object ``{"allow": [...], "deny":
[...]}`` of entries in the same syntax (see ``sandbox.egress_policy.Rules``: allow wins over deny, a destination
neither names is allowed, a portless deny entry denies every port, ``0.0.0.0/0`` denies everything). The proxy
looks at the file (one ``stat``) before each request and reads it again when it changed, so a new rule applies
to the next request; connections already open go on. No file: no narrowing; a file it cannot read or parse
refuses every request until it is fixed (fail closed).

An entry may carry an action (``ask *.example.com``, ``deny 10.0.0.0/8``; then the first entry that matches
decides, see ``sandbox.egress_policy``). A connection an ``ask`` entry names is held, once its addresses passed
the check below, until the harness answers through files beside the rules file (``sandbox.egress_hold``:
``hold`` and ``answer`` lines in the log, ``--ask-timeout`` seconds at most); refused, it gets a 403 naming the
approval and who answered.

The proxy resolves names itself; if any resolved address is not globally routable (loopback, private,
link-local incl. 169.254.169.254, 100.64.0.0/10, multicast, unspecified, reserved; IPv4-mapped IPv6 is
unwrapped) the request is refused, listed literals included. It connects only to the addresses it checked.
``--test-allow-network CIDR`` exempts one network from that check: for tests only, announced on stderr.

Answers: 200 (CONNECT), the upstream's response (forward), 400 malformed or unsupported, 403 refused,
408 request head not complete within 30 s, 431 head over 16 KiB, 502 resolution or connection failure,
503 more than 128 open connections. Errors are ``text/plain``, one line, ``Connection: close``.

stdout carries only JSON lines, one per decision and one when an allowed connection closes (a connection
closed before sending a byte is not logged); ``test_override`` is true when only ``--test-allow-network``
let the connected address through::

    {"ts": 1.0, "event": "decision", "sandbox_id": "...", "decision": "allow"|"deny", "status": 200,
     "method": "CONNECT", "host": "...", "port": 443, "address": "1.2.3.4"|null, "reason": null|"...",
     "client": "10.0.0.2", "test_override": false}
    {"ts": 2.0, "event": "close", "sandbox_id": "...", "method": ..., "host": ..., "port": ..., "address": ...,
     "client": ..., "bytes_up": 10, "bytes_down": 20, "duration_s": 1.0}

With ``--log FILE`` the same lines are also appended to FILE (flushed before the client gets its answer).

Exit codes: 0 on SIGTERM/SIGINT, 1 when the listen address cannot be bound or the log cannot be opened,
2 for usage errors.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TextIO

if not __package__:
    # Run as a script (``python3 -I -S .../sandbox/egress.py``, as in the proxy's container): -I keeps the
    # script's directory off sys.path, so add the directory holding the ``sandbox`` package, last, where it
    # shadows nothing of the standard library.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.egress_hold import Holds
from sandbox.egress_policy import (
    ASK,
    DEFAULT_PORTS,
    UNRESOLVED,
    Allowlist,
    Entry,
    IPAddress,
    IPNetwork,
    Rules,
    Verdict,
    address_refusal,
    check_address,
    hostport,
    ip_literal,
    normalize_host,
    parse_port,
    split_host_port,
)

__all__ = [
    "DEFAULT_PORTS",
    "Allowlist",
    "Config",
    "EgressProxy",
    "Entry",
    "Refusal",
    "Rules",
    "Verdict",
    "address_refusal",
    "check_address",
    "expired",
    "hostport",
    "json_lines",
    "main",
    "normalize_host",
    "parse_args",
    "parse_port",
    "read_rules",
    "split_host_port",
]

LogSink = Callable[[dict[str, object]], None]

_TCHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_REQUEST_LINE = re.compile(rf"({_TCHARS}) (\S+) (HTTP/1\.[01])")
_HEADER = re.compile(rf"({_TCHARS}):[ \t]*(.*?)[ \t]*")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_NOT_TEXT = re.compile(rb"[^\x20-\x7e\t\r]")
_HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "host"}
_PHRASES = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            502: "Bad Gateway", 503: "Service Unavailable"}


class Refusal(Exception):
    def __init__(self, status: int, reason: str, address: IPAddress | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.address = status, reason, address


EXPIRY_CHECK_S = 5.0
"""How often the proxy reads its expiry file (the agent checks its own the same way)."""


@dataclass(frozen=True)
class Config:
    listen: tuple[str, int]
    sandbox_id: str
    allowlist: Allowlist
    test_network: IPNetwork | None = None
    max_clients: int = 128
    head_limit: int = 16 * 1024
    head_timeout: float = 30.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    log_file: str | None = None
    """Also append the JSON lines here (the engine reads this file: written before the
    client gets its answer, unlike container stdout, which the engine sees later)."""
    expires_file: str | None = None
    """A file holding the Unix time after which the proxy stops on its own (its sandbox's
    expiry, which the engine may move later); missing or unreadable: never."""
    rules_file: str | None = None
    """The sandbox's narrowing of ``allowlist`` (JSON ``{"allow": [...], "deny": [...]}``),
    read again whenever it changes (:func:`read_rules`)."""
    ask_timeout: float = 120.0
    """Seconds a connection to an ``ask`` entry waits for an answer (:mod:`sandbox.egress_hold`,
    whose files live beside the rules file)."""


def read_rules(ceiling: Allowlist, path: str) -> Rules:
    """The rules of ``ceiling`` narrowed by the JSON file at ``path``: none if it does not
    exist; ``broken`` (refuse everything) if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return Rules(ceiling)
    except (OSError, ValueError) as exc:
        return Rules(ceiling, broken=f"the sandbox's network rules cannot be read ({exc}); everything is refused")
    try:
        if not isinstance(data, dict) or set(data) - {"allow", "deny"}:
            raise ValueError('expected {"allow": [...], "deny": [...]}')
        lists = [data.get(key) or [] for key in ("allow", "deny")]
        if not all(isinstance(items, list) and all(isinstance(i, str) for i in items) for items in lists):
            raise ValueError("allow and deny must be lists of strings")
        return Rules(ceiling, Allowlist.parse(lists[0]), Allowlist.parse(lists[1]))
    except ValueError as exc:
        return Rules(ceiling, broken=f"the sandbox's network rules are invalid ({exc}); everything is refused")


@dataclass
class _Request:
    client: str
    method: str | None = None
    host: str | None = None
    port: int | None = None
    address: IPAddress | None = None
    head: bytes = b""  # what to send upstream first (the rewritten head for forward requests)
    note: str | None = None  # who let it through, when a person was asked
    counts: list[int] = field(default_factory=lambda: [0, 0])  # bytes up, bytes down


def json_lines(stream: TextIO) -> LogSink:
    """A log sink writing each record as one JSON line, flushed immediately."""
    lock = threading.Lock()

    def write(record: dict[str, object]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with lock, suppress(OSError, ValueError):
            stream.write(line)
            stream.flush()
    return write


def _read_head(conn: socket.socket, limit: int, timeout: float) -> tuple[bytes, bytes] | None:
    """(head, bytes after it) or None if the client closed without a byte; the timeout is for the whole head."""
    buf, deadline = b"", time.monotonic() + timeout
    while not (end := _HEAD_END.search(buf)):
        if len(buf) > limit:
            raise Refusal(431, f"request head larger than {limit} bytes")
        if _NOT_TEXT.search(buf.split(b"\n", 1)[0]):
            raise Refusal(400, "not an HTTP request (binary data; is TLS being sent to the proxy directly?)")
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = conn.recv(8192)
        except TimeoutError:
            raise Refusal(408, "timed out waiting for the request head") from None
        if not chunk:
            if buf:
                raise Refusal(400, "connection closed before the request head was complete")
            return None
        buf += chunk
    if end.end() > limit:
        raise Refusal(431, f"request head larger than {limit} bytes")
    return buf[: end.end()], buf[end.end() :]


def _parse_head(head: bytes, req: _Request) -> None:
    """Fill ``req`` from the request head; raise Refusal(400) for anything but CONNECT or http:// forwarding."""
    line, *lines = re.split(r"\r?\n", head.decode("latin-1").rstrip("\r\n"))
    if not (match := _REQUEST_LINE.fullmatch(line)):
        raise Refusal(400, "malformed request line (expected CONNECT host:port HTTP/1.1 or GET http://host/ HTTP/1.1)")
    req.method, target, version = match.groups()
    try:
        if req.method == "CONNECT":
            host, port = split_host_port(target)
            if port is None:
                raise ValueError("CONNECT needs host:port")
            req.host, req.port = normalize_host(host), port
            return
        if not (url := re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)([^#]*)(#.*)?", target)):
            raise ValueError("this is an egress proxy: send absolute-form requests (GET http://host/path) "
                             "or CONNECT host:port")
        scheme, authority, path = url.group(1).lower(), url.group(2), url.group(3) or "/"
        if scheme != "http":
            raise ValueError(f"{scheme}:// URLs cannot be forwarded; use CONNECT for https (and other protocols)")
        if "@" in authority:
            raise ValueError("credentials in the URL are not supported")
        host, port = split_host_port(authority)
        req.host, req.port = normalize_host(host), port or 80
        host_header = hostport(req.host, port) if port else f"[{req.host}]" if ":" in req.host else req.host
    except ValueError as exc:
        raise Refusal(400, str(exc)) from None
    headers, drop = [], set(_HOP_BY_HOP)
    for text in lines:
        if not (header := _HEADER.fullmatch(text)):
            raise Refusal(400, "malformed header line")
        headers.append(header.groups())
        if header.group(1).lower() in ("connection", "proxy-connection"):
            drop.update(token.strip().lower() for token in header.group(2).split(","))
    kept = [f"{name}: {value}\r\n" for name, value in headers if name.lower() not in drop]
    start = f"{req.method} {path if path.startswith('/') else '/' + path} {version}\r\nHost: {host_header}\r\n"
    req.head = (start + "".join(kept) + "Connection: close\r\n\r\n").encode("latin-1")


def _respond(conn: socket.socket, status: int, body: str, drain: bool = True) -> None:
    data = body.encode("ascii", "backslashreplace")
    head = f"HTTP/1.1 {status} {_PHRASES[status]}\r\nContent-Type: text/plain\r\n" \
           f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    with suppress(OSError):
        conn.sendall(head.encode() + data)
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 2.0  # drain what the client still sends: closing on unread data resets
        while drain and (left := deadline - time.monotonic()) > 0:  # the connection and can lose the answer
            conn.settimeout(left)
            if not conn.recv(65536):
                break


class EgressProxy:
    """Listens on ``config.listen``; ``serve_forever()`` until ``stop()`` (thread- and signal-safe)."""

    def __init__(self, config: Config, log: LogSink | None = None) -> None:
        self.config, self.log = config, log or json_lines(sys.stdout)
        host = config.listen[0].strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, config.listen[1]), family=family, backlog=128)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._slots = threading.BoundedSemaphore(config.max_clients)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._rules_lock = threading.Lock()
        self._rules = Rules(config.allowlist)
        self._rules_stamp: tuple[int, int, int] | None = (-2, -2, -2)  # not read yet
        self.holds = Holds(config.rules_file and os.path.dirname(config.rules_file), self.log, config.sandbox_id,
                           config.ask_timeout)

    def rules(self) -> Rules:
        """The rules now: the allowlist, narrowed by the rules file as it is now (read again
        only when its inode, size or modification time changed)."""
        path = self.config.rules_file
        if path is None:
            return self._rules
        try:
            st = os.stat(path)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError:
            stamp = (-1, -1, -1)
        with self._rules_lock:
            if stamp != self._rules_stamp:
                first = self._rules_stamp == (-2, -2, -2)
                self._rules, self._rules_stamp = read_rules(self.config.allowlist, path), stamp
                if not first or self._rules.broken:
                    print(f"callbox egress proxy: rules now {self._rules.broken or self._rules}",
                          file=sys.stderr, flush=True)
            return self._rules

    def serve_forever(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                if not any(key.fileobj is self._listener for key, _ in sel.select()):
                    continue
                try:
                    conn, peer = self._listener.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms waits on small writes
                except OSError:
                    continue
                req = _Request(client=str(peer[0]))
                if not self._slots.acquire(blocking=False):
                    conn.settimeout(0.5)
                    self._deny(conn, req, Refusal(503, f"more than {self.config.max_clients} open connections"))
                    conn.close()
                    continue
                try:
                    threading.Thread(target=self._handle, args=(conn, req), daemon=True).start()
                except RuntimeError:  # no thread to be had: drop this connection, keep serving
                    conn.close()
                    self._slots.release()

    def stop(self) -> None:
        self._stopping = True
        with suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            with suppress(OSError):
                os.close(fd)
        self._listener.close()

    def _record(self, event: str, req: _Request, **fields: object) -> None:
        self.log({"ts": time.time(), "event": event, "sandbox_id": self.config.sandbox_id, **fields,
                  "method": req.method, "host": req.host, "port": req.port,
                  "address": None if req.address is None else str(req.address), "client": req.client})

    def _deny(self, conn: socket.socket, req: _Request, refusal: Refusal) -> None:
        """Log the refusal and answer it (no draining for 503, which is sent from the accept loop)."""
        req.address = refusal.address or req.address
        self._record("decision", req, decision="deny", status=refusal.status, reason=refusal.reason,
                     test_override=False)
        target = "" if req.host is None or req.port is None else hostport(req.host, req.port)
        lead = {403: "refused", 502: "could not reach", 503: "is busy"}.get(refusal.status)
        first = f"callbox egress proxy {lead} {target}".rstrip() if lead else "callbox egress proxy: bad request"
        _respond(conn, refusal.status, f"{first}: {refusal.reason}\n", drain=refusal.status != 503)

    def _handle(self, conn: socket.socket, req: _Request) -> None:
        spliced_s: float | None = None
        try:
            try:
                upstream, rest, override = self._open(conn, req)
            except Refusal as refusal:
                return self._deny(conn, req, refusal)
            except Exception as exc:  # a bug must not take the proxy down; the client still gets an answer
                print(f"callbox egress proxy: internal error: {exc!r}", file=sys.stderr, flush=True)
                return self._deny(conn, req, Refusal(502, "internal proxy error"))
            if upstream is None:
                return None
            self._record("decision", req, decision="allow", status=200, reason=req.note, test_override=override)
            started = time.monotonic()
            with upstream:
                self._splice(conn, upstream, req, rest)
            spliced_s = time.monotonic() - started
        finally:
            conn.close()
            self._slots.release()
        # Logged once the slot is free again, so whoever reads the close can connect at once.
        self._record("close", req, bytes_up=req.counts[0], bytes_down=req.counts[1], duration_s=round(spliced_s, 3))
        return None

    def _open(self, conn: socket.socket, req: _Request) -> tuple[socket.socket | None, bytes, bool]:
        """Read, parse and check the request and connect upstream; (None, ...) if the client sent nothing."""
        if (got := _read_head(conn, self.config.head_limit, self.config.head_timeout)) is None:
            return None, b"", False
        head, rest = got
        _parse_head(head, req)
        assert req.host is not None and req.port is not None
        rules = self.rules()
        literal = ip_literal(req.host)
        addresses = [literal] if literal is not None else None
        # Names are resolved only once the rules allow them, or need their addresses to tell.
        why = rules.refusal(req.host, req.port, addresses)
        if why not in (None, UNRESOLVED, ASK):
            raise Refusal(403, str(why))
        if addresses is None:
            try:
                infos = socket.getaddrinfo(req.host, req.port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
            except (OSError, UnicodeError) as exc:
                raise Refusal(502, f"cannot resolve {req.host}: {getattr(exc, 'strerror', None) or exc}") from None
            addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0])) for info in infos))
        if why == UNRESOLVED and (why := rules.refusal(req.host, req.port, addresses)) not in (None, ASK):
            raise Refusal(403, str(why))
        verdicts = [check_address(addr, self.config.test_network) for addr in addresses]
        for addr, verdict in zip(addresses, verdicts, strict=True):
            if verdict.refusal:
                subject = str(addr) if literal is not None else f"{req.host} resolves to {addr}, which"
                raise Refusal(403, f"{subject} is {verdict.refusal}; only globally routable addresses are allowed",
                              addr)
        if why == ASK:  # a person decides, while the connection waits
            answer = self.holds.ask(conn, req.method or "", req.host, req.port, req.client)
            if answer.refusal is not None:
                raise Refusal(403, answer.refusal)
            req.note = answer.note
        failure = "no addresses"
        for verdict in verdicts:
            req.address = verdict.address
            family = socket.AF_INET6 if verdict.address.version == 6 else socket.AF_INET
            upstream = socket.socket(family, socket.SOCK_STREAM)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.settimeout(self.config.connect_timeout)
            try:
                upstream.connect((str(verdict.address), req.port))
            except OSError as exc:
                upstream.close()
                failure = f"cannot connect to {verdict.address}: {exc.strerror or exc}"
                continue
            return upstream, rest, verdict.test_override
        raise Refusal(502, failure)

    def _splice(self, conn: socket.socket, upstream: socket.socket, req: _Request, rest: bytes) -> None:
        last = [time.monotonic()]
        for sock in (conn, upstream):
            sock.settimeout(self.config.idle_timeout)

        def abort() -> None:
            for sock in (conn, upstream):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        def pump(src: socket.socket, dst: socket.socket, index: int) -> None:
            try:
                while True:
                    try:
                        data = src.recv(65536)
                    except TimeoutError:
                        if time.monotonic() - last[0] < self.config.idle_timeout:
                            continue
                        return abort()
                    if not data:
                        with suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        return None
                    last[0] = time.monotonic()
                    dst.sendall(data)
                    req.counts[index] += len(data)
            except OSError:
                return abort()

        try:
            if req.method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            upstream.sendall(req.head + rest)
            req.counts[0] += len(req.head + rest)
        except OSError:
            return abort()
        down = threading.Thread(target=pump, args=(upstream, conn, 1), daemon=True)
        down.start()
        pump(conn, upstream, 0)
        down.join()
        return None


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a Config; usage errors exit 2 with one line on stderr."""
    parser = argparse.ArgumentParser(prog="callbox-egress", description="callbox egress proxy (allowlist mode)")
    parser.add_argument("--listen", default="0.0.0.0:3128", help="HOST:PORT to listen on (port 0: any free port)")
    parser.add_argument("--sandbox-id", required=True, help="the sandbox this proxy serves (in every log line)")
    parser.add_argument("--allow", action="append", default=[], metavar="HOST[:PORT]",
                        help="allowlist entry, repeatable; without a port: 80 and 443 only")
    parser.add_argument("--test-allow-network", metavar="CIDR", help="TESTS ONLY: exempt CIDR from the address check")
    parser.add_argument("--log", metavar="FILE", help="also append the JSON lines to FILE")
    parser.add_argument("--rules-file", metavar="FILE",
                        help='narrow --allow by the JSON {"allow": [...], "deny": [...]} in FILE, read when it changes')
    parser.add_argument("--ask-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long a connection to an ask entry waits for an answer")
    parser.add_argument("--expires-file", metavar="FILE",
                        help="stop once the Unix time written in FILE has passed (checked every few seconds)")
    args = parser.parse_args(argv)
    try:
        allowlist = Allowlist.parse(args.allow)
    except ValueError as exc:
        parser.error(str(exc))
    host, _, port_text = args.listen.rpartition(":")
    if not host or not (port_text.isascii() and port_text.isdigit() and int(port_text) < 65536):
        parser.error(f"bad --listen {args.listen!r} (expected HOST:PORT; port 0 picks a free port)")
    network = None
    if args.test_allow_network is not None:
        try:
            network = ipaddress.ip_network(args.test_allow_network)
        except ValueError as exc:
            parser.error(f"bad --test-allow-network {args.test_allow_network!r}: {exc}")
    return Config(listen=(host, int(port_text)), sandbox_id=args.sandbox_id, allowlist=allowlist, test_network=network,
                  log_file=args.log, expires_file=args.expires_file, rules_file=args.rules_file,
                  ask_timeout=args.ask_timeout)


def expired(path: str, now: float | None = None) -> bool:
    """Whether the Unix time in ``path`` has passed; a missing or unreadable file never expires."""
    try:
        with open(path, encoding="ascii") as handle:
            expires = float(handle.read().strip() or "inf")
    except (OSError, ValueError):
        return False
    return (time.time() if now is None else now) >= expires


def _stop_when_expired(proxy: EgressProxy, path: str, interval: float = EXPIRY_CHECK_S) -> None:
    while not expired(path):
        time.sleep(interval)
    print(f"callbox egress proxy: the sandbox expired ({path}); stopping", file=sys.stderr, flush=True)
    proxy.stop()


def main(argv: list[str] | None = None, make: Callable[[Config, LogSink], EgressProxy] | None = None) -> int:
    try:
        config = parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if config.test_network is not None:
        print(f"WARNING: --test-allow-network {config.test_network}: destinations in it bypass the private/loopback "
              "address check. This is for tests only and must never be used for real sandboxes.", file=sys.stderr)
    for entry in config.allowlist.entries:
        literal = ip_literal(entry.host)
        if literal is not None and (why := check_address(literal, config.test_network).refusal):
            print(f"warning: --allow {entry} is {why}; requests to it will be refused", file=sys.stderr)
    sinks = [json_lines(sys.stdout)]
    if config.log_file is not None:
        try:
            sinks.append(json_lines(open(config.log_file, "a", buffering=1, encoding="utf-8")))  # noqa: SIM115
        except OSError as exc:
            print(f"callbox egress proxy: cannot open the log {config.log_file}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1

    def log(record: dict[str, object]) -> None:
        for sink in sinks:
            sink(record)

    try:
        proxy = (make or EgressProxy)(config, log)  # make: a proxy that does more (sandbox/egress_tls.py)
    except OSError as exc:
        print(f"callbox egress proxy: cannot listen on {hostport(*config.listen)}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: proxy.stop())
    if config.expires_file is not None:
        threading.Thread(target=_stop_when_expired, args=(proxy, config.expires_file), daemon=True).start()
    print(f"egress proxy for sandbox {config.sandbox_id} listening on {hostport(*proxy.address)} "
          f"({proxy.rules()})", file=sys.stderr, flush=True)
    try:
        proxy.serve_forever()
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
