"""``make bench``: callbox against its baselines and performance targets, side by side in one run.

Run as ``python -m tests.bench.bench_exec [--samples N] [--json PATH] [--quick] [--only SECTION]
[--sandboxes N]``. The results go to ``bench-results.json`` in the current directory (or PATH):
one object per row (:mod:`tests.bench.bench_results`), the raw samples beside them.

Every figure is measured in this process on this machine, interleaved with its
baseline (callbox and baseline samples alternate, so drift in machine load hits both
sides alike), after a few warm-up iterations that are not counted. Each figure is a
median (p50) and a p90 over at least 30 samples. The Markdown report goes to stdout,
progress lines to stderr. Everything the run starts (sandboxes, baseline containers,
bind-mount directories) is removed in ``finally``, also on Ctrl-C or SIGTERM.

Rows:

1. exec round trip of ``true`` in a live sandbox (``exec_buffered``, the call the harness
   makes for a command whose output it does not watch), vs docker-py ``exec_run`` into the
   same sandbox container: interleaved (an idle gap between two callbox calls, as
   between an agent's tool calls) and back to back (1b); 1c: back to back through the
   streamed ``Exec``;
2. cold start: ``engine.create`` (create -> agent ready) and create -> first result,
   vs a hardened ``docker run --rm IMAGE true`` through docker-py (same flags as the
   engine's ``_run_container``), plus create+start+wait with the removal untimed;
3. streaming throughput sandbox -> harness (``head -c SIZE /dev/zero``), vs docker-py's
   exec output stream;
4. memory per idle sandbox: container cgroup usage, the agent's RSS, and the host
   cost including the containerd shim, vs a bare container of the same image running
   ``sleep infinity`` with the same limits;
5. floors for row 1: a gRPC unary health check on the agent socket, and the agent's own
   spawn -> exit time of ``true`` vs ``subprocess.run(["true"])`` on the host;
6b. the harness overhead of row 6 with the audit chain, against a store with its chain off
    (interleaved): bench_audit_chain.py, section ``overhead``;
8. the cost of redacting secrets from every result: a whole call (no sandbox) on a 16 KiB
   and a 1 MiB tool output, vs the same call path with redaction off;
9.-13. living sandboxes (attach replay, PTY keystroke, cp, pause/resume, snapshot/fork): bench_living.py;
14. the E2B SDK against ``callbox serve --e2b`` (cold start, ``commands.run`` round trip, file
    write/read throughput), each beside the engine doing the same in process: bench_e2b.py;
    14f-14h. ``e2b_code_interpreter``'s ``run_code`` round trip and first result, the ``python`` tool's cell:
        bench_interpreter.py;
15. (left for the warm pool's rows);
16.-17. many cold creates (sequential, 4 and 16 concurrent creators, staggered, a burst of 50) and
    destroy latency to the caller: bench_scale.py, section ``create``;
18. tool calls through the gRPC door with 1, 8 and 32 concurrent clients against the bare exec:
    bench_door.py, section ``door``;
19. the scale probe (``--sandboxes N`` live sandboxes of 128 MiB: memory, answers, create and
    destroy times): bench_scale.py, section ``scale``, not in the default run (``make bench-scale``);
20. what metrics and tracing add to row 6's harness overhead per call (on vs off, interleaved):
    bench_telemetry.py, section ``telemetry``;
22.-23. the Ray engine on a real three-node cluster the section builds and removes (remote
    create, exec, streaming, sandboxes/s over 2 nodes vs 1, dead-node detection, image
    distribution), and the node's relay against a Ray actor proxy: bench_ray.py, section ``ray``
    (as root with ray installed; otherwise a row says why they were skipped);
24. a template build through the E2B SDK, cold and from the cache: bench_templates.py, section ``templates``;
25. the ``computer`` tool's screenshot and click on the desktop image variant: bench_desktop.py, section ``desktop``;
26. memory snapshots under gVisor (snapshot, restore, image size; 512 MiB and 2 GiB):
    bench_memory_snapshots.py, section ``memsnap`` (as root with runsc; otherwise skipped, saying why);
27. per-call change records (undo) on a 10,000-file project in a read-write mount, and a revert:
    bench_undo.py, section ``undo``;
28. a snapshot's export to one archive and its verified import, 100 MiB workspace, against ``tar``:
    bench_snapshot_archive.py, section ``archive``;
29. ``callbox eval``'s tasks per minute with the warm pool, 4 at a time, against the same tasks one
    by one with every sandbox cold: bench_eval.py, section ``eval``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import grpc
import psutil
from docker.models.containers import Container
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine, Sandbox, seccomp_profile
from harness.engine.exec_result import ExecResult, collect
from harness.engine.spec import AGENT_DIR, TOOL_GID, TOOL_UID, SandboxSpec
from tests.bench.bench_audit_chain import add_audit_chain_rows, bench_audit_chain
from tests.bench.bench_burst import add_burst_rows, bench_burst
from tests.bench.bench_desktop import add_desktop_rows, bench_desktop
from tests.bench.bench_door import add_door_rows, bench_door
from tests.bench.bench_e2b import add_e2b_rows, bench_e2b
from tests.bench.bench_egress_ask import TARGET_ADDED_MS, bench_egress_ask
from tests.bench.bench_egress_tls import add_egress_tls_rows, bench_egress_tls
from tests.bench.bench_eval import add_eval_rows, bench_eval
from tests.bench.bench_interpreter import add_interpreter_rows, bench_interpreter
from tests.bench.bench_living import Toolkit, add_living_rows, bench_living
from tests.bench.bench_memory_snapshots import add_memsnap_rows, bench_memsnap
from tests.bench.bench_network_rules import TARGET_ENFORCED_MS, bench_network_update
from tests.bench.bench_overhead import bench_overhead
from tests.bench.bench_pool import add_pool_rows, bench_pool
from tests.bench.bench_ray import add_ray_rows, bench_ray
from tests.bench.bench_redaction import bench_redaction
from tests.bench.bench_results import DEFAULT_RESULTS, Row, markdown_table, p50, p90, write_results
from tests.bench.bench_runtimes import add_runtime_rows, bench_runtimes
from tests.bench.bench_scale import add_create_rows, add_scale_rows, bench_create, bench_scale
from tests.bench.bench_snapshot_archive import add_snapshot_archive_rows, bench_snapshot_archive
from tests.bench.bench_telemetry import add_telemetry_rows, bench_telemetry
from tests.bench.bench_templates import add_template_rows, bench_templates
from tests.bench.bench_undo import add_undo_rows, bench_undo

MIN_SAMPLES = 30
MIB = 1 << 20
TIMES = "\N{MULTIPLICATION SIGN}"
MB = 1_000_000
BENCH_LABEL = "callbox.bench"
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory/docker")

# The project's performance targets checked by this benchmark.
TARGET_EXEC_P50_MS = 1.2
TARGET_COLD_START_FACTOR = 1.15
TARGET_STREAM_FACTOR = 1.5
TARGET_IDLE_MEMORY_MIB = 20.0
TARGET_OVERHEAD_P50_MS = 0.3

SECTIONS = ["roundtrip", "cold", "stream", "memory", "overhead", "network", "redaction", "living", "e2b",
            "interpreter", "desktop", "undo", "pool", "burst", "create", "door", "runtimes", "telemetry", "ray",
            "templates", "memsnap", "archive", "eval", "scale"]
DEFAULT_SECTIONS = [s for s in SECTIONS if s != "scale"]
"""``make bench``: all but the scale probe (``make bench-scale``, or ``--only scale``)."""
DEFAULT_SCALE_SANDBOXES = 100


LOAD_SEEN: list[float] = []  # 1-minute load average at every progress line: how busy the machine was


def progress(message: str) -> None:
    LOAD_SEEN.append(os.getloadavg()[0])
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the machine ------------------------------------------------------------------------


def machine_info(client: docker.DockerClient) -> dict[str, Any]:
    cpu_model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    version = client.version()
    try:
        running = len(client.api.containers(filters={"status": "running"}))
    except docker.errors.DockerException:
        running = -1
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_total_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "docker_server": version.get("Version", "?"),
        "docker_api": version.get("ApiVersion", "?"),
        "cgroup": "v1" if CGROUP_V1_MEMORY.is_dir() else ("v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists()
                                                          else "?"),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "docker_py": docker.__version__,
        "loadavg_start": os.getloadavg(),
        "running_containers_start": running,
    }


def machine_markdown(info: dict[str, Any]) -> str:
    load = " ".join(f"{x:.2f}" for x in info["loadavg_start"])
    end = info.get("loadavg_end")
    load_end = " ".join(f"{x:.2f}" for x in end) if end else "?"
    return "\n".join([
        f"- date: {info['date']}",
        f"- machine: {info['nproc']} CPUs ({info['cpu_model']}), "
        f"{info['memory_total_bytes'] / (1 << 30):.1f} GiB memory, kernel {info['kernel']}",
        f"- Docker server {info['docker_server']} (API {info['docker_api']}), cgroup {info['cgroup']}; "
        f"Python {info['python']}, grpcio {info['grpcio']}, docker-py {info['docker_py']}",
        f"- load average at start {load}, at end {load_end}, highest 1-min value seen during the run "
        f"{info.get('loadavg_max_1min', 0):.2f} ({info['nproc']} CPUs; other work on the machine shows here); "
        f"running containers at start (before this run's): {info['running_containers_start']}",
    ])


# ---- resources this run owns --------------------------------------------------------------


class Resources:
    """Everything the run starts, so ``finally`` can remove it whatever happened."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine
        self.sandboxes: dict[str, Sandbox] = {}
        self.container_names: set[str] = set()
        self.mount_root = Path(tempfile.mkdtemp(prefix="callbox-bench-"))

    def create_sandbox(self, spec: SandboxSpec) -> Sandbox:
        box = self.engine.create(spec)
        self.sandboxes[box.id] = box
        return box

    def destroy_sandbox(self, box: Sandbox) -> None:
        self.sandboxes.pop(box.id, None)
        box.destroy()

    def new_container_name(self) -> str:
        name = f"callbox-bench-{uuid.uuid4().hex[:12]}"
        self.container_names.add(name)
        return name

    def remove_container(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.engine.client.api.remove_container(name, force=True, v=True)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # removal already in progress
                    raise
        self.container_names.discard(name)

    def cleanup(self) -> None:
        self.release()
        self.engine.drain(60)  # destroys remove in the background: not half-created, just pending
        self._remove_half_created()
        shutil.rmtree(self.mount_root, ignore_errors=True)

    def release(self) -> None:
        """Destroy the sandboxes and remove the containers started so far (the run goes on)."""
        for box in list(self.sandboxes.values()):
            try:
                self.destroy_sandbox(box)
            except Exception as exc:  # keep cleaning up the rest
                progress(f"cleanup: could not destroy sandbox {box.id}: {exc}")
        for name in list(self.container_names):
            try:
                self.remove_container(name)
            except Exception as exc:
                progress(f"cleanup: could not remove container {name}: {exc}")

    def _remove_half_created(self) -> None:
        """Sandboxes of this process that ``create`` never returned (interrupted mid-create).

        Found by the owner label, which names this process (host, pid, start time), so
        other sessions' sandboxes on the same engine are never touched.
        """
        try:
            found = self.engine.client.api.containers(
                all=True, filters={"label": f"{labels.OWNER}={self.engine.owner.label()}"})
        except docker.errors.DockerException as exc:
            progress(f"cleanup: could not list this run's sandboxes: {exc}")
            return
        for c in found:
            sandbox_id = (c.get("Labels") or {}).get(labels.SANDBOX_ID, "")
            progress(f"cleanup: removing half-created sandbox {sandbox_id or c['Id'][:12]}")
            try:
                if sandbox_id:
                    self.engine.destroy(sandbox_id)
                else:
                    self.remove_container(c["Id"])
            except Exception as exc:
                progress(f"cleanup: could not remove {c['Id'][:12]}: {exc}")


def hardened_run_kwargs(spec: SandboxSpec, bind_dir: Path) -> dict[str, Any]:
    """The container settings of ``DockerEngine._run_container``, minus the agent."""
    return {
        "hostname": "sandbox",
        "init": True,
        "user": "0:0",
        "environment": {},
        "labels": {BENCH_LABEL: "1"},
        "cap_drop": ["ALL"],
        "cap_add": ["SETUID", "SETGID", "KILL"],
        "security_opt": ["no-new-privileges:true", f"seccomp={seccomp_profile()}"],
        "read_only": True,
        # The sandbox's own scratch tmpfs (sizes, exec/noexec, owner), from the spec itself.
        "tmpfs": {place: spec.tmpfs_options(place, TOOL_UID, TOOL_GID) for place in spec.scratch_tmpfs()},
        "shm_size": spec.shm_size,
        "mounts": [DockerMount(AGENT_DIR, str(bind_dir), type="bind", propagation="rprivate")],
        "network_mode": "none",
        "ipc_mode": "private",
        "pids_limit": spec.pids,
        "mem_limit": spec.memory,
        "memswap_limit": spec.memory,
        "nano_cpus": int(spec.cpus * 1e9),
        "ulimits": [
            Ulimit(name="nofile", soft=spec.nofile, hard=spec.nofile),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=spec.fsize, hard=spec.fsize),
        ],
        "privileged": False,
    }


