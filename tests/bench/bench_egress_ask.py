"""Row 7d: a held egress connection, allowed by a person: what it adds beyond the answer.

The egress proxy (``sandbox/egress.py``, the code its container runs) serves in this process
on 127.0.0.1 (``--test-allow-network 127.0.0.0/8``), with a local HTTP server behind it, so
nothing leaves the machine; the harness's side is the real one: an
:class:`~harness.core.egress_ask.EgressAskWatch` over the proxy's directory, with a real
audit store. Each sample sends a request to an ``ask`` destination, waits until the approval
exists, resolves it (allow once) and times from the moment ``resolve_approval`` returns to the
response's last byte. The baseline is the same request to an ``allow`` destination (no hold),
so the difference is what the hold adds beyond the person's answer: the watch's and the
proxy's polling, and the answer file."""

from __future__ import annotations

import dataclasses
import http.server
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.audit.store import AuditStore
from harness.core.egress_ask import EgressAskWatch
from harness.engine.docker.egress_asks import EgressAskChannel
from sandbox import egress

TARGET_ADDED_MS = 250.0
"""What the hold may add beyond the answer: well under a person's reaction time."""


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Box:
    def __init__(self, channel: EgressAskChannel) -> None:
        self.channel = channel

    def egress_ask_channel(self) -> EgressAskChannel:
        return self.channel


def _get(proxy: tuple[str, int], host: str, port: int) -> bytes:
    with socket.create_connection(proxy, timeout=30) as sock:
        sock.sendall(f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def bench_egress_ask(samples: int, warmup: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=web.serve_forever, args=(0.05,), daemon=True).start()
    port = web.server_address[1]
    directory = Path(tempfile.mkdtemp(prefix="cbx-bench-ask-"))
    argv = ["--listen", "127.0.0.1:0", "--sandbox-id", "bench", "--allow", f"ask localhost:{port}",
            "--allow", f"127.0.0.1:{port}", "--test-allow-network", "127.0.0.0/8",
            "--rules-file", str(directory / "rules.json"), "--log", str(directory / "events.jsonl")]
    config = egress.parse_args(argv)
    log_file = open(directory / "events.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    proxy = egress.EgressProxy(dataclasses.replace(config, ask_timeout=60.0), egress.json_lines(log_file))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    channel = EgressAskChannel("bench", directory, "events.jsonl")
    held: list[float] = []
    plain: list[float] = []
    try:
        with AuditStore(directory / "audit.sqlite3") as audit, \
                EgressAskWatch(audit, "bench-run", "call-1", "shell", lambda: _Box(channel), None, 3600.0):
            for i in range(warmup + samples):
                t0 = time.perf_counter_ns()
                assert _get(proxy.address, "127.0.0.1", port).endswith(b"ok")
                direct = (time.perf_counter_ns() - t0) / 1e6
                answer: list[float] = []

                def held_request(out: list[float] = answer) -> None:
                    ok = _get(proxy.address, "localhost", port).endswith(b"ok")
                    out.append(time.perf_counter_ns() if ok else -1)

                request = threading.Thread(target=held_request)
                request.start()
                while not (pending := audit.list_approvals("pending")):
                    time.sleep(0.001)
                audit.resolve_approval(pending[0].id, True, by="bench", reason=None)
                t_answer = time.perf_counter_ns()
                request.join(30)
                if not answer or answer[0] < 0:
                    raise RuntimeError("the held request did not get through after its approval")
                if i >= warmup:
                    held.append((answer[0] - t_answer) / 1e6)
                    plain.append(direct)
        progress(f"egress ask: {samples} samples")
    finally:
        proxy.stop()
        proxy.close()
        web.shutdown()
        web.server_close()
        log_file.close()
    return {"egress_ask_after_answer": held, "egress_plain_request": plain}
