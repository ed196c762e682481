"""``make bench`` section ``door``: tool calls through the gRPC door with 1, 8 and 32 concurrent clients.

``callbox serve --grpc unix:SOCK`` runs as a child process, as a user runs it (the .venv's
``callbox``, a token file, a policy naming the bench's image, its own audit store). Each client
has its own channel (``ExecutorClient``) and its own sandbox, and calls ``shell`` with the
command ``true`` back to back: the full path of a tool call (validation, policy, audit, the
agent). The baseline, in the same run, is the bare exec: as many threads of this process, each
calling ``collect(box.agent.exec(["true"]))`` back to back on its own engine sandbox, with no
door. Door and baseline rounds alternate (3 rounds each, which goes first rotates), so drift
in the machine's load hits both.

Rows 18a-18c: a call's latency (p50, p90; p99 in the target column); rows 18d-18f: calls per
second in all, each round's count over its wall time (p50 of the rounds; "p90" is the slowest
round); rows 18g-18i: the CPU time the server process spent per call (its user + system time
over each door round, divided by the round's calls: what the door costs, whatever else the
machine runs). The clients are threads of one Python process, so at 32 clients the client side's
GIL is part of the figure (for the door and the baseline alike).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.client import ExecutorClient
from harness.engine.docker.engine import Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_results import p50, p99
from tests.child_process import stop_child

CLIENT_LEVELS = (1, 8, 32)
ROUNDS = 3
CALLS_PER_ROUND = {1: 100, 8: 25, 32: 8}
"""Per client and round: 300, 600 and 768 calls per level over the 3 rounds."""
CALLBOX = str(Path(sys.executable).with_name("callbox"))
TOKEN = "bench-" + "g" * 32
START_TIMEOUT_S = 60.0
LISTENING = r"gRPC executor listening on (\S+)"
MAX_TOOL_CALLS = 100_000
TARGET_EXTRA_MS = 0.5
TARGET_P99_MS = 50.0
TARGET_RATE_RATIO = 0.8
"""8 clients' calls per second through the door, at least this share of the bare exec's in the same run."""


class GrpcDoor:
    """``callbox serve --grpc unix:SOCK`` in a child process with its own token file, policy and audit store."""

    def __init__(self, image: str, max_sandboxes: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="callbox-bench-door-"))
        tokens = self.dir / "tokens"
        tokens.write_text(f"bench:{TOKEN}\n")
        tokens.chmod(0o600)
        policy = self.dir / "policy.toml"
        # The default budget (200 tool calls per run, a run being a sandbox) would stop the 1-client level.
        policy.write_text(f'[sandbox]\nimage = "{image}"\n\n[budgets]\nmax_tool_calls = {MAX_TOOL_CALLS}\n')
        self.target = f"unix:{self.dir / 'executor.sock'}"
        limit = str(max_sandboxes + 4)
        args = ["serve", "--grpc", self.target, "--token-file", str(tokens), "--policy", str(policy),
                "--audit-db", str(self.dir / "audit.sqlite3"), "--max-per-client", limit, "--max-sandboxes", limit]
        self.proc = subprocess.Popen([CALLBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._wait_listening()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # read to the end, so the server never blocks on a full pipe
            self.lines.put(line)
        self.lines.put(None)

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"callbox serve --grpc did not listen in {START_TIMEOUT_S:g} s: {self.seen}") \
                    from None
            if line is None:
                raise RuntimeError(f"callbox serve --grpc exited ({self.proc.wait()}): {''.join(self.seen)}")
            self.seen.append(line)
            if re.search(LISTENING, line):
                return

    def client(self) -> ExecutorClient:
        return ExecutorClient(self.target, token=TOKEN)

    def stop(self) -> None:
        """SIGTERM (the server removes its sandboxes), then wait; SIGKILL if it hangs."""
        stop_child(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def grpc_door(image: str, max_sandboxes: int) -> Iterator[GrpcDoor]:
    door = GrpcDoor(image, max_sandboxes)
    try:
        yield door
    finally:
        door.stop()


def process_cpu_s(pid: int) -> float | None:
    """The CPU time (user + system, seconds) process ``pid`` has used so far; None without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


Caller = Callable[[], None]


def one_round(callers: list[Caller], calls: int) -> tuple[list[float], float]:
    """Every caller on its own thread, released together, ``calls`` calls back to back each:
    the latencies (ms) and the calls per second in all."""
    gate = threading.Barrier(len(callers) + 1)
    latencies: list[list[float]] = [[] for _ in callers]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        gate.wait()
        try:
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                callers[i]()
                latencies[i].append(ms_since(t0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(callers))]
    for thread in threads:
        thread.start()
    gate.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} callers failed, the first: {errors[0]!r}") from errors[0]
    flat = [v for values in latencies for v in values]
    return flat, len(flat) / wall