# ---- measuring ------------------------------------------------------------------------------

Case = Callable[[], dict[str, float]]


def interleaved(label: str, cases: list[Case], samples: int, warmup: int,
                every: int = 10) -> dict[str, list[float]]:
    """Run the cases alternately (rotating which goes first); collect each named figure."""
    for i in range(warmup):
        for case in cases:
            case()
        progress(f"{label}: warm-up {i + 1}/{warmup}")
    out: dict[str, list[float]] = {}
    for i in range(samples):
        order = cases[i % len(cases):] + cases[:i % len(cases)]
        for case in order:
            for name, value in case().items():
                out.setdefault(name, []).append(value)
        if (i + 1) % every == 0 or i + 1 == samples:
            summary = ", ".join(f"{k} p50 {p50(v):.2f}" for k, v in out.items())
            progress(f"{label}: {i + 1}/{samples} ({summary})")
    return out


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def checked(result: ExecResult, what: str) -> ExecResult:
    if result.exit_code != 0 or result.signal or result.timed_out:
        raise RuntimeError(f"{what}: unexpected result {result.to_json()}")
    return result


def bench_round_trip(box: Sandbox, samples: int, warmup: int) -> dict[str, list[float]]:
    container = box.container
    agent_durations: list[float] = []

    def cb_exec() -> dict[str, float]:
        # What the harness calls for a command whose output it does not watch as it comes.
        t0 = time.perf_counter_ns()
        result = collect(box.agent.exec_buffered(["true"]))
        elapsed = ms_since(t0)
        checked(result, "exec true")
        agent_durations.append(result.duration_ms)
        return {"callbox_exec": elapsed}

    def cb_exec_stream() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        result = collect(box.agent.exec(["true"]))
        elapsed = ms_since(t0)
        checked(result, "exec true (streamed)")
        return {"callbox_exec_stream": elapsed}

    def cb_health() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box.agent.health()
        return {"callbox_health": ms_since(t0)}

    def docker_exec_run() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        result = container.exec_run(["true"])
        elapsed = ms_since(t0)
        if result.exit_code != 0:
            raise RuntimeError(f"docker exec_run true exited {result.exit_code}")
        return {"docker_exec_run": elapsed}

    def host_true() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        subprocess.run(["true"], check=True)
        return {"host_subprocess_true": ms_since(t0)}

    out = interleaved("round trip", [cb_exec, docker_exec_run, cb_health, host_true], samples, warmup)
    out["agent_exec_duration"] = agent_durations[-samples:]
    # The same calls back to back: no idle gap (and no other client's traffic) between two
    # calls of one kind, so the CPUs stay awake; the interleaved figures include wake-ups.
    for case in (cb_exec, docker_exec_run, cb_health, cb_exec_stream):
        block = interleaved("round trip, back to back", [case], samples, warmup)
        for name, values in block.items():
            out[f"{name}_b2b"] = values
        if case is cb_exec:
            out["agent_exec_duration_b2b"] = agent_durations[-samples:]
    return out


