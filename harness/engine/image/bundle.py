"""The agent bundle: the agent with its own interpreter, libraries and dynamic loader, for images without Python.

A sandbox of any other image than callbox's own (one without the ``callbox.image.hash``
label: ``node``, ``golang``, a BusyBox or distroless image) runs the agent from this bundle,
bind-mounted read-only at ``BUNDLE_DIR``. The agent starts through the bundle's own loader
with the bundle's library directory and the loader cache off, so it never loads the
image's libc (glibc of another release, musl, or none at all) and never writes into the
image. Tool processes run the image's programs.

The bundle is packed from the sandbox image that ``callbox image build`` makes (its
interpreter, standard library, the agent and its wheels, and every shared library they
need, found with ``ldd``), by that image's own Python in a throwaway container with no
network. It is kept per image content hash under ``<cache>/agent-bundles/<hash>`` and
made once: packing goes to a temporary directory renamed into place when complete, under
a lock, so concurrent creates wait for one packing instead of racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from harness.engine.image.bundle_script import BUNDLE_SCRIPT
from harness.engine.image.common import DEFAULT_TAG, LABEL_HASH, Progress
from harness.engine.image.engine import docker_error
from harness.engine.image.errors import ImageBuildError

log = logging.getLogger("callbox.image")

BUNDLE_DIR = "/opt/callbox-agent"
"""Where the bundle is mounted in a sandbox (read-only); a path no user mount may cover."""
AGENT_LIB_IN_IMAGE = "/opt/callbox/lib"
"""Where the sandbox image keeps the agent and its dependencies."""
PACK_TIMEOUT_S = 300


@dataclass(frozen=True)
class AgentBundle:
    """A packed bundle on the host: where it is and how to start its agent."""

    path: Path
    """The host directory (read-only), mounted at ``BUNDLE_DIR``."""
    loader: str
    """The file name of its dynamic loader in ``so/`` (``ld-linux-x86-64.so.2``)."""

    def entrypoint(self) -> list[str]:
        """The container's entrypoint: the loader runs the bundle's interpreter on the agent."""
        return [
            f"{BUNDLE_DIR}/so/{self.loader}",
            "--library-path", f"{BUNDLE_DIR}/so",
            "--inhibit-cache",
            f"{BUNDLE_DIR}/bin/python3",
            "-I", "-S", f"{BUNDLE_DIR}/agent.py",
        ]


def bundles_root() -> Path:
    """``$XDG_CACHE_HOME/callbox/agent-bundles``, else ``~/.cache/callbox/agent-bundles``."""
    from harness.engine.image.build import cache_dir

    return cache_dir() / "agent-bundles"


def _source_hash(client: docker.DockerClient, image: str) -> str:
    try:
        labels = client.images.get(image).labels
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"the agent bundle is packed from {image}, which is not here: build it with `callbox image build`"
        ) from None
    digest = (labels or {}).get(LABEL_HASH)
    if not digest:
        raise ImageBuildError(f"{image} is not a callbox sandbox image (no {LABEL_HASH} label): "
                              "rebuild it with `callbox image build`")
    return str(digest)


def _load(path: Path) -> AgentBundle | None:
    try:
        meta = json.loads((path / "bundle.json").read_text())
    except (OSError, ValueError):
        return None
    loader = meta.get("loader")
    if not isinstance(loader, str) or not (path / "so" / loader).is_file():
        return None
    return AgentBundle(path=path, loader=loader)


def ensure_bundle(client: docker.DockerClient, *, source: str = DEFAULT_TAG, root: Path | None = None,
                  progress: Progress | None = None) -> AgentBundle:
    """The bundle packed from ``source`` (the sandbox image), packing it first if needed."""
    digest = _source_hash(client, source)
    root = root or bundles_root()
    final = root / digest[:16]
    if (bundle := _load(final)) is not None:
        return bundle
    root.mkdir(parents=True, exist_ok=True)
    with (root / "pack.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (bundle := _load(final)) is not None:
                return bundle
            return _pack(client, source, root, final, progress or log.info)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pack(client: docker.DockerClient, source: str, root: Path, final: Path, progress: Progress) -> AgentBundle:
    started = time.monotonic()
    staging = root / f".packing-{uuid.uuid4().hex[:8]}"
    staging.mkdir(mode=0o755)
    progress(f"packing the agent bundle for images without Python from {source} into {final}...")
    name = f"callbox-bundle-{uuid.uuid4().hex[:8]}"
    try:
        # The staging directory is mounted at the bundle's own path, so the compiled files
        # name the paths the agent will see; the packer runs as this process's user, so
        # what it writes is this user's to make read-only, rename or remove.
        container = client.containers.create(
            source, entrypoint=["/usr/bin/python3", "-I", "-S", "-c", BUNDLE_SCRIPT],
            command=[BUNDLE_DIR, AGENT_LIB_IN_IMAGE], user=f"{os.getuid()}:{os.getgid()}",
            network_mode="none", name=name,
            volumes={str(staging): {"bind": BUNDLE_DIR, "mode": "rw"}},
        )
        try:
            container.start()
            result = container.wait(timeout=PACK_TIMEOUT_S)
            if result.get("StatusCode") != 0:
                logs = container.logs(tail=20).decode("utf-8", "replace").strip()
                raise ImageBuildError(f"packing the agent bundle failed: {logs or 'no output'}")
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
        _make_read_only(staging)
        os.replace(staging, final)
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"the Docker engine failed while packing the agent bundle: {docker_error(exc)}") \
            from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    bundle = _load(final)
    if bundle is None:
        raise ImageBuildError(f"the packed agent bundle in {final} has no usable bundle.json")
    size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
    progress(f"agent bundle ready: {final} ({size / 2**20:.0f} MiB, {time.monotonic() - started:.1f} s)")
    return bundle


def _make_read_only(root: Path) -> None:
    """Drop every write bit: the bundle is shared by all sandboxes and never changes."""
    for directory, _, files in os.walk(root):
        for entry in (directory, *(os.path.join(directory, f) for f in files)):
            mode = os.lstat(entry).st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(entry, stat.S_IMODE(mode) & ~0o222)
