"""``build_image``: the base, the wheels and the agent layer, skipped when the content hash is unchanged."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from harness.engine.image.base import base_tag, build_base
from harness.engine.image.common import (
    DEFAULT_TAG,
    IMAGE_FORMAT_VERSION,
    IMAGE_REPO,
    LABEL_BASE,
    LABEL_HASH,
    LABEL_VERSION,
    Progress,
)
from harness.engine.image.context import build_context, docker_build
from harness.engine.image.engine import docker_error, find_image, image_with_hash, ping, split_tag, tag_image
from harness.engine.image.errors import ImageBuildError
from harness.engine.image.probe import MIN_PYTHON, probe_base
from harness.engine.image.sources import host_suite
from harness.engine.image.wheels import dependency_pins, download_wheels, requirements_text

_SANDBOX_SUFFIXES = (".py", ".pyi")


@dataclass(frozen=True)
class ImageBuildResult:
    tag: str
    image_id: str
    content_hash: str
    built: bool  # False when it was already up to date
    seconds: float


def default_repo_root() -> Path:
    """The checkout that holds ``sandbox/`` and ``images/`` (harness is installed editable from it)."""
    return Path(__file__).resolve().parents[3]  # harness/engine/image/build.py -> the checkout


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/callbox``, else ``~/.cache/callbox``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return root / "callbox"


def sandbox_sources(repo_root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, absolute path) of every file of ``sandbox/`` that goes into the image."""
    root = repo_root / "sandbox"
    if not (root / "__init__.py").is_file():
        raise ImageBuildError(f"{root} is not the sandbox package (no __init__.py); pass the repository root")
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(_SANDBOX_SUFFIXES) or name == "py.typed":
                path = Path(dirpath) / name
                out.append((path.relative_to(repo_root).as_posix(), path))
    return sorted(out)


def content_hash(
    *,
    base_id: str,
    dockerfile: str,
    sources: list[tuple[str, bytes]],
    pins: dict[str, str],
    wheels: list[str],
) -> str:
    """The image's identity: same inputs, same hash, no rebuild."""
    doc = {
        "format": IMAGE_FORMAT_VERSION,
        "base_id": base_id,
        "dockerfile": hashlib.sha256(dockerfile.encode()).hexdigest(),
        "sources": sorted([path, hashlib.sha256(data).hexdigest()] for path, data in sources),
        "pins": dict(sorted(pins.items())),
        "wheels": sorted(wheels),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@contextlib.contextmanager
def _build_lock(cache: Path, progress: Progress) -> Iterator[None]:
    """One build at a time per cache dir (parallel test runs, a CLI run next to `make image`)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "build.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another image build to finish ({cache / 'build.lock'})...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_image(
    client: docker.DockerClient,
    *,
    repo_root: Path,
    base: str | None = None,
    tag: str = DEFAULT_TAG,
    wheelhouse: Path | None = None,
    progress: Callable[[str], None] = print,
) -> ImageBuildResult:
    """Build (or find up to date) the sandbox image and tag it ``tag`` and ``callbox-sandbox:<hash12>``."""
    started = time.monotonic()
    repo_root = repo_root.resolve()
    split_tag(tag)  # validate early
    dockerfile_path = repo_root / "images" / "Dockerfile"
    try:
        dockerfile = dockerfile_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ImageBuildError(f"cannot read {dockerfile_path}: {exc.strerror or exc}") from None
    sources = [(rel, path.read_bytes(), path.stat().st_mtime) for rel, path in sandbox_sources(repo_root)]
    pins = dependency_pins()
    cache = cache_dir()
    if wheelhouse is not None:
        wheelhouse = wheelhouse.expanduser().resolve()
    ping(client)
    try:
        with _build_lock(cache, progress):
            # 1. the base
            if base is not None:
                base_ref = base
                base_id = find_image(client, base)
                if base_id is None:
                    raise ImageBuildError(
                        f"image {base} not found locally; there is no registry here: build or load it first"
                    )
            else:
                suite = host_suite()
                base_ref = base_tag(suite, platform.machine())
                base_id = find_image(client, base_ref)
                if base_id is None:
                    base_id = build_base(client, base_ref, suite, cache, progress)
            info = probe_base(client, base_ref, base_id, cache)
            if info.glibc is None:
                raise ImageBuildError(
                    f"the base image {base_ref} is not glibc-based (musl, e.g. Alpine?); "
                    "the agent's wheels need a glibc (manylinux) base"
                )
            if info.python < MIN_PYTHON:
                raise ImageBuildError(
                    f"the base image {base_ref} has Python {info.python[0]}.{info.python[1]}; "
                    f"callbox needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
                    + ("" if base is not None else "; pass --base IMAGE with a newer Python")
                )
            # 2. the wheels
            wheel_dir, wheels = download_wheels(cache, info, pins, wheelhouse, progress)
            # 3. the agent layer, unless an image with the same content hash exists
            digest = content_hash(
                base_id=base_id,
                dockerfile=dockerfile,
                sources=[(rel, data) for rel, data, _ in sources],
                pins=pins,
                wheels=wheels,
            )
            hash_tag = f"{IMAGE_REPO}:{digest[:12]}"
            tags = [tag] if tag == hash_tag else [tag, hash_tag]
            try:
                existing = image_with_hash(client, digest, hash_tag)
            except docker.errors.APIError as exc:
                raise ImageBuildError(f"could not list images: {docker_error(exc)}") from None
            if existing is not None:
                tag_image(client, existing, tags)
                seconds = time.monotonic() - started
                progress(f"up to date: {tag} ({existing[7:19]}, hash {digest[:12]})")
                return ImageBuildResult(tag=tag, image_id=existing, content_hash=digest, built=False, seconds=seconds)
            progress(f"building agent layer on {base_ref} (Python {info.python[0]}.{info.python[1]})...")
            context = build_context(
                dockerfile,
                sources,
                wheel_dir,
                wheels,
                requirements_text(pins),
            )
            labels = {LABEL_HASH: digest, LABEL_VERSION: str(IMAGE_FORMAT_VERSION), LABEL_BASE: base_ref}
            image_id = docker_build(client, context, base_ref=base_ref, tag=tag, labels=labels, progress=progress)
            tag_image(client, image_id, tags)
            seconds = time.monotonic() - started
            progress(f"built {tag} ({image_id[7:19]}, hash {digest[:12]}) in {seconds:.0f} s")
            return ImageBuildResult(tag=tag, image_id=image_id, content_hash=digest, built=True, seconds=seconds)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        # ImageBuildError covers what we expect; this is the engine failing or going away mid-build.
        raise ImageBuildError(f"the Docker engine failed during the image build: {docker_error(exc)}") from None