def bench_cold_start(res: Resources, spec: SandboxSpec, samples: int, warmup: int) -> dict[str, list[float]]:
    client = res.engine.client
    bind_dir = res.mount_root / "cold"
    bind_dir.mkdir(mode=0o700)
    kwargs = hardened_run_kwargs(spec, bind_dir)

    def callbox_create() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box = res.create_sandbox(spec)
        ready = ms_since(t0)
        checked(collect(box.agent.exec(["true"])), "first exec")
        first = ms_since(t0)
        res.destroy_sandbox(box)  # untimed
        return {"callbox_ready": ready, "callbox_first_result": first}

    def docker_run_rm() -> dict[str, float]:
        name = res.new_container_name()
        t0 = time.perf_counter_ns()
        client.containers.run(spec.image, entrypoint=["true"], name=name, remove=True, **kwargs)
        elapsed = ms_since(t0)
        res.remove_container(name)  # normally already gone; keeps the bookkeeping exact
        return {"docker_run_rm": elapsed}

    def docker_run_keep() -> dict[str, float]:
        name = res.new_container_name()
        t0 = time.perf_counter_ns()
        container: Container = client.containers.run(spec.image, entrypoint=["true"], name=name, detach=True,
                                                      **kwargs)
        status = container.wait()
        elapsed = ms_since(t0)
        res.remove_container(name)  # untimed
        if status.get("StatusCode") != 0:
            raise RuntimeError(f"docker run true exited {status}")
        return {"docker_run_untimed_rm": elapsed}

    return interleaved("cold start", [callbox_create, docker_run_rm, docker_run_keep], samples, warmup, every=5)


