"""A small server the port tests run inside a sandbox (``python3 port_program.py PORT``; the
image's python3 has only the standard library).

* ``GET /`` and any other path: 200, a JSON body with the port, the path and the names of
  the request headers it got (so a test can check no credential reached the sandbox).
* ``POST /echo``: the request body back.
* ``GET /stream``: a chunked response; ``first`` at once, ``second`` only once ``/tmp/go``
  exists (a test creates it after it has read ``first``: the response streamed).
* A WebSocket upgrade on any path: the handshake (with the first subprotocol offered), then
  every text or binary message echoed back, pings answered, a close answered with a close.

Writes ``/tmp/ready-PORT`` once it listens.
"""

import base64
import hashlib
import http.server
import json
import os
import struct
import sys
import time

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        elif self.path == "/stream":
            self.stream()
        else:
            self.reply({"port": self.server.server_port, "path": self.path,
                        "headers": sorted(name.lower() for name in self.headers)})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reply(self, value):
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.chunk(b"first\n")
        while not os.path.exists("/tmp/go"):
            time.sleep(0.05)
        self.chunk(b"second\n")
        self.wfile.write(b"0\r\n\r\n")

    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + GUID).encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        if offered:
            self.send_header("Sec-WebSocket-Protocol", offered[0])
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.frame(8, payload[:2])
                return
            self.frame(10 if opcode == 9 else opcode, payload)

    def frame(self, opcode, payload):
        size = len(payload)
        head = bytes([0x80 | opcode])
        if size < 126:
            head += bytes([size])
        elif size < 65536:
            head += bytes([126]) + struct.pack("!H", size)
        else:
            head += bytes([127]) + struct.pack("!Q", size)
        self.wfile.write(head + payload)
        self.wfile.flush()


if __name__ == "__main__":
    port = int(sys.argv[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    open(f"/tmp/ready-{port}", "w").close()
    server.serve_forever()