def bench_door(res: Resources, spec: SandboxSpec, kit: Toolkit, *, quick: bool = False) -> dict[str, list[float]]:
    """Rows 18a-18f; the server and every sandbox started here are gone when it returns."""
    levels = (1, 4) if quick else CLIENT_LEVELS
    most = max(levels)
    data: dict[str, list[float]] = {}
    kit.progress(f"door: starting callbox serve --grpc, {most} door sandboxes and {most} engine sandboxes")
    engine_boxes: list[Sandbox] = []
    with grpc_door(spec.image, most) as door:
        clients = [door.client() for _ in range(most)]
        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                door_boxes = list(pool.map(lambda c: c.create_sandbox(), clients))
                engine_boxes.extend(pool.map(lambda _: res.create_sandbox(spec), range(most)))

            def door_caller(i: int) -> Caller:
                client, box = clients[i], door_boxes[i]

                def call() -> None:
                    result = client.call(box, "shell", {"command": "true"}, call_id=f"b{uuid.uuid4().hex[:12]}")
                    if result.is_error:
                        raise RuntimeError(f"door shell `true`: {result.text}")
                return call

            def bare_caller(i: int) -> Caller:
                box = engine_boxes[i]

                def call() -> None:
                    result = collect(box.agent.exec(["true"]))
                    if result.exit_code != 0:
                        raise RuntimeError(f"bare exec `true`: {result.to_json()}")
                return call

            for n in levels:
                calls = 4 if quick else CALLS_PER_ROUND[n]
                sides = {"door": [door_caller(i) for i in range(n)], "bare": [bare_caller(i) for i in range(n)]}
                for callers in sides.values():
                    one_round(callers, 2)  # warm-up, not counted
                for r in range(ROUNDS):
                    order = list(sides) if r % 2 == 0 else list(reversed(sides))
                    for side in order:
                        cpu_before = process_cpu_s(door.proc.pid)
                        latencies, rate = one_round(sides[side], calls)
                        cpu_after = process_cpu_s(door.proc.pid)
                        data.setdefault(f"{side}_c{n}_latency", []).extend(latencies)
                        data.setdefault(f"{side}_c{n}_per_s", []).append(rate)
                        if side == "door" and cpu_before is not None and cpu_after is not None:
                            data.setdefault(f"door_c{n}_server_cpu", []).append(
                                (cpu_after - cpu_before) * 1000 / len(latencies))
                kit.progress(f"door: {n} clients: door p50 {p50(data[f'door_c{n}_latency']):.2f} ms, "
                             f"{p50(data[f'door_c{n}_per_s']):.0f} calls/s; bare p50 "
                             f"{p50(data[f'bare_c{n}_latency']):.2f} ms, {p50(data[f'bare_c{n}_per_s']):.0f} calls/s")
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda cb: cb[0].delete_sandbox(cb[1]), zip(clients, door_boxes, strict=True)))
        finally:
            for client in clients:
                client.close()
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(res.destroy_sandbox, engine_boxes))
    return data


def add_door_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 18a-18f (``add`` takes ``Row``'s arguments)."""
    levels = [n for n in (*CLIENT_LEVELS, 4) if f"door_c{n}_latency" in data]
    if not levels:
        return
    base_name = "bare `agent.exec(['true'])`, as many threads, no door"
    for letter, n in zip("abc", levels, strict=False):
        door, bare = data[f"door_c{n}_latency"], data[f"bare_c{n}_latency"]
        info = f"p99 {p99(door):.1f} ms, baseline p99 {p99(bare):.1f} ms"
        check: Callable[..., bool] | None = None
        if n == 1:
            target = f"p50 ≤ baseline p50 + {TARGET_EXTRA_MS:g} ms ({info})"

            def check(r: object, door: list[float] = door, bare: list[float] = bare) -> bool:
                return p50(door) <= p50(bare) + TARGET_EXTRA_MS
        elif n == 8:
            target = f"p99 ≤ {TARGET_P99_MS:g} ms ({info})"

            def check(r: object, door: list[float] = door) -> bool:
                return p99(door) <= TARGET_P99_MS
        else:
            target = f"— (info; {info})"
        add(f"18{letter}. gRPC door: `shell` `true`, {n} client{'s' if n > 1 else ''} each on its own sandbox, "
            f"latency ({len(door)} calls)", "time", door, base_name, bare, target, check,
            extra={"p99": p99(door), "baseline_p99": p99(bare)})
    for letter, n in zip("def", levels, strict=False):
        door_rate, bare_rate = data[f"door_c{n}_per_s"], data[f"bare_c{n}_per_s"]
        rate_check: Callable[..., bool] | None = None
        target = "— (info)"
        if n == 8:
            target = f"≥ {TARGET_RATE_RATIO:g}\N{MULTIPLICATION SIGN} baseline"

            def rate_check(r: object, door_rate: list[float] = door_rate, bare_rate: list[float] = bare_rate) -> bool:
                return p50(door_rate) >= TARGET_RATE_RATIO * p50(bare_rate)
        add(f"18{letter}. gRPC door: calls per second in all, {n} client{'s' if n > 1 else ''} "
            f"({len(door_rate)} rounds)", "ops", door_rate, base_name, bare_rate, target, rate_check,
            unit="calls/s")
    for letter, n in zip("ghi", levels, strict=False):
        cpu = data.get(f"door_c{n}_server_cpu")
        if cpu:
            add(f"18{letter}. gRPC door: the server process's CPU time (user + system) per call, {n} "
                f"client{'s' if n > 1 else ''} ({len(cpu)} rounds)", "time", cpu,
                "— (the bare exec has no server)", None, "— (info; what the calls cost the server, "
                "less sensitive to the machine's load than the latency)")