def bench_network_start(res: Resources, spec: SandboxSpec, samples: int, warmup: int) -> dict[str, list[float]]:
    """Create → first result in each network mode, interleaved (nothing is sent anywhere)."""
    modes = {
        "start_none": spec,
        "start_open": spec.model_copy(update={"network": "open"}),
        "start_allowlist": spec.model_copy(update={"network": "allowlist", "allow_hosts": ("example.com",)}),
    }

    def case(name: str, mode_spec: SandboxSpec) -> Case:
        def run() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            box = res.create_sandbox(mode_spec)
            checked(collect(box.agent.exec(["true"])), f"first exec ({name})")
            elapsed = ms_since(t0)
            res.destroy_sandbox(box)  # untimed
            return {name: elapsed}
        return run

    return interleaved("network modes", [case(n, s) for n, s in modes.items()], samples, warmup, every=5)


def bench_stream(box: Sandbox, size: int, samples: int, warmup: int) -> dict[str, list[float]]:
    api = box.engine.client.api
    argv = ["head", "-c", str(size), "/dev/zero"]

    def callbox_stream() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        result = collect(box.agent.exec(argv, output_cap_bytes=2 * size, rpc_timeout=300))
        elapsed = ms_since(t0)
        checked(result, "stream")
        got = len(result.stdout.head) + len(result.stdout.tail)
        if got != size or result.stdout.total_bytes != size or result.stdout.dropped_bytes:
            raise RuntimeError(f"callbox stream: got {got} of {size} bytes "
                               f"(total {result.stdout.total_bytes}, dropped {result.stdout.dropped_bytes})")
        return {"callbox_stream": elapsed}

    def docker_stream() -> dict[str, float]:
        # The same work as callbox's collect: every chunk kept, in one growing buffer.
        t0 = time.perf_counter_ns()
        exec_id = api.exec_create(box.container.id, argv, stdout=True, stderr=True)["Id"]
        kept = bytearray()
        for chunk in api.exec_start(exec_id, stream=True):
            kept.extend(chunk)
        got = len(kept)
        elapsed = ms_since(t0)
        if got != size:
            raise RuntimeError(f"docker-py exec stream: got {got} of {size} bytes")
        return {"docker_stream": elapsed}

    return interleaved("stream", [callbox_stream, docker_stream], samples, warmup, every=5)


# ---- memory ------------------------------------------------------------------------------


