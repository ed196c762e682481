"""The egress proxy of a sandbox with secrets: ``sandbox/egress.py`` plus TLS interception for
the hosts its secrets go to (standard library only). The engine runs this script instead::

    python3 -I -S egress_tls.py --secrets-file FILE [--test-extra-ca FILE] EGRESS_ARGUMENTS...

``--secrets-file``: the sandbox's secrets (:func:`sandbox.egress_secrets.load`: read and
removed before the proxy listens). ``--test-extra-ca FILE``: one more CA trusted for the real
hosts (and in the sandbox's bundle), for tests only, announced on stderr. The rest are
``egress.py``'s. Its proxy, :class:`SecretsProxy`, fills a secret into the head of a
plain-HTTP request to the secret's host, and opens a CONNECT to one (when
:meth:`SecretRules.intercepts` says so): it answers ``200``, completes a TLS handshake with
the sandbox using the leaf its CA signed (ALPN ``http/1.1`` only), opens TLS to the real
host verified against the system's CAs, then forwards the sandbox's requests one by one,
filling each secret in where its header holds its placeholder
(:func:`sandbox.egress_secrets.rewrite_headers`). Responses flow back unchanged. A request
is framed by its ``Content-Length`` or chunked ``Transfer-Encoding`` (else no body; both, or
either twice, ends the connection: the server could read its end elsewhere); after a
request with ``Upgrade`` (a WebSocket) the rest flows both ways unread. A host whose
certificate does not verify gets no request: the sandbox gets ``502`` naming why.

OpenSSL allows one thread at a time on a connection, so each side is an ``SSLObject`` over
memory buffers, used under a lock, and the sockets are read and written outside it; the
responses go back on their own thread while the requests are forwarded on this one.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress

if not __package__:  # run as a script, like egress.py: the directory holding ``sandbox``, last
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.egress import Config, EgressProxy, LogSink, _Request
from sandbox.egress import main as egress_main
from sandbox.egress_secrets import SecretRules, carried, load_secrets, rewrite_headers

__all__ = ["HEAD_LIMIT", "SecretsProxy", "TlsEnd", "intercept", "main"]

HEAD_LIMIT = 64 * 1024
_LINE_LIMIT = 8 * 1024
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class TlsEnd:
    """One TLS connection over a socket: ``recv``/``sendall`` safe from two threads at once."""

    def __init__(self, sock: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        self.sock, self._obj, self._in, self._out = sock, obj, incoming, outgoing
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()

    @classmethod
    def open(cls, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
             hostname: str | None = None, early: bytes = b"") -> TlsEnd:
        """Complete the handshake; ``early``: bytes of it already read from ``sock``."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        incoming.write(early)
        obj = context.wrap_bio(incoming, outgoing, server_side=server_side, server_hostname=hostname)
        end = cls(sock, obj, incoming, outgoing)
        while True:
            try:
                with end._lock:
                    obj.do_handshake()
                end._flush()
                return end
            except ssl.SSLWantReadError:
                end._flush()
                if not end._feed():
                    raise ConnectionError("the peer closed the connection during the TLS handshake") from None

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                data = self._out.read()
            if data:
                self.sock.sendall(data)

    def _feed(self) -> bool:
        data = self.sock.recv(65536)
        with self._lock:
            if data:
                self._in.write(data)
            else:
                self._in.write_eof()
        return bool(data)

    def recv(self, size: int = 65536) -> bytes:
        """Up to ``size`` bytes; b"" at the end (a close_notify, or the socket's end without one)."""
        while True:
            try:
                with self._lock:
                    data = self._obj.read(size)
                self._flush()
                return data
            except ssl.SSLWantReadError:
                self._flush()
                if not self._feed():
                    continue  # the next read raises the end as SSLZeroReturnError or SSLEOFError
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self._obj.write(data)
        self._flush()

    def close_write(self) -> None:
        """Send close_notify and end the socket's sending side (reading goes on)."""
        with suppress(ssl.SSLError, ValueError), self._lock:
            self._obj.unwrap()
        with suppress(OSError):
            self._flush()
            self.sock.shutdown(socket.SHUT_WR)


class _Reader:
    """Buffered reads of heads, lines and counted bytes from one side."""

    def __init__(self, end: TlsEnd, idle: Callable[[], bool]) -> None:
        self.end, self.buf, self._idle = end, b"", idle

    def more(self) -> bool:
        while True:
            try:
                data = self.end.recv()
            except TimeoutError:
                if self._idle():
                    raise
                continue
            self.buf += data
            return bool(data)

    def head(self) -> bytes | None:
        while not (match := _HEAD_END.search(self.buf)):
            if len(self.buf) > HEAD_LIMIT:
                raise ValueError(f"request head larger than {HEAD_LIMIT} bytes")
            if not self.more():
                if self.buf.strip():
                    raise ValueError("connection closed before the request head was complete")
                return None
        head, self.buf = self.buf[:match.end()], self.buf[match.end():]
        return head

    def line(self) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            if len(self.buf) > _LINE_LIMIT or not self.more():
                raise ValueError("bad chunked request body")
        line, self.buf = self.buf[:end + 1], self.buf[end + 1:]
        return line

    def copy(self, count: int, send: Callable[[bytes], None]) -> None:
        while count > 0:
            if not self.buf and not self.more():
                raise ValueError("connection closed inside a request body")
            piece, self.buf = self.buf[:count], self.buf[count:]
            send(piece)
            count -= len(piece)


