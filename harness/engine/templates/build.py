"""Building a template's image on this host, offline, with Docker's builder, and caching it.

:meth:`TemplateBuilder.build` turns a :class:`~harness.engine.templates.steps.Recipe` into a
local image:

1. **Base.** ``fromTemplate`` is a template the owner sees (its cached image);
   ``fromImage`` is an image on this host. E2B's default base, ``e2bdev/base`` (the SDK's
   ``Template()`` and ``from_base_image()``), is callbox's own sandbox image. Any other name
   (``python:3``, ``debian:stable``) must already be on this host: the builder never pulls
   unless its operator allows it (``pull=True``, ``callbox template build --pull``), and a
   missing one is ``image_not_found`` naming the image and how to get it.
2. **Cache.** The recipe's cache key (base image id + steps + files hashes). If the store has
   that key and Docker still has its image, the build is done: no Docker build at all.
3. **Build.** The Dockerfile of the recipe and the uploaded files of each COPY step go to
   Docker's builder as one streamed context; ``RUN`` steps have no network
   (``network_mode="none"`` unless the builder's ``network`` says otherwise), the build is
   bounded in memory and time, and Docker's own layer cache serves unchanged steps. Every
   line Docker prints is a log entry; a failing step is named (``step`` is the recipe's step
   index, ``base`` or ``finalize`` as the SDK reads them).
4. **Seeds.** A sandbox covers ``/home/user`` (E2B's home), ``/workspace``, its home and its
   workdir with fresh scratch tmpfs, which would hide what the steps put there. So what the
   image holds in those places is saved beside the image (regular files and directories,
   what the agent's upload takes) and put into each new sandbox of the template before its
   start command runs.

The image needs no Python: a sandbox of an image without callbox's agent runs the agent from
the agent bundle (:mod:`harness.engine.image.bundle`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors

from harness.core.errors import CallboxError, ErrorCode, short_reason
from harness.engine.docker.client import connect_client
from harness.engine.image.common import LABEL_HASH
from harness.engine.spec import DEFAULT_IMAGE, HOME, WORKSPACE
from harness.engine.templates.steps import Recipe, dockerfile_lines, step_dir
from harness.engine.templates.store import OPERATOR, Built, Template, TemplateStore

__all__ = ["BASE_ALIASES", "BUILD_TIMEOUT_S", "IMAGE_REPO", "LABEL_KEY", "SEED_PLACES", "BuildFailed", "BuildLog",
           "TemplateBuilder"]

log = logging.getLogger("callbox.templates")

IMAGE_REPO = "callbox-template"
LABEL_KEY = "callbox.template.key"
BASE_ALIASES = frozenset({"e2bdev/base", "e2bdev/base:latest"})
"""The SDK's default base image: callbox's own sandbox image stands for it."""
E2B_HOME = "/home/user"
SEED_PLACES = (E2B_HOME, WORKSPACE, HOME)
"""Places a sandbox covers with a scratch tmpfs, whose files in the image are seeded into it."""
BUILD_TIMEOUT_S = 1800
BUILD_MEMORY = 2 << 30
"""The memory of a build step's container unless the request asks for less."""
MAX_SEED_BYTES = 256 << 20

BuildLog = Callable[[str, str, str | None], None]
"""(level, message, step) for each log entry of a build."""
_STEP_LINE = re.compile(r"^Step (\d+)/(\d+) :")


class BuildFailed(CallboxError):
    """A build failed: ``step`` is where (a step index, ``base`` or ``finalize``)."""

    code = ErrorCode.TOOL_FAILED

    def __init__(self, message: str, *, step: str | None = None, code: ErrorCode | None = None) -> None:
        super().__init__(message, code=code or ErrorCode.TOOL_FAILED)
        self.step = step


@dataclass(frozen=True)
class _Base:
    ref: str
    """What FROM names."""
    key: str
    """What identifies it in the cache key: the image id, or ``template:<key>``."""
    env: dict[str, str]
    workdir: str | None


def _ignore(level: str, message: str, step: str | None) -> None:
    pass


