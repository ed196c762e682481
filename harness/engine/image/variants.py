"""Image variants: the sandbox image with more of Debian's archive in its base and a layer of files on top.

A variant is built like the default image, offline from Debian's archive and idempotently:

1. its own base, ``debootstrap`` of :data:`~harness.engine.image.base.BASE_PACKAGES` plus the
   variant's packages (content-addressed like the default base, so it is made once);
2. the agent layer on that base (:func:`~harness.engine.image.build.build_image` with ``base=``);
3. the variant's layer: the files of ``images/<name>/`` (but its Dockerfile) copied to
   ``/opt/callbox/<name>/`` and precompiled, by ``images/<name>/Dockerfile``; labelled with a
   content hash over the agent image and those files, so an unchanged variant is only re-tagged.

``code-interpreter``: the E2B code interpreter's server, the Python kernel it
drives (python3-ipykernel, jupyter-client, matplotlib, pandas, numpy), and nodejs for its
JavaScript contexts with node-typescript for its TypeScript ones (bash is in every base).
``desktop``: an X display (Xvfb, openbox), Chromium, xdotool, xwd and a VNC server with noVNC, driven
by ``images/desktop/computer.py`` (the `computer` tool's one implementation).
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from harness.engine.image.base import BASE_PACKAGES, base_tag, build_base
from harness.engine.image.build import ImageBuildResult, _build_lock, build_image, cache_dir
from harness.engine.image.common import IMAGE_FORMAT_VERSION, LABEL_BASE, LABEL_HASH, LABEL_VERSION
from harness.engine.image.context import docker_build
from harness.engine.image.engine import docker_error, find_image, hash_tag_of, image_with_hash, ping, tag_image
from harness.engine.image.errors import ImageBuildError
from harness.engine.image.sources import host_suite

__all__ = ["VARIANTS", "Variant", "build_variant"]


@dataclass(frozen=True)
class Variant:
    """An image variant: Debian packages added to the base, and the files of ``images/<name>/``."""

    name: str
    packages: tuple[str, ...]
    tag: str

    def agent_tag(self) -> str:
        """The agent layer on the variant's base, before the variant's own files."""
        repo, _, _ = self.tag.partition(":")
        return f"{repo}:agent"


VARIANTS: dict[str, Variant] = {
    "code-interpreter": Variant(
        name="code-interpreter",
        # Debian has no bash or JavaScript Jupyter kernel (bookworm): bash contexts are a bash process
        # and JavaScript ones a node process (nodejs 18), each driven by a module of the server's own;
        # TypeScript contexts are node processes too, transpiling each cell with node-typescript (4.8).
        # debootstrap does not resolve virtual packages: python3-cffi-backend and libboost-regex1.74.0
        # are what provides python3-zmq's python3-cffi-backend-api-* and gdb's libboost-regex1.74.0-icu72.
        packages=("python3-ipykernel", "python3-jupyter-client", "python3-matplotlib", "python3-pandas",
                  "python3-numpy", "python3-cffi-backend", "libboost-regex1.74.0", "nodejs",
                  "node-typescript"),
        tag="callbox-sandbox-code-interpreter:latest",
    ),
    "desktop": Variant(
        name="desktop",
        # An X display for the `computer` tool: Xvfb, openbox, Debian's Chromium (no browser download),
        # fonts, xdotool for input, xwd (x11-apps) for screenshots, x11vnc and noVNC for a live view.
        # Virtual packages debootstrap cannot resolve, by their provider: dbus-x11 is dconf-service's
        # dbus-session-bus (dbus-user-session, the default, would bring systemd), python3-cffi-backend
        # python3-cryptography's python3-cffi-backend-api-* (websockify needs it).
        packages=("xvfb", "xauth", "openbox", "chromium", "fonts-dejavu-core", "fonts-liberation",
                  "xdotool", "x11-apps", "x11vnc", "novnc", "python3-websockify", "dbus-x11", "python3-cffi-backend"),
        tag="callbox-sandbox-desktop:latest",
    ),
}


def _variant_files(repo_root: Path, name: str) -> tuple[str, list[tuple[str, bytes]]]:
    """The variant's Dockerfile and its other files (relative posix path, content), sorted."""
    root = repo_root / "images" / name
    dockerfile = root / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageBuildError(f"{dockerfile} is missing: the variant {name!r} has no layer to build")
    files = sorted(
        (path.relative_to(root).as_posix(), path.read_bytes())
        for path in root.rglob("*")
        if path.is_file() and path.name != "Dockerfile" and "__pycache__" not in path.parts
    )
    return dockerfile.read_text(encoding="utf-8"), files


def _context(dockerfile: str, files: list[tuple[str, bytes]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("Dockerfile", dockerfile.encode()), *((f"files/{rel}", data) for rel, data in files)]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = 0o644
            tar.addfile(member, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_variant(
    client: docker.DockerClient,
    name: str,
    *,
    repo_root: Path,
    wheelhouse: Path | None = None,
    progress: Callable[[str], None] = print,
) -> ImageBuildResult:
    """Build (or find up to date) the image variant ``name`` and tag it with its tag."""
    variant = VARIANTS.get(name)
    if variant is None:
        raise ImageBuildError(f"no image variant {name!r}; the variants are: {', '.join(sorted(VARIANTS))}")
    started = time.monotonic()
    repo_root = repo_root.resolve()
    dockerfile, files = _variant_files(repo_root, name)
    ping(client)
    suite = host_suite()
    packages = (*BASE_PACKAGES, *variant.packages)
    base_ref = base_tag(suite, platform.machine(), packages)
    with _build_lock(cache_dir(), progress):
        if find_image(client, base_ref) is None:
            progress(f"the {name} variant's base: {', '.join(variant.packages)} on top of the default packages")
            build_base(client, base_ref, suite, cache_dir(), progress, packages=packages)
    agent = build_image(client, repo_root=repo_root, base=base_ref, tag=variant.agent_tag(),
                        wheelhouse=wheelhouse, progress=progress)
    doc = {
        "format": IMAGE_FORMAT_VERSION,
        "variant": name,
        "agent": agent.image_id,
        "dockerfile": hashlib.sha256(dockerfile.encode()).hexdigest(),
        "files": [[rel, hashlib.sha256(data).hexdigest()] for rel, data in files],
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    hash_tag = hash_tag_of(variant.tag, digest)
    try:
        existing = image_with_hash(client, digest, hash_tag)
        if existing is not None:
            tag_image(client, existing, [variant.tag, hash_tag])
            progress(f"up to date: {variant.tag} ({existing[7:19]}, hash {digest[:12]})")
            return ImageBuildResult(tag=variant.tag, image_id=existing, content_hash=digest, built=False,
                                    seconds=time.monotonic() - started)
        progress(f"building the {name} layer on {variant.agent_tag()}...")
        labels = {LABEL_HASH: digest, LABEL_VERSION: str(IMAGE_FORMAT_VERSION), LABEL_BASE: base_ref}
        image_id = docker_build(client, _context(dockerfile, files), base_ref=variant.agent_tag(), tag=variant.tag,
                                labels=labels, progress=progress)
        tag_image(client, image_id, [variant.tag, hash_tag])
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"the Docker engine failed during the {name} build: {docker_error(exc)}") from None
    seconds = time.monotonic() - started
    progress(f"built {variant.tag} ({image_id[7:19]}) in {seconds:.0f} s")
    return ImageBuildResult(tag=variant.tag, image_id=image_id, content_hash=digest, built=True, seconds=seconds)
