"""How the harness should reach an agent on another Ray node: the node's relay, or an actor proxy.

Measured in one run, on one local sandbox and a local Ray (``ray.init`` in this process, token
authentication on, its own temporary directory), each way interleaved with the others:

* **unix socket**: the harness's AgentClient on the agent's socket (what a single machine does:
  the floor);
* **relay**: ``AgentClient.over_relay`` from the driver to an
  :class:`~harness.engine.ray.relay.AgentRelay` on 127.0.0.1 served by a Ray actor (as the node's
  host actor serves it: its own process), TLS and the sandbox's token, forwarding to the socket;
* **actor proxy**: a Ray actor holding an AgentClient on the socket; the driver calls its
  ``exec`` method and ``ray.get``s the result, and streams output from a generator method
  (``num_returns="streaming"``) that yields the agent's output in chunks of up to 1 MiB (one
  Ray object per chunk; smaller chunks cost a Ray object each).

Rows: (a) the exec round trip of ``true`` (p50, p95), and, as floors, a no-op actor call and
the agent's health check over the relay; (b) streaming ``head -c SIZE /dev/zero`` out of the
sandbox, MB/s. Everything here is loopback on one machine: what a network adds (a round trip
per call, bandwidth) comes on top of both ways alike, so the comparison is of the software path.

Run as ``python -m tests.bench.bench_ray_transport [--samples N] [--stream-mb N]``; ``make bench``
uses :func:`bench_ray_transport` and :func:`add_ray_transport_rows`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.engine.agent_client import AgentClient
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME
from harness.engine.exec_result import collect
from tests.bench.bench_results import MB, Row, markdown_table, p50, p95, results

CHUNK_BYTES = 1 << 20
"""What one object of the proxy's output stream carries at most."""
DEFAULT_STREAM_BYTES = 100 * MB
REPO = Path(__file__).resolve().parents[2]


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class AgentProxy:
    """The actor proxy: an AgentClient on the sandbox's socket, in a Ray actor on its node."""

    def __init__(self, socket_path: str) -> None:
        self.agent = AgentClient(socket_path)

    def ping(self) -> None:
        return None

    def exec(self, argv: list[str]) -> int:
        """Run a command; its exit code."""
        return collect(self.agent.exec(argv)).exit_code

    def stream(self, argv: list[str], cap: int) -> Iterator[bytes]:
        """Run a command and yield its stdout in chunks of up to CHUNK_BYTES, as it comes."""
        pending = bytearray()
        for event in self.agent.exec(argv, output_cap_bytes=cap, rpc_timeout=300):
            if event.WhichOneof("event") == "output" and event.output.WhichOneof("data") == "stdout":
                pending += event.output.stdout
                if len(pending) >= CHUNK_BYTES:
                    yield bytes(pending)
                    pending.clear()
        if pending:
            yield bytes(pending)


class RelayHost:
    """The relay's side: an AgentRelay in a Ray actor's process, as the node's host runs it."""

    def __init__(self, state_dir: str) -> None:
        from harness.engine.ray.relay import AgentRelay

        self.relay = AgentRelay(bind_host="127.0.0.1", state_dir=Path(state_dir))
        self.relay.start()

    def register(self, sandbox_id: str, socket_path: str) -> tuple[str, bytes, str]:
        """The relay's address, its certificate and the sandbox's token."""
        return self.relay.address, self.relay.certificate_pem, self.relay.register(sandbox_id, socket_path)

    def stop(self) -> None:
        self.relay.stop(grace=0)


