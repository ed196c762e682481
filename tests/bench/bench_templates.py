"""``make bench`` section ``templates``: a template build through the unmodified e2b SDK, cold and cached.

The server is ``callbox serve --e2b`` in a child process (:class:`~tests.bench.bench_e2b.E2bDoor`)
with a template directory of the section's own, removed afterwards with the images its
builds made. The template is a small one as E2B's docs build it: callbox's own image as the
base (``from_base_image()``), a file copied in, two commands run, an environment variable,
a start command with its ready check.

24a. cold: ``Template.build(..., skip_cache=True)``, every step built again by Docker's
     builder (no layer cache), from the request to the SDK's return (it polls the build's
     status every 0.2 s, as it does against E2B), vs ``docker build`` of the same Dockerfile
     and context through docker-py, without cache (what the door adds: the upload, the
     status polling, the seeds of the sandbox's scratch places);
24b. cached: the same ``Template.build`` again, found in the cache by its steps' hash: no
     Docker build; target p50 under 2 s.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
from e2b import Template

from tests.bench.bench_e2b import E2bDoor, heavy_samples, ms_since
from tests.bench.bench_results import p50
from tests.support.template_store import template_store

TARGET_CACHED_MS = 2000.0
STEPS_RUN = ("mkdir -p /srv/site && cp /home/user/hello.txt /srv/site/index.html", "echo built > /opt/built.txt")


def _template(context: Path) -> Any:
    return (Template(file_context_path=str(context)).from_base_image()
            .copy("hello.txt", "/home/user/")
            .run_cmd(list(STEPS_RUN))
            .set_envs({"GREETING": "hi"})
            .set_start_cmd("python3 -m http.server 8000", "curl -s localhost:8000"))


def _docker_build(client: docker.DockerClient, image: str, context: Path) -> Callable[[], None]:
    """``docker build`` of the same steps, no cache (the baseline of the cold row)."""
    dockerfile = (f"FROM {image}\nUSER root\nCOPY hello.txt /home/user/\n"
                  f"RUN [\"/bin/sh\", \"-c\", \"{' && '.join(STEPS_RUN)}\"]\nENV GREETING=\"hi\"\nUSER root\n")
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), ("hello.txt", (context / "hello.txt").read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tag = f"callbox-bench-tpl-baseline:{secrets.token_hex(4)}"

    def build() -> None:
        payload.seek(0)
        for item in client.api.build(fileobj=payload, custom_context=True, tag=tag, rm=True, forcerm=True,
                                     nocache=True, network_mode="none", decode=True):
            if "error" in item:
                raise RuntimeError(f"the baseline docker build failed: {item['error']}")

    return build


def bench_templates(client: docker.DockerClient, image: str, samples: int,
                    progress: Callable[[str], None]) -> dict[str, list[float]]:
    data: dict[str, list[float]] = {"tpl_cold": [], "tpl_cold_docker": [], "tpl_cached": []}
    heavy = heavy_samples(samples)
    with (template_store(client, prefix="callbox-bench-tpl-"),
          tempfile.TemporaryDirectory(prefix="callbox-bench-ctx-") as ctx):
        context = Path(ctx)
        (context / "hello.txt").write_text(f"hello {secrets.token_hex(8)}\n")
        template = _template(context)
        baseline = _docker_build(client, image, context)
        door = E2bDoor(image)
        try:
            opts = door.opts()
            Template.build(template, "bench-web", **opts)  # warm-up: the files uploaded, the base looked up
            for index in range(heavy):
                progress(f"templates: cold build {index + 1}/{heavy}")
                first, second = (("cb", "docker") if index % 2 == 0 else ("docker", "cb"))
                for side in (first, second):
                    start = time.perf_counter_ns()
                    if side == "cb":
                        Template.build(template, "bench-web", skip_cache=True, **opts)
                        data["tpl_cold"].append(ms_since(start))
                    else:
                        baseline()
                        data["tpl_cold_docker"].append(ms_since(start))
            progress(f"templates: {samples} cached builds")
            template = _template(context)  # skip_cache marked the other one forced for good
            for _ in range(samples):
                start = time.perf_counter_ns()
                Template.build(template, "bench-web", **opts)
                data["tpl_cached"].append(ms_since(start))
        finally:
            door.stop()
            for found in client.images.list(name="callbox-bench-tpl-baseline"):
                with contextlib.suppress(docker.errors.DockerException):
                    client.images.remove(found.id, force=True)
    return data


def add_template_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 24a-24b of the report (``add`` takes ``Row``'s arguments)."""
    if "tpl_cached" not in data:
        return
    add(f"24a. E2B SDK: `Template.build` cold (skip_cache: every step built) ({len(data['tpl_cold'])} samples)",
        "time", data["tpl_cold"], "docker-py `docker build` of the same steps, no cache", data["tpl_cold_docker"],
        "— (info)")
    add(f"24b. E2B SDK: `Template.build` of the same template again, from the cache ({len(data['tpl_cached'])} "
        "samples)", "time", data["tpl_cached"], "—", None, f"p50 < {TARGET_CACHED_MS / 1000:g} s",
        lambda r: r.cb(p50) < TARGET_CACHED_MS)