class TemplateBuilder:
    """Builds recipes into local images, cached in a :class:`TemplateStore`; see the module docstring."""

    def __init__(self, store: TemplateStore, *, default_image: str = DEFAULT_IMAGE, pull: bool = False,
                 network: str = "none", client: docker.DockerClient | None = None) -> None:
        self.store = store
        self.default_image = default_image
        self.pull = pull
        self.network = network
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect_client(timeout=BUILD_TIMEOUT_S)
        return self._client

    # ---- base ----------------------------------------------------------------------------------

    def _base(self, recipe: Recipe, owner: str) -> _Base:
        if recipe.from_template is not None:
            parent = self.store.find(owner, recipe.from_template)
            built = self.store.built(parent.key) if parent is not None and parent.key else None
            if built is None:
                raise BuildFailed(f"fromTemplate: template {recipe.from_template!r} is not a built template of "
                                  "this server", step="base", code=ErrorCode.NOT_FOUND)
            return _Base(built.image, f"template:{built.key}", dict(built.env), built.workdir)
        name = recipe.from_image or "e2bdev/base"
        ref = self.default_image if name in BASE_ALIASES else name
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            if not self.pull:
                raise BuildFailed(
                    f"fromImage: image {name!r} is not on this host, and this server pulls from no registry; "
                    f"the operator can load it (`docker pull {ref}` or `docker load`), or build on callbox's "
                    "own image (Template().from_base_image())", step="base", code=ErrorCode.IMAGE_NOT_FOUND) from None
            image = self._pull(ref)
        except docker.errors.DockerException as exc:
            raise BuildFailed(f"fromImage: the Docker engine could not look up {ref!r}: {short_reason(exc)}",
                              step="base", code=ErrorCode.ENGINE_UNAVAILABLE) from None
        return _Base(ref, str(image.id), {}, None)

    def _hash_label(self, base: _Base) -> dict[str, str]:
        """A template image inherits its base's labels. On callbox's own image that includes the
        content hash the image builder finds its build by, which would then find the template
        (and tag it as the sandbox image), or an image a failed build left. So every image of
        the build gets a hash of its own from its first instruction on: still a callbox agent's
        image (started without the agent bundle), never that build."""
        try:
            inherited = (self.client.images.get(base.ref).labels or {}).get(LABEL_HASH)
        except docker.errors.DockerException as exc:
            raise BuildFailed(f"the Docker engine could not look up {base.ref!r}: {short_reason(exc)}",
                              step="base", code=ErrorCode.ENGINE_UNAVAILABLE) from None
        return {LABEL_HASH: f"{inherited.split('+', 1)[0]}+template"} if inherited else {}

    def _pull(self, ref: str) -> Any:
        log.info("pulling %s for a template build (pulls are allowed for this build)", ref)
        try:
            return self.client.images.pull(ref)
        except docker.errors.DockerException as exc:
            raise BuildFailed(f"fromImage: pulling {ref!r} failed: {short_reason(exc)}", step="base",
                              code=ErrorCode.IMAGE_NOT_FOUND) from None

    # ---- build ---------------------------------------------------------------------------------

    def cached(self, recipe: Recipe, owner: str) -> Built | None:
        """The cache entry ``recipe`` would build, if the store and Docker both still have it."""
        base = self._base(recipe, owner)
        return self._cached(recipe.cache_key(base.key))

    def _cached(self, key: str) -> Built | None:
        built = self.store.built(key)
        if built is None:
            return None
        try:
            image = self.client.images.get(built.image)
        except docker.errors.ImageNotFound:
            return None
        return built if image.id == built.image_id else None

    def build(self, template: Template, recipe: Recipe, *, memory_mb: int | None = None,
              on_log: BuildLog = _ignore) -> Built:
        """Build ``recipe`` for ``template`` (cached when it can be) and make it the
        template's current build; BuildFailed naming the step otherwise."""
        owner = template.owner
        base = self._base(recipe, owner)
        key = recipe.cache_key(base.key)
        on_log("info", f"base: {recipe.from_template or recipe.from_image} ({base.ref})", "base")
        built = None if recipe.forced else self._cached(key)
        if built is not None:
            on_log("info", f"cached: the same steps were built before (image {built.image})", "finalize")
        else:
            for files_hash in recipe.files_hashes:
                if not self.store.has_files(owner, files_hash):
                    raise BuildFailed(f"the files of hash {files_hash} were not uploaded; upload them first "
                                      "(GET /templates/{id}/files/{hash} gives where)")
            built = self._build(recipe, owner, base, key, memory_mb, on_log)
        template.key = built.key
        template.recipe = recipe.to_json()
        template.start_cmd = recipe.start_cmd
        template.ready_cmd = recipe.ready_cmd
        template.build_count += 1
        template.updated_at = time.time()
        self.store.save(template)
        return built

    def _build(self, recipe: Recipe, owner: str, base: _Base, key: str, memory_mb: int | None,
               on_log: BuildLog) -> Built:
        started = time.monotonic()
        tag = f"{IMAGE_REPO}:{key[:24]}"
        lines = dockerfile_lines(recipe, base.ref, {LABEL_KEY: key}, self._hash_label(base))
        text = "\n".join(line for line, _ in lines) + "\n"
        line_steps = {number: step for number, (_, step) in enumerate(lines, start=1)}
        memory = min(BUILD_MEMORY, memory_mb << 20) if memory_mb else BUILD_MEMORY
        with self._context(recipe, owner, text) as context:
            step: str | None = "base"
            try:
                output = self.client.api.build(
                    fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False,
                    nocache=recipe.forced, network_mode=self.network, decode=True, timeout=BUILD_TIMEOUT_S,
                    container_limits={"memory": memory, "memswap": memory},
                )
                for item in output:
                    if "stream" in item:
                        for line in str(item["stream"]).splitlines():
                            if not line.strip():
                                continue
                            match = _STEP_LINE.match(line)
                            if match:
                                step = line_steps.get(int(match.group(1)), step)
                            on_log("info", line, step)
                    elif "error" in item:
                        message = str(item.get("error") or "the build failed").strip()
                        on_log("error", message, step)
                        raise BuildFailed(f"step {step}: {message}", step=step)
            except docker.errors.DockerException as exc:
                raise BuildFailed(f"the Docker engine failed the build: {short_reason(exc)}", step=step,
                                  code=ErrorCode.ENGINE_UNAVAILABLE) from None
        try:
            image = self.client.images.get(tag)
        except docker.errors.DockerException as exc:
            raise BuildFailed(f"the built image {tag} is not in the engine: {short_reason(exc)}",
                              step="finalize") from None
        env = dict(base.env)
        names = recipe.env_names()
        for entry in (image.attrs.get("Config") or {}).get("Env") or []:
            name, _, value = str(entry).partition("=")
            if name in names:
                env[name] = value
        workdir = recipe.workdir()
        if workdir is not None and not workdir.startswith("/"):
            workdir = posixpath.join(base.workdir or "/", workdir)
        workdir = workdir or base.workdir
        staging = self.store.staging(key)
        try:
            seeds = self._seeds(tag, staging, workdir, on_log)
            built = Built(key=key, image=tag, image_id=str(image.id), env=env, workdir=workdir, seeds=seeds,
                          built_at=time.time(), build_s=round(time.monotonic() - started, 3))
            self.store.publish(staging, built)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        on_log("info", f"built {tag} in {built.build_s:.1f} s", "finalize")
        return built

    @contextlib.contextmanager
    def _context(self, recipe: Recipe, owner: str, text: str) -> Iterator[IO[bytes]]:
        """The build context: the Dockerfile and each COPY step's files under ``step-N/``
        (spooled to disk past a few MiB)."""
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as context:
            with tarfile.open(fileobj=context, mode="w") as tar:
                data = text.encode()
                info = tarfile.TarInfo("Dockerfile")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
                for index, step in enumerate(recipe.steps):
                    if step.type != "COPY" or step.files_hash is None:
                        continue
                    mode = int(step.args[3], 8) if len(step.args) > 3 and step.args[3] else None
                    with self.store.open_files(owner, step.files_hash) as stream:
                        _add_files(tar, stream, step_dir(index), mode)
            context.seek(0)
            yield context

    def _seeds(self, tag: str, staging: Path, workdir: str | None, on_log: BuildLog) -> dict[str, str]:
        places = list(SEED_PLACES)
        if workdir and workdir != "/" and not any(workdir == p or workdir.startswith(p + "/") for p in places):
            places.append(workdir)
        api = self.client.api
        container = api.create_container(tag, entrypoint=["/nonexistent"], command=[], network_disabled=True)
        seeds: dict[str, str] = {}
        try:
            for place in places:
                try:
                    stream, _ = api.get_archive(container["Id"], place)
                except docker.errors.NotFound:
                    continue
                name = f"seed-{len(seeds)}.tar"
                kept, skipped = _repack(stream, staging / name)
                if kept:
                    seeds[place] = name
                    on_log("info", f"{place}: {kept} file(s) and directories kept for the sandboxes"
                           + (f" ({skipped} link(s) or special file(s) left out)" if skipped else ""), "finalize")
                else:
                    (staging / name).unlink()
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                api.remove_container(container["Id"], force=True)
        return seeds

    def remove_image(self, built: Built) -> None:
        """Remove ``built``'s image from Docker (a missing one is gone already)."""
        with contextlib.suppress(docker.errors.NotFound):
            self.client.images.remove(built.image, noprune=False)


