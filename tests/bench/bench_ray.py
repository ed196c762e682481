"""``make bench`` section ``ray``: sandboxes on the Ray engine against the local Docker engine.

The section builds the real three-node test cluster of :mod:`tests.ray.cluster` (a head and two
worker nodes, w1 and w2, each with its own dockerd, in network namespaces on one bridge), joins
it with a :class:`~harness.engine.ray.engine.RayEngine`, measures, and removes the cluster in
``finally``. Each figure's baseline is measured in the same run, interleaved where both sides
can alternate:

22a. create → first result of a remote sandbox (``engine.create`` on the Ray engine, then
     ``true`` to completion), against the same on the local DockerEngine;
22b. exec round trip of ``true`` in a live remote sandbox (TLS relay on its node, across the
     bridge), p50/p95, against a local sandbox's unix socket;
22c. streaming ``head -c 100000000 /dev/zero`` out of a remote sandbox, against a local one;
22d. sandboxes per second: K creates released together (each to its first result), spread over
     both worker nodes, against the same K on one node (``placement.nodes = ["w1"]``); every
     sandbox is destroyed and its removal waited for between rounds (K fits the capacity of 8
     per node);
22e. time to detect a dead node: a worker's raylet SIGKILLed (``kill_raylet``) until the engine's
     directory drops the node (``engine.nodes()``), against Ray's own control store marking it
     dead (polled in the same loop); the node is restarted and waited for after each kill;
22f. the same kill: until a call in flight on a sandbox of that node fails with "sandbox lost
     with its node";
22g. image distribution: the connect loads the sandbox image (555 MB) into both workers, which
     start without it; MB/s per node (information, no baseline);
23a-23f. the node's relay against a Ray actor proxy, on a local Ray
     (:mod:`tests.bench.bench_ray_transport`, renumbered from its 22a-22f).

The cluster comes first, claimed while it is free; the transport rows need a local Ray of their
own, so they come once this process has left the cluster. Without ray, or not as root, or with
the cluster in use by another session, the rows that cannot be measured are replaced by one row
saying why. A part that fails is named and the others still run; the section then fails after
the rows it measured were kept.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.engine.exec_result import ExecResult, collect
from harness.engine.placement import Placement
from harness.engine.spec import SandboxSpec
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_results import MB, p50, p95

if TYPE_CHECKING:
    from harness.engine.ray.engine import RayEngine
    from harness.engine.ray.images import ImageProgress
    from tests.ray.cluster import RayTestCluster

CLUSTER_ROWS = "22"
TRANSPORT_ROWS = "23"
LOST = "sandbox lost with its node"
DEAD_WITHIN_S = 30.0
BACK_WITHIN_S = 180.0
POLL_S = 0.02
"""How often the dead-node loop asks (the cluster's state has no event to wait on)."""

Data = dict[str, list[float]]


@dataclass(frozen=True)
class RayPlan:
    """How much each Ray figure measures, from the run's ``--samples`` and ``--quick``."""

    create_samples: int
    exec_samples: int
    warmup: int
    stream_bytes: int
    stream_samples: int
    burst: int
    burst_rounds: int
    kills: int
    transport_samples: int
    transport_warmup: int

    @classmethod
    def for_run(cls, samples: int, warmup: int, quick: bool) -> RayPlan:
        if quick:
            return cls(create_samples=3, exec_samples=max(samples, 20), warmup=1, stream_bytes=16 * MB,
                       stream_samples=2, burst=4, burst_rounds=1, kills=1, transport_samples=30,
                       transport_warmup=5)
        # A remote create is a second or more on a busy 2-CPU machine, and a kill costs a node
        # restart (tens of seconds): those take fewer samples than the cheap round trips.
        return cls(create_samples=max(10, samples // 3), exec_samples=max(samples, 200), warmup=warmup,
                   stream_bytes=100 * MB, stream_samples=5, burst=8, burst_rounds=3, kills=3,
                   transport_samples=max(samples, 200), transport_warmup=20)


def renumber(label: str, number: str) -> str:
    """``label`` with the number of its key (``"22c. ..."``) replaced by ``number`` (``"23c. ..."``)."""
    return re.sub(r"^\s*[0-9]+(?=[a-z]*\.)", number, label, count=1)


def spread_text(nodes: list[str]) -> str:
    """Where a burst's sandboxes landed: ``"w1 4 + w2 4"``."""
    counts = Counter(nodes)
    return " + ".join(f"{node} {counts[node]}" for node in sorted(counts))


def worst(values: list[float]) -> str:
    """The slowest of ``values`` (ms), or that one was never seen (infinite)."""
    slowest = max(values)
    return f"{slowest:.0f} ms" if math.isfinite(slowest) else f"not within {DEAD_WITHIN_S:.0f} s"


def rate_per_s(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


# ---- can it run here ------------------------------------------------------------------------


def ray_missing() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install 'callbox[ray]')"
    return None


def cluster_unavailable() -> str | None:
    """Why the test cluster cannot be built by this run (not root, a tool missing, the cluster in
    use by another live process or brought up by hand), or None."""
    from tests.ray import leftovers
    from tests.ray.cluster import ClusterUnavailable, check_prerequisites
    from tests.ray.layout import OWNER_FILE

    try:
        check_prerequisites()
    except ClusterUnavailable as exc:
        return str(exc)
    owner = (leftovers.read(OWNER_FILE) or b"").decode().split()
    if owner == ["cli"] and leftovers.find_processes():
        return ("a Ray test cluster brought up by hand is running (`python -m tests.ray.cluster down` removes it; "
                "the bench builds its own)")
    if len(owner) == 2 and owner[0].isdigit():
        pid = int(owner[0])
        if pid not in leftovers.ancestors() and leftovers.alive(pid) and str(leftovers.start_time(pid)) == owner[1]:
            command = (leftovers.read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
            return f"the Ray test cluster is in use by process {pid} ({command.strip()[:120]}): only one may exist"
    return None


# ---- the section ------------------------------------------------------------------------------


def bench_ray(res: Resources, spec: SandboxSpec, kit: Toolkit, data: Data, skipped: dict[str, str], *,
              samples: int, warmup: int, quick: bool = False) -> Data:
    """Measure into ``data`` as each part finishes (so a later part that fails keeps the earlier
    rows); ``skipped`` gets why a group of rows was not measured. Raises at the end if a part
    failed. Returns an empty dict (everything is in ``data``).

    Ray's driver prints what the cluster reports (a raylet that died, with its log) to stdout,
    where the report goes: in this section stdout is stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        _bench_ray(res, spec, kit, data, skipped, RayPlan.for_run(samples, warmup, quick))
    return {}


def _bench_ray(res: Resources, spec: SandboxSpec, kit: Toolkit, data: Data, skipped: dict[str, str],
               plan: RayPlan) -> None:
    failures: dict[str, str] = {}

    def part(name: str, run: Callable[[], Data]) -> None:
        started = time.monotonic()
        try:
            data.update(run())
        except Exception as exc:  # the other parts still run; the section fails at the end
            failures[name] = f"{type(exc).__name__}: {exc}"
            kit.progress(f"ray: {name} FAILED ({failures[name]}); going on")
        seconds = time.monotonic() - started
        data[f"ray_seconds_{name.replace(' ', '_')}"] = [round(seconds, 1)]
        kit.progress(f"ray: {name} took {seconds:.0f} s")

    if (why := ray_missing()) is not None:
        skipped[CLUSTER_ROWS] = skipped[TRANSPORT_ROWS] = why
        kit.progress(f"ray rows skipped: {why}")
        return
    # The cluster first, while it is free (only one may exist on a machine); the transport rows
    # need a local Ray of their own, so they come once this process has left the cluster.
    if (why := cluster_unavailable()) is not None:
        skipped[CLUSTER_ROWS] = why
        kit.progress(f"ray cluster rows skipped: {why}")
    else:
        try:
            with cluster_engine(kit, data, spec.image) as (cluster, engine):
                part("create", lambda: create_rows(res, engine, spec, plan, kit))
                part("exec stream", lambda: exec_stream_rows(res, engine, spec, plan, kit))
                part("spread", lambda: spread_rows(engine, spec, plan, kit))
                part("dead node", lambda: dead_node_rows(cluster, engine, plan, kit))
        except Exception as exc:  # the cluster would not come up, or not go down
            failures["cluster"] = f"{type(exc).__name__}: {exc}"
    part("transport", lambda: transport_rows(res, spec, plan, kit))
    if failures:
        raise RuntimeError("; ".join(f"{name}: {why}" for name, why in failures.items()))


def transport_rows(res: Resources, spec: SandboxSpec, plan: RayPlan, kit: Toolkit) -> Data:
    from tests.bench.bench_ray_transport import bench_ray_transport

    kit.progress("ray: relay against actor proxy, on a local Ray and a local sandbox")
    box = res.create_sandbox(spec)
    try:
        return bench_ray_transport(box, plan.transport_samples, plan.transport_warmup, plan.stream_bytes,
                                   plan.stream_samples)
    finally:
        res.destroy_sandbox(box)


@contextlib.contextmanager
def cluster_engine(kit: Toolkit, data: Data, image: str) -> Iterator[tuple[RayTestCluster, RayEngine]]:
    """The test cluster up and a RayEngine joined to it (its image load measured into ``data``);
    everything removed afterwards, this process's Ray driver first."""
    from harness.engine.ray.engine import RayEngine
    from harness.engine.ray.images import ProgressPrinter
    from harness.engine.ray.settings import RaySettings
    from tests.ray.cluster import RayTestCluster

    cluster = RayTestCluster()
    saved = {key: os.environ.get(key) for key in cluster.driver_env()}
    loaded: list[ImageProgress] = []
    printer = ProgressPrinter()

    def progress(event: ImageProgress) -> None:
        printer(event)
        if event.state == "loaded":
            loaded.append(event)

    started = time.monotonic()
    cluster.up(owner=os.getpid())
    engine: RayEngine | None = None
    try:
        data["ray_seconds_cluster_up"] = [round(time.monotonic() - started, 1)]
        cluster.use_as_driver()
        kit.progress("ray: joining the cluster (the connect loads the sandbox image into both workers)")
        started = time.monotonic()
        settings = RaySettings(address=cluster.address, token_file=cluster.token_file, node_ip=cluster.node_ip,
                               namespace="callbox-bench", image=image)
        engine = RayEngine.connect(settings, progress=progress)
        data["ray_seconds_connect"] = [round(time.monotonic() - started, 1)]
        if loaded:
            data["ray_image_load"] = [event.seconds * 1000 for event in loaded]
            data["ray_image_bytes"] = [float(loaded[0].bytes_sent)]
        nodes = sorted(host.name for host in engine.nodes())
        if nodes != ["w1", "w2"]:
            raise RuntimeError(f"the engine sees sandbox nodes {nodes}, not w1 and w2")
        yield cluster, engine
    finally:
        try:
            if engine is not None:
                with contextlib.suppress(Exception):  # the cluster goes next, with whatever is left
                    for info in engine.list_sandboxes(stats=False):
                        engine.remove(info.sandbox_id)
                engine.close()
        finally:
            import ray

            if ray.is_initialized():  # a driver left on a GCS that went away ends its process
                ray.shutdown()
            started = time.monotonic()
            cluster.down()
            data["ray_seconds_cluster_down"] = [round(time.monotonic() - started, 1)]
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def checked(result: ExecResult, what: str) -> ExecResult:
    if result.exit_code != 0 or result.signal or result.timed_out:
        raise RuntimeError(f"{what}: unexpected result {result.to_json()}")
    return result


def create_rows(res: Resources, engine: RayEngine, spec: SandboxSpec, plan: RayPlan, kit: Toolkit) -> Data:
    def remote() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box = engine.create(spec)
        try:
            checked(collect(box.agent.exec(["true"])), f"first exec on {box.node}")
            return {"ray_create_remote": ms_since(t0)}
        finally:
            box.destroy()  # untimed

    def local() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box = res.create_sandbox(spec)
        try:
            checked(collect(box.agent.exec(["true"])), "first exec (local)")
            return {"ray_create_local": ms_since(t0)}
        finally:
            res.destroy_sandbox(box)

    return kit.interleaved("ray create → first result", [remote, local], plan.create_samples,
                           min(plan.warmup, 1), every=5)


def exec_stream_rows(res: Resources, engine: RayEngine, spec: SandboxSpec, plan: RayPlan, kit: Toolkit) -> Data:
    remote = engine.create(spec)
    local = res.create_sandbox(spec)
    try:
        kit.progress(f"ray: exec round trip and stream, remote sandbox on {remote.node}")

        def exec_on(name: str, box: Any) -> Callable[[], dict[str, float]]:
            def case() -> dict[str, float]:
                t0 = time.perf_counter_ns()
                result = collect(box.agent.exec(["true"]))
                elapsed = ms_since(t0)
                checked(result, f"exec true ({name})")
                return {f"ray_exec_{name}": elapsed}
            return case

        size = plan.stream_bytes
        argv = ["head", "-c", str(size), "/dev/zero"]

        def stream_on(name: str, box: Any) -> Callable[[], dict[str, float]]:
            def case() -> dict[str, float]:
                t0 = time.perf_counter_ns()
                result = collect(box.agent.exec(argv, output_cap_bytes=2 * size, rpc_timeout=300))
                elapsed = ms_since(t0)
                checked(result, f"stream ({name})")
                got = len(result.stdout.head) + len(result.stdout.tail)
                if got != size or result.stdout.total_bytes != size or result.stdout.dropped_bytes:
                    raise RuntimeError(f"stream ({name}): got {got} of {size} bytes")
                return {f"ray_stream_{name}": elapsed}
            return case

        out = kit.interleaved("ray exec round trip", [exec_on("remote", remote), exec_on("local", local)],
                              plan.exec_samples, plan.warmup, every=100)
        out.update(kit.interleaved("ray stream", [stream_on("remote", remote), stream_on("local", local)],
                                   plan.stream_samples, 1, every=plan.stream_samples))
        out["ray_stream_bytes"] = [float(size)]
        return out
    finally:
        remote.destroy()
        res.destroy_sandbox(local)


def burst(engine: RayEngine, spec: SandboxSpec, count: int) -> tuple[float, list[float], list[str]]:
    """``count`` creates released together, each to its first result: sandboxes per second of
    the wall time, each one's time (ms), and its node. All destroyed (removal waited for) after."""
    gate = threading.Barrier(count + 1)
    boxes: list[Any] = []
    lock = threading.Lock()

    def one() -> float:
        gate.wait(60)
        t0 = time.perf_counter_ns()
        box = engine.create(spec)
        with lock:
            boxes.append(box)
        checked(collect(box.agent.exec(["true"])), f"first exec on {box.node}")
        return ms_since(t0)

    try:
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(one) for _ in range(count)]
            gate.wait(60)
            t0 = time.perf_counter_ns()
            times = [f.result() for f in futures]
            wall = ms_since(t0) / 1000
        return rate_per_s(count, wall), times, [box.node for box in boxes]
    finally:
        for box in boxes:
            with contextlib.suppress(Exception):
                box.destroy()
        engine.drain(60)


def spread_rows(engine: RayEngine, spec: SandboxSpec, plan: RayPlan, kit: Toolkit) -> Data:
    one_node = spec.model_copy(update={"placement": spec.placement.model_copy(update={"nodes": ("w1",)})})
    out: Data = {"ray_burst": [float(plan.burst)]}
    spreads: list[str] = []
    for i in range(plan.burst_rounds):
        order = [("2nodes", spec), ("1node", one_node)]
        for mode, mode_spec in order if i % 2 == 0 else order[::-1]:
            rate, times, nodes = burst(engine, mode_spec, plan.burst)
            if mode == "1node" and set(nodes) != {"w1"}:
                raise RuntimeError(f"placement nodes=[w1] put sandboxes on {spread_text(nodes)}")
            if mode == "2nodes":
                spreads.append(spread_text(nodes))
                out.setdefault("ray_burst_w1_share", []).append(nodes.count("w1") / len(nodes))
            out.setdefault(f"ray_rate_{mode}", []).append(rate)
            out.setdefault(f"ray_burst_ms_{mode}", []).extend(times)
            kit.progress(f"ray: {plan.burst} creates on {mode} ({spread_text(nodes)}): {rate:.2f} sandboxes/s")
    return out


def dead_node_rows(cluster: RayTestCluster, engine: RayEngine, plan: RayPlan, kit: Toolkit) -> Data:
    out: Data = {}
    for i in range(plan.kills):
        node = ("w1", "w2")[i % 2]
        for name, value in one_kill(cluster, engine, node, kit).items():
            out.setdefault(name, []).append(value)
    return out


def one_kill(cluster: RayTestCluster, engine: RayEngine, node: str, kit: Toolkit) -> dict[str, float]:
    """SIGKILL ``node``'s raylet with a call in flight on a sandbox there; when each side saw it
    (ms after the kill; infinite when it did not within DEAD_WITHIN_S, or the call ended without
    saying its sandbox was lost); then the node restarted and back in the engine's placement."""
    box = engine.create(SandboxSpec(placement=Placement(nodes=(node,))))
    started = threading.Event()
    ended: list[tuple[int, str]] = []

    def in_flight() -> None:
        try:
            for event in box.agent.exec(["sh", "-c", "echo started; exec sleep 300"], rpc_timeout=120):
                if event.WhichOneof("event") == "output" and b"started" in event.output.stdout:
                    started.set()
            ended.append((time.perf_counter_ns(), "the call ended normally"))
        except Exception as exc:
            ended.append((time.perf_counter_ns(), str(exc)))

    caller = threading.Thread(target=in_flight, name="ray-bench-in-flight", daemon=True)
    caller.start()
    seen: dict[str, float] = {}
    try:
        if not started.wait(60):
            raise RuntimeError(f"the call on {node} did not start within 60 s")
        t0 = time.perf_counter_ns()
        cluster.kill_raylet(node)
        deadline = time.monotonic() + DEAD_WITHIN_S
        while len(seen) < 2 and time.monotonic() < deadline:
            if "ray_dead_directory" not in seen and node not in {h.name for h in engine.nodes()}:
                seen["ray_dead_directory"] = ms_since(t0)
            if "ray_dead_gcs" not in seen and not cluster.node_alive(node):
                seen["ray_dead_gcs"] = ms_since(t0)
            time.sleep(POLL_S)
        caller.join(max(0.0, deadline - time.monotonic()))
        if "ray_dead_gcs" not in seen:
            raise RuntimeError(f"Ray did not mark {node} dead within {DEAD_WITHIN_S:.0f} s of its raylet's kill")
        if "ray_dead_directory" not in seen:
            kit.progress(f"ray: the engine still lists {node} {DEAD_WITHIN_S:.0f} s after its raylet's kill")
            seen["ray_dead_directory"] = math.inf
        seen["ray_dead_call"] = math.inf
        if not ended:
            kit.progress(f"ray: the call in flight on {node} had not ended {DEAD_WITHIN_S:.0f} s after the kill")
        elif LOST not in ended[0][1]:
            kit.progress(f"ray: the call in flight on {node} ended without {LOST!r}: {ended[0][1]}")
        else:
            seen["ray_dead_call"] = (ended[0][0] - t0) / 1e6
        kit.progress(f"ray: {node} killed: engine {seen['ray_dead_directory']:.0f} ms, call "
                     f"{seen['ray_dead_call']:.0f} ms, GCS {seen['ray_dead_gcs']:.0f} ms")
    finally:
        box.destroy()
    back = time.monotonic()
    cluster.restart_node(node)
    node_id = cluster.node_id(node)  # its new life's id: a directory that never dropped the old one lists both
    while node_id not in {h.node_id for h in engine.nodes() if h.name == node}:
        if time.monotonic() - back > BACK_WITHIN_S:
            raise RuntimeError(f"{node} not back in the engine's placement within {BACK_WITHIN_S:.0f} s")
        time.sleep(0.2)
    seen["ray_node_back_s"] = time.monotonic() - back
    kit.progress(f"ray: {node} back in placement after {seen['ray_node_back_s']:.0f} s")
    return seen


# ---- rows -----------------------------------------------------------------------------------


def add_ray_rows(data: Data, add: Callable[..., None], skipped: dict[str, str]) -> None:
    """Rows 22a-22g and 23a-23f (``add`` takes ``Row``'s arguments); a group not measured is one row
    saying why."""
    n = CLUSTER_ROWS
    if n in skipped:
        add(f"{n}. Ray engine rows (remote sandboxes on a 3-node cluster): not measured", "time", [math.nan], "—",
            None, f"— (skipped: {skipped[n]})", extra={"skipped": skipped[n]})
    local = "the same on the local DockerEngine (interleaved)"
    if "ray_create_remote" in data:
        add(f"{n}a. Ray: create → first result, remote sandbox ({len(data['ray_create_remote'])} samples)", "time",
            data["ray_create_remote"], local, data["ray_create_local"], "— (info)")
    if "ray_exec_remote" in data:
        remote = data["ray_exec_remote"]
        add(f"{n}b. Ray: exec round trip of `true`, remote sandbox (its node's relay, TLS, across the bridge)",
            "time", remote, "a local sandbox's unix socket (interleaved)", data["ray_exec_local"],
            f"— (info; p95 {p95(remote):.2f} ms, local {p95(data['ray_exec_local']):.2f} ms)",
            extra={"p95": p95(remote), "baseline_p95": p95(data["ray_exec_local"])})
    if "ray_stream_remote" in data:
        size = int(data["ray_stream_bytes"][0])
        add(f"{n}c. Ray: stream {size // MB} MB out of a remote sandbox (`head -c`)", "rate",
            data["ray_stream_remote"], "a local sandbox (interleaved)", data["ray_stream_local"], "— (info)",
            rate_bytes=size)
    if "ray_rate_2nodes" in data:
        k = int(data["ray_burst"][0])
        share = p50(data["ray_burst_w1_share"])
        add(f"{n}d. Ray: sandboxes/s, {k} creates at once spread over 2 worker nodes (each to its first result)",
            "ops", data["ray_rate_2nodes"], f"the same {k} on 1 node (placement nodes = [w1])", data["ray_rate_1node"],
            f"— (info; create p50 {p50(data['ray_burst_ms_2nodes']):.0f} ms vs "
            f"{p50(data['ray_burst_ms_1node']):.0f} ms; w1 share {share:.0%})", unit="sandboxes/s",
            extra={"create_p50_ms": p50(data["ray_burst_ms_2nodes"]),
                   "baseline_create_p50_ms": p50(data["ray_burst_ms_1node"]), "w1_share": share})
    if "ray_dead_directory" in data:
        gcs = "Ray's control store marking the node dead (polled)"
        back = data["ray_node_back_s"]
        add(f"{n}e. Ray: raylet SIGKILLed → the engine drops the node ({len(back)} kills)", "time",
            data["ray_dead_directory"], gcs, data["ray_dead_gcs"],
            f"every kill within {DEAD_WITHIN_S:.0f} s (worst: {worst(data['ray_dead_directory'])}; back in placement "
            f"after a restart: p50 {p50(back):.0f} s)", lambda r: all(math.isfinite(v) for v in r.callbox),
            extra={"node_back_s": p50(back)})
        add(f"{n}f. Ray: raylet SIGKILLed → a call in flight fails \"{LOST}\"", "time", data["ray_dead_call"], gcs,
            data["ray_dead_gcs"], f"≤ 10000 ms (worst: {worst(data['ray_dead_call'])})",
            lambda r: max(r.callbox) <= 10_000)
    if "ray_image_load" in data:
        size = int(data["ray_image_bytes"][0])
        add(f"{n}g. Ray: image distribution at connect, {size / MB:.0f} MB to {len(data['ray_image_load'])} nodes "
            f"at once (MB/s per node)", "rate", data["ray_image_load"], "—", None,
            f"— (info; connect took {data['ray_seconds_connect'][0]:.0f} s)", rate_bytes=size)
    add_transport_rows(data, add, skipped)


def add_transport_rows(data: Data, add: Callable[..., None], skipped: dict[str, str]) -> None:
    from tests.bench.bench_ray_transport import add_ray_transport_rows

    n = TRANSPORT_ROWS
    if n in skipped:
        add(f"{n}. relay against Ray actor proxy: not measured", "time", [math.nan], "—", None,
            f"— (skipped: {skipped[n]})", extra={"skipped": skipped[n]})

    def renumbered(what: str, *args: Any, **kwargs: Any) -> None:
        add(renumber(what, n), *args, **kwargs)

    add_ray_transport_rows(data, renumbered)

