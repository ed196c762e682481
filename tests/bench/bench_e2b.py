"""``make bench`` section ``e2b``: the unmodified E2B SDK (``e2b.Sandbox``, sync API) against
``callbox serve --e2b``, each figure beside the same job done by callbox's engine in this
process (no door: no HTTP, no Connect, no policy or audit), interleaved in the same run.

The server runs as a child process, as a user runs it (the .venv's ``callbox serve --e2b
127.0.0.1:0`` with a token file, a policy naming the bench's image and its own audit store),
so the SDK and the server do not share an interpreter. The SDK reaches it with ``api_key``,
``api_url`` and ``sandbox_url``: what ``E2B_API_KEY``, ``E2B_API_URL`` and
``E2B_SANDBOX_URL`` set.

Rows:

14a. cold start: ``Sandbox.create()`` → the first ``commands.run("true")`` result (a warm
     pool does not exist yet: every create starts a container), vs the engine's create →
     first ``true`` (row 2b's path); the sandbox's kill is untimed on both sides. Beside it,
     as context only, the published cloud figures (not measured here);
14b. of which ``Sandbox.create()`` alone (the REST call returns once the agent answers), vs
     the engine's create → agent ready (row 2a's path);
14c. ``commands.run("true")`` round trip in a live sandbox. The SDK runs every command as
     ``/bin/bash -l -c CMD``, so the baseline is ``agent.exec`` of that same argv in an engine
     sandbox of this process; p99 in the target column;
14d/14e. ``files.write`` / ``files.read`` of a 32 MiB file (random bytes, every byte checked,
     untimed) in ``/workspace``, vs the engine's ``upload_tar_stream`` of a one-file tar to the
     same place / ``download`` of it (the tar the gRPC door's Upload/Download move).

Rows 14a/14b and 14d/14e take ``heavy_samples`` (a third of ``--samples``, at least 3), the
round trip at least 200 samples (p99 needs them): the section takes under a minute.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from e2b import Sandbox as E2bSandbox

from harness.engine.docker.engine import Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_living import Resources, Toolkit
from tests.child_process import stop_child

MIB = 1 << 20
TIMES = "\N{MULTIPLICATION SIGN}"
FILE_BYTES = 32 * MIB
ROUND_TRIP_MIN_SAMPLES = 200
SDK_ARGV = ["/bin/bash", "-l", "-c", "true"]
"""What ``commands.run("true")`` asks envd to start (the SDK wraps every command so)."""
CALLBOX = str(Path(sys.executable).with_name("callbox"))
START_TIMEOUT_S = 60.0
URL_LINE = r"E2B API on (https?://\S+?)/?\s*$"
"""The line ``callbox serve --e2b`` prints once it listens."""
API_KEY = "bench-" + "k" * 32
WORKSPACE_FILE = "/workspace/bench-e2b.bin"
PUBLISHED = ("published, not measured here: about 150 ms start (E2B's own figure); ComputeSDK's April 2026 "
             "median time-to-interactive: E2B 0.49 s, Daytona 0.19 s")
"""Cloud figures others published, shown beside row 14a as context; nothing here measures them."""


def heavy_samples(samples: int) -> int:
    return max(3, samples // 3)


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


class E2bDoor:
    """``callbox serve --e2b 127.0.0.1:0`` in a child process with its own token file, policy
    (``image``, then ``policy_extra``) and audit store; ``url`` is the address it announces on stderr."""

    def __init__(self, image: str, policy_extra: str = "") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="callbox-bench-e2b-"))
        tokens = self.dir / "tokens"
        tokens.write_text(f"bench:{API_KEY}\n")
        tokens.chmod(0o600)
        policy = self.dir / "policy.toml"
        policy.write_text(f'[sandbox]\nimage = "{image}"\n' + policy_extra)
        args = ["serve", "--e2b", "127.0.0.1:0", "--token-file", str(tokens), "--policy", str(policy),
                "--audit-db", str(self.dir / "audit.sqlite3")]
        self.proc = subprocess.Popen([CALLBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._announced(URL_LINE)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # read to the end, so the server never blocks on a full pipe
            self.lines.put(line)
        self.lines.put(None)

    def _announced(self, pattern: str) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"callbox serve --e2b announced no URL in {START_TIMEOUT_S:g} s: {self.seen}") \
                    from None
            if line is None:
                raise RuntimeError(f"callbox serve --e2b exited ({self.proc.wait()}): {''.join(self.seen)}")
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match[1]

    def opts(self) -> dict[str, Any]:
        """The SDK's connection options for this server."""
        return {"api_key": API_KEY, "api_url": self.url, "sandbox_url": self.url}

    def stop(self) -> None:
        """SIGTERM (the server removes its sandboxes), then wait; SIGKILL if it hangs."""
        stop_child(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def e2b_door(image: str, policy_extra: str = "") -> Iterator[E2bDoor]:
    """:class:`E2bDoor` on ``image``, its policy followed by ``policy_extra`` (TOML)."""
    door = E2bDoor(image, policy_extra)
    try:
        yield door
    finally:
        door.stop()


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def bench_e2b(res: Resources, spec: SandboxSpec, samples: int, warmup: int, kit: Toolkit, *,
              quick: bool = False) -> dict[str, list[float]]:
    """Rows 14a-14e; the server and every sandbox started here are gone when it returns."""
    data: dict[str, list[float]] = {}
    heavy = heavy_samples(samples)
    size = FILE_BYTES // (8 if quick else 1)
    kit.progress("e2b: starting callbox serve --e2b")
    with e2b_door(spec.image) as door:
        opts = door.opts()
        data.update(bench_cold(res, spec, opts, heavy, min(warmup, 1), kit))
        kit.progress("e2b: starting an SDK sandbox and an engine sandbox for the round-trip and file rows")
        sdk = E2bSandbox.create(timeout=600, **opts)
        box = res.create_sandbox(spec)
        try:
            rounds = samples if quick else max(samples, ROUND_TRIP_MIN_SAMPLES)
            data.update(bench_run_true(sdk, box, rounds, warmup, kit))
            data.update(bench_files(sdk, box, size, heavy, min(warmup, 1), kit))
        finally:
            res.destroy_sandbox(box)
            sdk.kill()
    data["e2b_file_bytes"] = [float(size)]
    return data


def bench_cold(res: Resources, spec: SandboxSpec, opts: dict[str, Any], samples: int, warmup: int,
               kit: Toolkit) -> dict[str, list[float]]:
    def sdk_cold() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        sandbox = E2bSandbox.create(**opts)
        created = ms_since(t0)
        try:
            result = sandbox.commands.run("true")
            first = ms_since(t0)
        finally:
            sandbox.kill()  # untimed
        if result.exit_code != 0:
            raise RuntimeError(f"SDK first command: exit code {result.exit_code}")
        return {"e2b_cold_create": created, "e2b_cold_first": first}

    def engine_cold() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box = res.create_sandbox(spec)
        ready = ms_since(t0)
        try:
            result = collect(box.agent.exec(["true"]))
            first = ms_since(t0)
        finally:
            res.destroy_sandbox(box)  # untimed
        if result.exit_code != 0:
            raise RuntimeError(f"engine first exec: exit code {result.exit_code}")
        return {"engine_cold_ready": ready, "engine_cold_first": first}

    return kit.interleaved("e2b cold start", [sdk_cold, engine_cold], samples, warmup, every=5)


def bench_run_true(sdk: E2bSandbox, box: Sandbox, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    def sdk_true() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        result = sdk.commands.run("true")
        elapsed = ms_since(t0)
        if result.exit_code != 0:
            raise RuntimeError(f"SDK commands.run('true'): exit code {result.exit_code}")
        return {"e2b_run_true": elapsed}

    def engine_true() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        result = collect(box.agent.exec(SDK_ARGV))
        elapsed = ms_since(t0)
        if result.exit_code != 0:
            raise RuntimeError(f"engine exec {SDK_ARGV}: exit code {result.exit_code}")
        return {"engine_bash_true": elapsed}

    return kit.interleaved("e2b commands.run('true')", [sdk_true, engine_true], samples, warmup, every=50)


def one_file_tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.size, member.mode, member.mtime = len(data), 0o644, int(time.time())
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def tar_member(archive: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        handle = tar.extractfile(name)
        if handle is None:
            raise RuntimeError(f"download: {name} is not a file in the archive")
        return handle.read()


def chunks_of(data: bytes, size: int = MIB) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start:start + size])


def bench_files(sdk: E2bSandbox, box: Sandbox, size: int, samples: int, warmup: int,
                kit: Toolkit) -> dict[str, list[float]]:
    payload = os.urandom(size)
    name = Path(WORKSPACE_FILE).name
    archive = one_file_tar(name, payload)

    def check(got: bytes, what: str) -> None:
        if got != payload:
            raise RuntimeError(f"{what}: {len(got)} bytes back, {'same' if len(got) == size else 'not'} "
                               f"the size of the {size} written, content differs")

    def sdk_write_read() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        sdk.files.write(WORKSPACE_FILE, payload)
        wrote = ms_since(t0)
        t0 = time.perf_counter_ns()
        got = bytes(sdk.files.read(WORKSPACE_FILE, format="bytes"))
        read = ms_since(t0)
        check(got, "SDK files.read")
        return {"e2b_write": wrote, "e2b_read": read}

    def engine_upload_download() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box.transfer.upload_tar_stream(str(Path(WORKSPACE_FILE).parent), chunks_of(archive), overwrite=True)
        wrote = ms_since(t0)
        t0 = time.perf_counter_ns()
        got = b"".join(box.transfer.download(WORKSPACE_FILE))
        read = ms_since(t0)
        check(tar_member(got, name), "engine download")
        return {"engine_upload": wrote, "engine_download": read}

    return kit.interleaved("e2b files", [sdk_write_read, engine_upload_download], samples, warmup, every=5)


def add_e2b_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 14a-14e of the report (``add`` takes ``Row``'s arguments)."""
    if "e2b_cold_first" not in data:
        return
    cold = f"{len(data['e2b_cold_first'])} samples"
    size = int(data["e2b_file_bytes"][0])
    mib = f"{size / MIB:.0f} MiB"
    heavy = f"{len(data['e2b_write'])} samples"
    add(f"14a. E2B SDK: `Sandbox.create()` → first `commands.run('true')` result, cold (no warm pool) ({cold})",
        "time", data["e2b_cold_first"], "engine in-process: create → first `true` (row 2b's path)",
        data["engine_cold_first"], f"— (info; {PUBLISHED})")
    add(f"14b. E2B SDK: of which `Sandbox.create()` returns ({cold})", "time", data["e2b_cold_create"],
        "engine in-process: create → agent ready (row 2a's path)", data["engine_cold_ready"], "— (info)")
    rtt = data["e2b_run_true"]
    add(f"14c. E2B SDK: `commands.run('true')` round trip, live sandbox ({len(rtt)} samples)", "time", rtt,
        "engine in-process `agent.exec` of the SDK's argv `/bin/bash -l -c true`", data["engine_bash_true"],
        f"— (info; p99 {p99(rtt):.1f} ms, baseline p99 {p99(data['engine_bash_true']):.1f} ms)")
    add(f"14d. E2B SDK: `files.write` of {mib} to /workspace ({heavy})", "rate", data["e2b_write"],
        "engine in-process `upload_tar_stream` of a one-file tar, same place", data["engine_upload"], "— (info)",
        rate_bytes=size)
    add(f"14e. E2B SDK: `files.read` of the {mib} file ({heavy})", "rate", data["e2b_read"],
        "engine in-process `download` (a tar of the file)", data["engine_download"], "— (info)", rate_bytes=size)