def memory_reading(client: docker.DockerClient, container: Container, child_hint: str) -> dict[str, float]:
    """Cgroup usage, the main process (docker-init's child) and the shim of one container."""
    container.reload()
    init_pid = int(container.attrs["State"]["Pid"])
    init = psutil.Process(init_pid)
    children = [p for p in init.children() if child_hint in " ".join(p.cmdline())]
    if len(children) != 1:
        raise RuntimeError(f"{container.name}: expected one {child_hint!r} child of docker-init, got {children}")
    main = children[0].memory_full_info()
    parent = init.parent()
    shim = parent.memory_full_info() if parent is not None else None
    # PSS splits pages shared between processes (the python binary, libraries, the shim's
    # text) among them: the fair per-sandbox share. USS counts only private pages.
    reading = {"main_rss": float(main.rss), "main_pss": float(main.pss), "main_uss": float(main.uss),
               "shim_pss": float(shim.pss) if shim else math.nan, "shim_uss": float(shim.uss) if shim else math.nan,
               "init_pss": float(init.memory_full_info().pss)}
    container_id = str(container.id)
    cgroup = CGROUP_V1_MEMORY / container_id
    if cgroup.is_dir():
        reading["cgroup_usage"] = float((cgroup / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
        reading["cgroup_rss"] = float(stat["total_rss"])
        reading["cgroup_cache"] = float(stat["total_cache"])
    else:  # cgroup v2 or another layout: the engine's stats API
        stats = client.api.stats(container_id, stream=False, one_shot=True)
        reading["cgroup_usage"] = float(stats["memory_stats"]["usage"])
    return reading


def bench_memory(res: Resources, spec: SandboxSpec, samples: int, quick: bool) -> dict[str, list[float]]:
    n_containers = 2 if quick else 5
    rounds = math.ceil(samples / n_containers)
    client = res.engine.client
    boxes: list[Sandbox] = []
    bare: list[Container] = []
    progress(f"memory: starting {n_containers} sandboxes and {n_containers} bare `sleep infinity` containers")
    for i in range(n_containers):
        box = res.create_sandbox(spec)
        checked(collect(box.agent.exec(["true"])), "memory warm-up exec")  # idle after one call, not pristine
        boxes.append(box)
        bind_dir = res.mount_root / f"bare{i}"
        bind_dir.mkdir(mode=0o700)
        name = res.new_container_name()
        bare.append(client.containers.run(spec.image, entrypoint=["sleep", "infinity"], name=name, detach=True,
                                          **hardened_run_kwargs(spec, bind_dir)))
    out: dict[str, list[float]] = {}
    for r in range(rounds):
        if r:
            time.sleep(1.0)  # spread the readings over time (not a readiness wait: all are long up)
        for prefix, containers, hint in (("callbox", [b.container for b in boxes], "agent.py"),
                                         ("bare", bare, "sleep")):
            for container in containers:
                for key, value in memory_reading(client, container, hint).items():
                    out.setdefault(f"{prefix}_{key}", []).append(value)
        cb_mib, bare_mib = p50(out["callbox_cgroup_usage"]) / MIB, p50(out["bare_cgroup_usage"]) / MIB
        progress(f"memory: round {r + 1}/{rounds}: cgroup usage p50 callbox {cb_mib:.1f} MiB, bare {bare_mib:.1f} MiB")
    for key in ("callbox", "bare"):
        # docker-init and the agent are inside the container's cgroup already; the shim is not.
        cg, shim = out[f"{key}_cgroup_usage"], out[f"{key}_shim_pss"]
        out[f"{key}_host_total"] = [c + s for c, s in zip(cg, shim, strict=True)]
    for box in boxes:
        res.destroy_sandbox(box)
    for container in bare:
        res.remove_container(str(container.name))
    return out


# ---- main ------------------------------------------------------------------------------------


def build_rows(data: dict[str, list[float]], stream_size: int, memory_samples: str,
               ray_skipped: dict[str, str] | None = None) -> list[Row]:
    rows: list[Row] = []

    def add(*args: Any, **kwargs: Any) -> None:
        rows.append(Row(*args, **kwargs))

    if "callbox_exec" in data:
        add("1. exec round trip of `true`, live sandbox", "time", data["callbox_exec"],
            "docker-py `exec_run` (same container)", data["docker_exec_run"],
            f"p50 ≤ {TARGET_EXEC_P50_MS:g} ms", lambda r: r.cb(p50) <= TARGET_EXEC_P50_MS)
        add("1b. exec round trip of `true`, back to back", "time", data["callbox_exec_b2b"],
            "docker-py `exec_run`, back to back", data["docker_exec_run_b2b"],
            f"p50 ≤ {TARGET_EXEC_P50_MS:g} ms", lambda r: r.cb(p50) <= TARGET_EXEC_P50_MS)
    if "callbox_ready" in data:
        factor = TARGET_COLD_START_FACTOR
        add("2a. cold start: create → agent ready", "time", data["callbox_ready"],
            "hardened `docker run --rm IMAGE true` (docker-py)", data["docker_run_rm"], "— (info)")
        add("2b. cold start: create → first result", "time", data["callbox_first_result"],
            "hardened `docker run --rm IMAGE true` (docker-py)", data["docker_run_rm"],
            f"p50 ≤ {factor:g}{TIMES} baseline", lambda r: r.cb(p50) <= factor * (r.base(p50) or 0))
        add("2c. cold start: create → first result", "time", data["callbox_first_result"],
            "hardened docker run, create+start+wait (removal untimed)", data["docker_run_untimed_rm"],
            f"p50 ≤ {factor:g}{TIMES} baseline", lambda r: r.cb(p50) <= factor * (r.base(p50) or 0))
    if "callbox_stream" in data:
        mib = stream_size // MIB
        add(f"3. stream sandbox → harness, `head -c {mib}M /dev/zero`", "rate", data["callbox_stream"],
            "docker-py exec stream (exec_create + exec_start(stream=True)), its bytes kept as callbox's are",
            data["docker_stream"],
            f"≥ {TARGET_STREAM_FACTOR:g}{TIMES} baseline",
            lambda r: r.cb(p50) >= TARGET_STREAM_FACTOR * (r.base(p50) or math.inf), rate_bytes=stream_size)
    if "callbox_cgroup_usage" in data:
        target = f"≤ {TARGET_IDLE_MEMORY_MIB:g} MiB"
        limit = TARGET_IDLE_MEMORY_MIB * MIB
        add(f"4a. memory per idle sandbox: container cgroup usage ({memory_samples})", "mem",
            data["callbox_cgroup_usage"], "bare container, same image, `sleep infinity`", data["bare_cgroup_usage"],
            target, lambda r: r.cb(p50) <= limit)
        add("4b. memory per idle sandbox: cgroup usage + containerd-shim PSS (host cost)", "mem",
            data["callbox_host_total"], "bare container, same image, `sleep infinity`", data["bare_host_total"],
            target, lambda r: r.cb(p50) <= limit)
        add("4c. memory: agent process RSS (host view)", "mem", data["callbox_main_rss"],
            "`sleep` process RSS in the bare container", data["bare_main_rss"], "— (info)")
        add("4d. memory: agent process PSS (host view)", "mem", data["callbox_main_pss"],
            "`sleep` process PSS in the bare container", data["bare_main_pss"], "— (info)")
    if "start_open" in data:
        add("7a. cold start, network open (own bridge + packet filter): create → first result", "time",
            data["start_open"], "the same, network none (interleaved)", data["start_none"], "— (info)")
        add("7b. cold start, network allowlist (+ egress proxy container): create → first result", "time",
            data["start_allowlist"], "the same, network none (interleaved)", data["start_none"], "— (info)")
    if "network_update_enforced" in data:
        add("7c. network rules changed (update_network) until enforced: call returned → a request passes them",
            "time", data["network_update_enforced"], "—", None, f"p90 ≤ {TARGET_ENFORCED_MS:g} ms",
            lambda r: r.cb(p90) <= TARGET_ENFORCED_MS)
    if "egress_ask_after_answer" in data:
        add("7d. egress held for a person (ask), allowed once: answer recorded → response (proxy in-process)",
            "time", data["egress_ask_after_answer"], "the same request to an allow entry (no hold)",
            data["egress_plain_request"], f"p90 ≤ {TARGET_ADDED_MS:g} ms", lambda r: r.cb(p90) <= TARGET_ADDED_MS)
    add_egress_tls_rows(data, add)
    if "harness_overhead" in data:
        add("6. harness overhead per call: validate + authorize + audit (no sandbox)", "time",
            data["harness_overhead"], "—", None, f"p50 ≤ {TARGET_OVERHEAD_P50_MS:g} ms",
            lambda r: r.cb(p50) <= TARGET_OVERHEAD_P50_MS)
        add("6a. of which argument validation", "time", data["validate_only"], "—", None, "— (info)")
    add_audit_chain_rows(data, add)
    if "redaction_call_on_16k" in data:
        for size, label in (("16k", "16 KiB"), ("1m", "1 MiB")):
            add(f"8{'ab'[size == '1m']}. call with secret redaction, {label} tool output (no sandbox)", "time",
                data[f"redaction_call_on_{size}"], "the same call path, redaction off",
                data[f"redaction_call_off_{size}"], "— (info)")
        add("8c. of which `Redactor.redact` alone, 16 KiB / 1 MiB", "time", data["redaction_only_16k"], "—", None,
            f"— (info; 1 MiB: p50 {p50(data['redaction_only_1m']):.2f} ms)")
    add_living_rows(data, add)
    add_e2b_rows(data, add)
    add_interpreter_rows(data, add)
    add_desktop_rows(data, add)
    add_undo_rows(data, add)
    add_memsnap_rows(data, add)
    add_pool_rows(data, add)
    add_burst_rows(data, add)
    add_create_rows(data, add)
    add_door_rows(data, add)
    add_runtime_rows(data, add)
    add_scale_rows(data, add)
    add_telemetry_rows(data, add)
    add_ray_rows(data, add, ray_skipped or {})
    add_template_rows(data, add)
    add_snapshot_archive_rows(data, add)
    add_eval_rows(data, add)
    if "callbox_exec_stream_b2b" in data:
        add("1c. exec round trip of `true` through the streamed Exec, back to back", "time",
            data["callbox_exec_stream_b2b"], "docker-py `exec_run`, back to back", data["docker_exec_run_b2b"],
            "— (info)")
    if "callbox_health" in data:
        add("5a. floor: gRPC unary Health/Check on the agent socket (interleaved)", "time",
            data["callbox_health"], "—", None, "— (info)")
        add("5b. floor: gRPC unary Health/Check on the agent socket (back to back)", "time",
            data["callbox_health_b2b"], "—", None, "— (info)")
        add("5c. floor: agent-side spawn → exit of `true` (Exited.duration, back to back)", "time",
            data["agent_exec_duration_b2b"], "host `subprocess.run(['true'])` in the harness",
            data["host_subprocess_true"], "— (info)")
    return rows


def report(info: dict[str, Any], args: argparse.Namespace, rows: list[Row], data: dict[str, list[float]]) -> str:
    parts = [
        "# callbox benchmark against the performance targets, measured side by side in one run",
        "",
        machine_markdown(info),
        f"- samples per figure: {args.samples} (after {args.warmup} uncounted warm-up iterations); "
        f"callbox and baseline samples interleaved{'; QUICK smoke run, not a measurement' if args.quick else ''}",
        f"- run time {info.get('total_seconds', 0):.0f} s; per section: "
        + ", ".join(f"{name} {sec:.0f} s" for name, sec in info.get("section_seconds", {}).items()),
        "",
        markdown_table(rows),
        "",
        *[f"**Section {name} failed, its rows are missing:** {why}\n" for name, why in info.get("failed_sections",
                                                                                              {}).items()],
        "ratio: baseline p50 / callbox p50 for times (how many times faster callbox is); "
        "callbox / baseline for throughput (how many times more) and memory (how many times bigger). "
        "Throughput p50/p90 are the stream size over the p50/p90 time, so p90 is the slow tail; "
        "1 MB = 10^6 bytes. Every streamed byte is counted and checked on both sides.",
    ]
    if "callbox_cgroup_usage" in data:
        def mib(key: str) -> str:
            return f"{p50(data[key]) / MIB:.1f}"

        detail = [
            "",
            "Memory detail (p50, MiB): "
            f"callbox cgroup usage {mib('callbox_cgroup_usage')}",
        ]
        if "callbox_cgroup_rss" in data:
            detail.append(f" (anon rss {mib('callbox_cgroup_rss')}, page cache {mib('callbox_cgroup_cache')})")
        detail.append(f", agent RSS/PSS/USS {mib('callbox_main_rss')}/{mib('callbox_main_pss')}/"
                      f"{mib('callbox_main_uss')}, docker-init PSS {mib('callbox_init_pss')}, "
                      f"containerd-shim PSS/USS {mib('callbox_shim_pss')}/{mib('callbox_shim_uss')}; "
                      f"bare container cgroup usage {mib('bare_cgroup_usage')}, "
                      f"shim PSS/USS {mib('bare_shim_pss')}/{mib('bare_shim_uss')}. "
                      "Sandboxes are measured idle after one `true` call. Page cache of image files is charged to "
                      "the first cgroup that reads them, so it shows up in few containers; the median ignores it.")
        parts.append("".join(detail))
    return "\n".join(parts) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_exec", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=MIN_SAMPLES,
                        help=f"samples per figure (at least {MIN_SAMPLES} unless --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="uncounted warm-up iterations (default 5, 2 "
                        "for cold start and streaming)")
    parser.add_argument("--quick", action="store_true", help="smoke run: few samples, small stream, no minimum")
    parser.add_argument("--json", metavar="PATH", default=DEFAULT_RESULTS,
                        help="where to write the results as JSON: one object per row, the raw samples, the "
                        "table (default: %(default)s in the directory the run is started from)")
    parser.add_argument("--stream-mib", type=int, default=None, help="stream size in MiB (default 64; 8 with --quick)")
    parser.add_argument("--image", default=SandboxSpec().image, help="sandbox image (default %(default)s)")
    parser.add_argument("--only", action="append",
                        choices=SECTIONS,
                        help="run only these sections (repeatable); the default is all but scale")
    parser.add_argument("--sandboxes", type=int, default=DEFAULT_SCALE_SANDBOXES, metavar="N",
                        help="live sandboxes of the scale probe (section scale; default %(default)s)")
    args = parser.parse_args(argv)
    if args.quick:
        if args.samples == MIN_SAMPLES:
            args.samples = 5
    elif args.samples < MIN_SAMPLES:
        parser.error(f"--samples must be at least {MIN_SAMPLES} (use --quick for a smoke run)")
    if args.warmup is None:
        args.warmup = 1 if args.quick else 5
    if args.stream_mib is None:
        args.stream_mib = 8 if args.quick else 64
    return args


def _sigterm_to_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sections = set(args.only or DEFAULT_SECTIONS)
    engine = DockerEngine.connect(reap_on_start=False)  # leave other sessions' sandboxes alone
    try:
        engine.client.images.get(args.image)
    except docker.errors.ImageNotFound:
        print(f"image {args.image} is missing: run `make image` (or `.venv/bin/callbox image build`)", file=sys.stderr)
        return 2
    spec = SandboxSpec(image=args.image)
    info = machine_info(engine.client)
    res = Resources(engine)
    data: dict[str, list[float]] = {}
    slow_warmup = min(args.warmup, 2)
    started = time.monotonic()
    kit = Toolkit(progress, interleaved, hardened_run_kwargs)
    ray_skipped: dict[str, str] = {}  # the Ray rows that could not be measured here, and why

    def live_box_rows() -> dict[str, list[float]]:
        progress("starting the live sandbox for the round-trip and streaming rows")
        box = res.create_sandbox(spec)
        out: dict[str, list[float]] = {}
        if "roundtrip" in sections:
            out.update(bench_round_trip(box, args.samples, args.warmup))
        if "stream" in sections:
            out.update(bench_stream(box, args.stream_mib * MIB, args.samples, slow_warmup))
        res.destroy_sandbox(box)
        return out

    def network_rows() -> dict[str, list[float]]:
        held = bench_egress_ask(args.samples, args.warmup, progress)  # no Docker: the proxy runs in-process
        problem = engine.networks.packet_filter.problem()
        if problem is not None:
            progress(f"network modes skipped: {problem}")
            return held
        out = {**held, **bench_network_start(res, spec, args.samples, slow_warmup)}
        out.update(bench_network_update(res.create_sandbox, res.destroy_sandbox, spec, args.samples, args.warmup,
                                        progress))
        out.update(bench_egress_tls(engine, spec, args.samples, progress))
        return out

    def overhead_rows() -> dict[str, list[float]]:
        progress("harness overhead per call (no sandbox)")
        out = bench_overhead(max(args.samples, 1000), 100)
        progress("the audit chain's cost per call, chained vs unchained store (no sandbox)")
        out.update(bench_audit_chain(max(args.samples, 2000), 200))
        return out

    def telemetry_rows() -> dict[str, list[float]]:
        progress("metrics and tracing per call, on vs off (no sandbox)")
        return bench_telemetry(max(args.samples, 5000), 300)

    def redaction_rows() -> dict[str, list[float]]:
        progress("secret redaction per call (no sandbox)")
        return bench_redaction(max(args.samples, 300), 20)

    # In order; a section that fails is reported and the run goes on with the next one.
    plan: list[tuple[str, bool, Callable[[], dict[str, list[float]]]]] = [
        ("roundtrip+stream", bool(sections & {"roundtrip", "stream"}), live_box_rows),
        ("cold", "cold" in sections, lambda: bench_cold_start(res, spec, args.samples, slow_warmup)),
        ("memory", "memory" in sections, lambda: bench_memory(res, spec, args.samples, args.quick)),
        ("network", "network" in sections, network_rows),
        ("overhead", "overhead" in sections, overhead_rows),
        ("redaction", "redaction" in sections, redaction_rows),
        ("living", "living" in sections,
         lambda: bench_living(res, spec, args.samples, args.warmup, kit, quick=args.quick)),
        ("e2b", "e2b" in sections, lambda: bench_e2b(res, spec, args.samples, args.warmup, kit, quick=args.quick)),
        ("interpreter", "interpreter" in sections,
         lambda: bench_interpreter(res, args.samples, args.warmup, kit, quick=args.quick)),
        ("desktop", "desktop" in sections, lambda: bench_desktop(res, args.samples, args.warmup, kit)),
        ("undo", "undo" in sections, lambda: bench_undo(res, spec, args.samples, args.warmup, kit)),
        ("pool", "pool" in sections, lambda: bench_pool(res, args.samples, kit, quick=args.quick)),
        ("burst", "burst" in sections, lambda: bench_burst(res, kit, quick=args.quick)),
        ("create", "create" in sections, lambda: bench_create(res, spec, args.samples, kit, quick=args.quick)),
        ("door", "door" in sections, lambda: bench_door(res, spec, kit, quick=args.quick)),
        ("runtimes", "runtimes" in sections, lambda: bench_runtimes(res, args.samples, progress)),
        ("telemetry", "telemetry" in sections, telemetry_rows),
        ("ray", "ray" in sections,
         lambda: bench_ray(res, spec, kit, data, ray_skipped, samples=args.samples, warmup=args.warmup,
                           quick=args.quick)),
        ("templates", "templates" in sections,
         lambda: bench_templates(engine.client, spec.image, args.samples, progress)),
        ("memsnap", "memsnap" in sections, lambda: bench_memsnap(engine, args.samples, progress)),
        ("archive", "archive" in sections, lambda: bench_snapshot_archive(res, spec, args.samples, kit)),
        ("eval", "eval" in sections, lambda: bench_eval(res, args.samples, kit, quick=args.quick)),
        ("scale", "scale" in sections,
         lambda: bench_scale(res, spec, args.sandboxes, kit,
                             lambda container, hint: memory_reading(engine.client, container, hint))),
    ]
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    with sigterm_as_interrupt():
        try:
            for name, wanted, run in plan:
                if not wanted:
                    continue
                t_section = time.monotonic()
                try:
                    data.update(run())
                except Exception as exc:  # the other sections still run; the report names this one
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    progress(f"section {name} FAILED ({failed[name]}); its rows are missing, going on")
                    res.release()
                seconds[name] = round(time.monotonic() - t_section, 1)
        except KeyboardInterrupt:
            progress("interrupted: cleaning up")
            raise
        finally:
            res.cleanup()
    info["section_seconds"] = seconds
    info["failed_sections"] = failed
    info["total_seconds"] = round(time.monotonic() - started, 1)
    progress(f"done in {time.monotonic() - started:.0f} s")
    info["loadavg_end"] = os.getloadavg()
    info["loadavg_max_1min"] = max(LOAD_SEEN, default=0.0)
    n_boxes = 2 if args.quick else 5
    memory_samples = f"{n_boxes} sandboxes {TIMES} {math.ceil(args.samples / n_boxes)} readings"
    rows = build_rows(data, args.stream_mib * MIB, memory_samples, ray_skipped)
    text = report(info, args, rows, data)
    sys.stdout.write(text)
    sys.stdout.flush()
    written = write_results(Path(args.json), rows, machine=info, args=vars(args), samples=data, markdown=text)
    progress(f"results (one object per row, raw samples beside them) written to {written}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # cleanup already ran in main's finally
        print("bench interrupted; everything it started was removed", file=sys.stderr)
        sys.exit(130)