def _safe_member(name: str) -> str | None:
    normal = posixpath.normpath(name.lstrip("./") or ".")
    if normal in (".", "") or normal.startswith("../") or normal == ".." or normal.startswith("/"):
        return None
    return normal


def _add_files(tar: tarfile.TarFile, stream: IO[bytes], prefix: str, mode: int | None) -> None:
    """The members of an uploaded archive (gzip or plain) under ``prefix``: regular files,
    directories and symbolic links; a member that would leave the prefix is refused."""
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as source:
            for member in source:
                name = _safe_member(member.name)
                if name is None:
                    raise BuildFailed(f"the uploaded files hold a path outside the template's directory: "
                                      f"{member.name!r}")
                if not (member.isfile() or member.isdir() or member.issym()):
                    continue
                copy = tarfile.TarInfo(f"{prefix}/{name}")
                copy.type, copy.mtime, copy.linkname = member.type, member.mtime, member.linkname
                copy.mode = (mode if mode is not None and member.isfile() else member.mode) & 0o7777
                copy.size = member.size if member.isfile() else 0
                tar.addfile(copy, source.extractfile(member) if member.isfile() else None)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BuildFailed(f"the uploaded files are not a readable tar archive: {exc}") from None


def _repack(chunks: Iterator[bytes], path: Path) -> tuple[int, int]:
    """Docker's archive of a place (members under the place's own name) as a tar relative
    to the place, with its regular files and directories only; (kept, left out)."""

    class _Reader(io.RawIOBase):
        def __init__(self) -> None:
            self.rest = b""

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            while not self.rest:
                try:
                    self.rest = next(chunks)
                except StopIteration:
                    return 0
            size = min(len(buffer), len(self.rest))
            buffer[:size] = self.rest[:size]
            self.rest = self.rest[size:]
            return size

    kept = skipped = total = 0
    with tarfile.open(fileobj=io.BufferedReader(_Reader()), mode="r|") as source, \
            tarfile.open(path, mode="w") as out:
        for member in source:
            _, _, inner = member.name.partition("/")
            if not inner:
                continue
            if not (member.isfile() or member.isdir()):
                skipped += 1
                continue
            total += member.size if member.isfile() else 0
            if total > MAX_SEED_BYTES:
                raise BuildFailed(f"the image holds more than {MAX_SEED_BYTES >> 20} MiB in the places a sandbox "
                                  "covers with scratch space (/home/user, /workspace, its workdir); put large "
                                  "files elsewhere (/opt, /usr/local)", step="finalize")
            member.name = inner
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
            kept += 1
    return kept, skipped


def owner_label(owner: str) -> str:
    return "operator" if owner == OPERATOR else owner