def _framing(head: bytes) -> tuple[str, int]:
    """("chunked", 0), ("length", N), ("upgrade", 0) or ("none", 0) from a request head."""
    fields: dict[str, str] = {}
    for raw in head.split(b"\n")[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        key = name.strip().lower()
        if sep and key in fields and key in ("content-length", "transfer-encoding"):
            raise ValueError(f"more than one {name.strip()} header")
        if sep:
            fields[key] = value.strip()
    if "content-length" in fields and "transfer-encoding" in fields:
        raise ValueError("both Content-Length and Transfer-Encoding: the request's end is ambiguous")
    if "upgrade" in fields:
        return "upgrade", 0
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return "chunked", 0
    length = fields.get("content-length", "0") or "0"
    if not length.isdigit():
        raise ValueError("bad Content-Length")
    return ("length", int(length)) if int(length) else ("none", 0)


def _bad_gateway(client: TlsEnd, why: str) -> None:
    """Answer the client's first request (read, never sent on) with 502 naming ``why``, then
    drain what it still sends for a moment: closing on unread data would reset the
    connection and could lose the answer."""
    body = f"callbox egress proxy could not reach the host over TLS: {why}\n".encode("ascii", "backslashreplace")
    with suppress(OSError, ssl.SSLError, ValueError):
        client.sock.settimeout(10.0)
        _Reader(client, lambda: True).head()
        client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: "
                       + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        client.close_write()
        client.sock.settimeout(2.0)
        while client.recv():
            pass


def intercept(conn: socket.socket, upstream: socket.socket, host: str, port: int, rules: SecretRules,
              counts: list[int], idle_timeout: float, early: bytes = b"") -> None:
    """Serve one CONNECT to ``host:port`` whose TLS this proxy terminates (after its 200);
    ``early``: what the client sent after the CONNECT's head without waiting for the 200."""
    assert rules.server is not None and rules.client is not None
    secrets = rules.for_host(host, port)
    last = [time.monotonic()]
    for sock in (conn, upstream):
        sock.settimeout(idle_timeout)

    def idle() -> bool:
        return time.monotonic() - last[0] >= idle_timeout

    try:
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        client = TlsEnd.open(conn, rules.server, server_side=True, early=early)
    except (OSError, ssl.SSLError):
        return  # the sandbox's program did not accept the CA (it says so itself) or went away
    try:
        server = TlsEnd.open(upstream, rules.client, server_side=False, hostname=host)
    except ssl.SSLCertVerificationError as exc:
        return _bad_gateway(client, f"{host}'s certificate does not verify ({exc.verify_message})")
    except (OSError, ssl.SSLError) as exc:
        return _bad_gateway(client, f"TLS with {host} failed ({exc})")

    def abort() -> None:
        for sock in (conn, upstream):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def down() -> None:
        try:
            while True:
                try:
                    data = server.recv()
                except TimeoutError:
                    if idle():
                        return abort()
                    continue
                if not data:
                    client.close_write()
                    return None
                last[0] = time.monotonic()
                client.sendall(data)
                counts[1] += len(data)
        except (OSError, ssl.SSLError):
            return abort()

    def up(data: bytes) -> None:
        last[0] = time.monotonic()
        server.sendall(data)
        counts[0] += len(data)

    responses = threading.Thread(target=down, daemon=True)
    responses.start()
    reader = _Reader(client, idle)
    try:
        while (head := reader.head()) is not None:
            kind, length = _framing(head)
            up(rewrite_headers(head, secrets)[0])
            if kind == "length":
                reader.copy(length, up)
            elif kind == "chunked":
                while True:
                    line = reader.line()
                    up(line)
                    size = int(line.split(b";")[0].strip() or b"x", 16)
                    if size == 0:
                        while (trailer := reader.line()).strip():
                            up(trailer)
                        up(trailer)
                        break
                    reader.copy(size + 2, up)
            elif kind == "upgrade":
                if reader.buf:
                    up(reader.buf)
                while reader.more():
                    up(reader.buf)
                    reader.buf = b""
                break
        server.close_write()
    except (ValueError, OSError, ssl.SSLError):
        abort()
    responses.join()


class SecretsProxy(EgressProxy):
    """The egress proxy, carrying ``secrets`` to their hosts; an allowed connection to one
    says ``"secrets": [NAME, ...]`` in its decision."""

    def __init__(self, config: Config, log: LogSink | None, secrets: SecretRules) -> None:
        super().__init__(config, log)
        self.secrets = secrets

    def _record(self, event: str, req: _Request, **fields: object) -> None:
        if event == "decision" and fields.get("decision") == "allow" and req.host and req.port:
            fields.update(carried(self.secrets, req.host, req.port))
        super()._record(event, req, **fields)

    def _splice(self, conn: socket.socket, upstream: socket.socket, req: _Request, rest: bytes) -> None:
        assert req.host is not None and req.port is not None
        if req.method == "CONNECT" and self.secrets.intercepts(req.host, req.port):
            return intercept(conn, upstream, req.host, req.port, self.secrets, req.counts, self.config.idle_timeout,
                             rest)
        if req.method != "CONNECT":
            req.head = rewrite_headers(req.head, self.secrets.for_host(req.host, req.port))[0]
        return super()._splice(conn, upstream, req, rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="callbox-egress-tls", add_help=False)
    parser.add_argument("--secrets-file", required=True)
    parser.add_argument("--test-extra-ca")
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        secrets = load_secrets(args.secrets_file, args.test_extra_ca)  # announces a test CA on stderr
    except ValueError as exc:
        print(f"callbox egress proxy: cannot load the sandbox's secrets: {exc}", file=sys.stderr)
        return 1
    assert secrets is not None
    return egress_main(rest, lambda config, log: SecretsProxy(config, log, secrets))


if __name__ == "__main__":
    sys.exit(main())