@contextlib.contextmanager
def local_ray() -> Iterator[Any]:
    """A Ray of this machine alone (never one already running), with token authentication,
    its files in a temporary directory; shut down and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cbx-rb-") as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(secrets.token_hex(32))
        token_file.chmod(0o600)
        saved = {key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
        # before Ray is imported: it reads its authentication mode once, on import
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
        os.environ.pop("RAY_AUTH_TOKEN", None)
        try:
            imported = "ray" in sys.modules
            try:
                import ray
            except ImportError:
                raise SystemExit("the Ray transport bench needs Ray: pip install 'callbox[ray]'") from None
            if imported:  # read the mode again (what ray.init does when it turns token mode on itself)
                from ray._raylet import AuthenticationTokenLoader, Config

                Config.initialize("")
                AuthenticationTokenLoader.instance().reset_cache()
            ray.init(address="local", _temp_dir=str(Path(tmp) / "ray"), _node_ip_address="127.0.0.1",
                     include_dashboard=False, log_to_driver=False, num_cpus=2,
                     runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
            try:
                yield ray
            finally:
                ray.shutdown()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


Case = Callable[[], dict[str, float]]


def interleaved(label: str, cases: list[Case], samples: int, warmup: int) -> dict[str, list[float]]:
    """The cases in turn (rotating which goes first), ``warmup`` rounds not counted."""
    for _ in range(warmup):
        for case in cases:
            case()
    out: dict[str, list[float]] = {}
    for i in range(samples):
        for case in cases[i % len(cases):] + cases[:i % len(cases)]:
            for name, value in case().items():
                out.setdefault(name, []).append(value)
    progress(f"{label}: " + ", ".join(f"{k} p50 {p50(v):.2f}" for k, v in out.items()))
    return out


def ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def bench_ray_transport(box: Any, samples: int = 200, warmup: int = 20, stream_bytes: int = DEFAULT_STREAM_BYTES,
                        stream_samples: int = 5) -> dict[str, list[float]]:
    """Samples (ms) of each way, keyed ``rt_*`` (round trips) and ``stream_*`` (whole streams)."""
    socket_path = str(box.socket_dir / AGENT_SOCKET_NAME)
    with tempfile.TemporaryDirectory(prefix="cbx-rb-relay-") as state, local_ray() as ray:
        host = ray.remote(num_cpus=0)(RelayHost).remote(str(Path(state) / "relay"))
        address, certificate, token = ray.get(host.register.remote(box.id, socket_path))
        remote = AgentClient.over_relay(address, certificate, box.id, token)
        try:
            proxy = ray.remote(num_cpus=0, max_concurrency=4)(AgentProxy).remote(socket_path)
            ray.get(proxy.ping.remote())
            return _measure(ray, box.agent, remote, proxy, samples, warmup, stream_bytes, stream_samples)
        finally:
            remote.close()
            ray.get(host.stop.remote())


def _measure(ray: Any, local: AgentClient, remote: AgentClient, proxy: Any, samples: int, warmup: int,
             stream_bytes: int, stream_samples: int) -> dict[str, list[float]]:
    def exec_on(name: str, client: AgentClient) -> Case:
        def case() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            code = collect(client.exec(["true"])).exit_code
            elapsed = ms_since(t0)
            if code != 0:
                raise RuntimeError(f"{name}: true exited {code}")
            return {f"rt_{name}": elapsed}
        return case

    def exec_proxy() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        code = ray.get(proxy.exec.remote(["true"]))
        elapsed = ms_since(t0)
        if code != 0:
            raise RuntimeError(f"proxy: true exited {code}")
        return {"rt_proxy": elapsed}

    def noop_proxy() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        ray.get(proxy.ping.remote())
        return {"rt_actor_noop": ms_since(t0)}

    def health_relay() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        remote.health()
        return {"rt_relay_health": ms_since(t0)}

    data = interleaved("exec round trip", [exec_on("unix", local), exec_on("relay", remote), exec_proxy,
                                           noop_proxy, health_relay], samples, warmup)

    argv = ["head", "-c", str(stream_bytes), "/dev/zero"]

    def stream_on(name: str, client: AgentClient) -> Case:
        def case() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            result = collect(client.exec(argv, output_cap_bytes=2 * stream_bytes, rpc_timeout=300))
            elapsed = ms_since(t0)
            got = len(result.stdout.head) + len(result.stdout.tail)
            if got != stream_bytes:
                raise RuntimeError(f"{name}: {got} of {stream_bytes} bytes")
            return {f"stream_{name}": elapsed}
        return case

    def stream_proxy() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        got = 0
        for ref in proxy.stream.options(num_returns="streaming").remote(argv, 2 * stream_bytes):
            got += len(ray.get(ref))
        elapsed = ms_since(t0)
        if got != stream_bytes:
            raise RuntimeError(f"proxy: {got} of {stream_bytes} bytes")
        return {"stream_proxy": elapsed}

    data.update(interleaved("stream", [stream_on("unix", local), stream_on("relay", remote), stream_proxy],
                            stream_samples, 1))
    data["stream_bytes"] = [float(stream_bytes)]
    return data


def add_ray_transport_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """The rows (``add`` takes ``Row``'s arguments); keys 22a-22f until ``make bench`` numbers them."""
    if "rt_relay" not in data:
        return
    unix = data["rt_unix"]

    def tail(values: list[float]) -> dict[str, float | int | str | None]:
        return {"p95": p95(values)}

    add("22a. exec round trip of `true` through the node's relay (TLS, token; served by an actor)", "time",
        data["rt_relay"],
        "the agent's unix socket (interleaved)", unix, f"— (info; p95 {p95(data['rt_relay']):.2f} ms)",
        extra=tail(data["rt_relay"]))
    add("22b. exec round trip of `true` through a Ray actor proxy", "time", data["rt_proxy"],
        "the agent's unix socket (interleaved)", unix, f"— (info; p95 {p95(data['rt_proxy']):.2f} ms)",
        extra=tail(data["rt_proxy"]))
    add("22c. floor: a no-op Ray actor call", "time", data["rt_actor_noop"], "—", None, "— (info)",
        extra=tail(data["rt_actor_noop"]))
    add("22d. floor: the agent's health check through the relay", "time", data["rt_relay_health"], "—", None,
        "— (info)", extra=tail(data["rt_relay_health"]))
    size = int(data["stream_bytes"][0])
    add(f"22e. stream {size // MB} MB out through the relay", "rate", data["stream_relay"],
        "the agent's unix socket (interleaved)", data["stream_unix"], "— (info)", rate_bytes=size)
    add(f"22f. stream {size // MB} MB out through a Ray actor proxy (1 MiB objects)", "rate", data["stream_proxy"],
        "the agent's unix socket (interleaved)", data["stream_unix"], "— (info)", rate_bytes=size)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.spec import SandboxSpec

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--stream-mb", type=int, default=DEFAULT_STREAM_BYTES // MB)
    parser.add_argument("--stream-samples", type=int, default=5)
    parser.add_argument("--image", default="callbox-sandbox:latest")
    args = parser.parse_args(argv)
    engine = DockerEngine.connect()
    box = engine.create(SandboxSpec(image=args.image))
    try:
        data = bench_ray_transport(box, args.samples, args.warmup, args.stream_mb * MB, args.stream_samples)
    finally:
        box.destroy()
    rows: list[Row] = []
    add_ray_transport_rows(data, lambda *a, **k: rows.append(Row(*a, **k)))
    print(markdown_table(rows))
    return results(rows)


if __name__ == "__main__":
    main()
