"""How the agent starts in a sandbox's image: its own copy in callbox's image, or the agent bundle in any other.

callbox's sandbox image (it carries the ``callbox.image.hash`` label) starts the agent it
holds, through the image's entrypoint. Any other image gets the agent bundle mounted
read-only (:mod:`harness.engine.image.bundle`) and an entrypoint that starts it through the
bundle's own loader. Tool processes then get the image's environment (``Config.Env``: its
``PATH`` and the rest), under the variables the request sets, with ``HOME`` the sandbox's
scratch home (the image's root is read-only, so a home it names could not be written).

What an image asks for is looked up once per image id and kept for a short while, so a
burst of creates costs one inspect.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import docker
import docker.errors
from docker.types import Mount as DockerMount

from harness.core.errors import ImageNotFound, SandboxStartError
from harness.engine.image.bundle import BUNDLE_DIR, ensure_bundle
from harness.engine.image.common import LABEL_HASH
from harness.engine.image.errors import ImageBuildError
from harness.engine.spec import DEFAULT_IMAGE, HOME, engine_is_local

CACHE_S = 30.0
"""How long an image's launch settings are reused before the image is inspected again."""


@dataclass(frozen=True)
class AgentLaunch:
    """What the container needs beyond callbox's settings to start the agent in an image."""

    entrypoint: list[str] | None = None
    """None: the image's own (callbox's image)."""
    mounts: list[DockerMount] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    """Agent arguments after callbox's usual ones."""

    @property
    def bundled(self) -> bool:
        return self.entrypoint is not None


_OWN = AgentLaunch()
_cache: dict[str, tuple[float, AgentLaunch]] = {}
_lock = threading.Lock()


def agent_launch(client: docker.DockerClient, image: str) -> AgentLaunch:
    """How to start the agent in ``image``; ``ImageNotFound`` if the engine does not have it."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(image)
    if cached is not None and now - cached[0] < CACHE_S:
        return cached[1]
    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageNotFound.named(image) from None
    config = found.attrs.get("Config") or {}
    own = bool((config.get("Labels") or {}).get(LABEL_HASH))
    launch = _OWN if own else _bundled(client, image, config.get("Env") or [])
    with _lock:
        _cache[image] = (now, launch)
    return launch


def _bundled(client: docker.DockerClient, image: str, image_env: list[str]) -> AgentLaunch:
    if not engine_is_local():
        raise SandboxStartError(
            f"{image} has no callbox agent, and the agent bundle can only be mounted from this machine: "
            "use an image built with `callbox image build --base IMAGE`, or a Docker engine on this host"
        )
    try:
        bundle = ensure_bundle(client, source=DEFAULT_IMAGE)
    except ImageBuildError as exc:
        raise SandboxStartError(f"{image} needs the agent bundle, which could not be made: {exc}") from None
    args = ["--home", HOME]
    for entry in image_env:
        if "=" in entry:
            args += ["--tool-env", entry]
    mount = DockerMount(BUNDLE_DIR, str(bundle.path), type="bind", read_only=True, propagation="rprivate")
    return AgentLaunch(entrypoint=bundle.entrypoint(), mounts=[mount], args=args)
