"""A minimal DevTools Protocol client for the desktop's Chromium: stdlib only.

Chromium runs with ``--remote-debugging-port=0`` on 127.0.0.1: it picks a free port and writes it,
with the browser's WebSocket path, to ``DevToolsActivePort`` in its profile. :class:`DevTools`
connects there (one WebSocket, RFC 6455: masked text frames out, fragmented or not in) and sends
commands to the browser or, with a ``sessionId``, to a page attached with ``flatten``; events that
arrive meanwhile are kept in ``events``. Chromium refuses WebSocket connections that carry a web
origin, so pages cannot connect; this client sends none.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any

PORT_FILE = "/tmp/callbox-desktop/chromium/DevToolsActivePort"  # in computer.py's --user-data-dir


class ActionError(Exception):
    """An action that cannot be done as asked: reported as ``{"ok": false, "error": ...}``."""


class BrowserDown(ActionError):
    """Chromium does not answer: the caller starts it (action ``start``) and asks again."""


class WebSocket:
    def __init__(self, port: int, path: str, timeout_s: float) -> None:
        try:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        except OSError as exc:
            raise BrowserDown(f"Chromium's DevTools port {port} does not answer: {exc}") from None
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise BrowserDown("Chromium closed the DevTools connection during its handshake")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise BrowserDown(f"Chromium refused the DevTools connection: {head[:200]!r}")

    def send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        size = len(data)
        if size < 126:
            header = struct.pack(">BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            header = struct.pack(">BBH", 0x81, 0x80 | 126, size)
        else:
            header = struct.pack(">BBQ", 0x81, 0x80 | 127, size)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(max(65536, count - len(self.buffer)))
            if not chunk:
                raise ActionError("Chromium closed the DevTools connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack(">H", self._read(2))
            elif size == 127:
                (size,) = struct.unpack(">Q", self._read(8))
            payload = self._read(size)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ActionError("Chromium closed the DevTools connection")
            if opcode == 0x9:  # ping: answered with a masked pong
                mask = os.urandom(4)
                self.sock.sendall(bytes((0x8A, 0x80 | len(payload))) + mask
                                  + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
                continue
            if opcode == 0xA:
                continue
            message += payload
            if first & 0x80:
                return message.decode("utf-8", "replace")

    def close(self) -> None:
        self.sock.close()


class DevTools:
    """One connection to the browser; commands to a page go through its flat session."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        try:
            with open(PORT_FILE) as f:
                port_line, path = f.read().split("\n")[:2]
            port = int(port_line)
        except (OSError, ValueError):
            raise BrowserDown("Chromium is not running with DevTools (no DevToolsActivePort)") from None
        self.ws = WebSocket(port, path.strip(), timeout_s)
        self.timeout_s = timeout_s
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            try:
                reply = json.loads(self.ws.receive())
            except TimeoutError:
                raise ActionError(f"Chromium did not answer {method} within {self.timeout_s:.0f} s (a page "
                                  "that does not answer, or a dialog waiting on the page)") from None
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise CommandError(method, reply["error"].get("message", "failed"))
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def close(self) -> None:
        self.ws.close()


class CommandError(ActionError):
    def __init__(self, method: str, message: str) -> None:
        super().__init__(f"{method}: {message}")
        self.reason = message
