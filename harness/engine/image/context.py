"""The agent layer: the build context tar (Dockerfile, wheels, ``sandbox/``) and the streamed ``docker build``."""

from __future__ import annotations

import io
import tarfile
from collections import deque
from pathlib import Path

import docker
import docker.errors

from harness.engine.image.common import Progress
from harness.engine.image.engine import docker_error, find_image
from harness.engine.image.errors import ImageBuildError


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    member.mode = 0o644
    member.mtime = int(mtime)
    tar.addfile(member, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    member = tarfile.TarInfo(name)
    member.type = tarfile.DIRTYPE
    member.mode = 0o755
    member.mtime = 0
    tar.addfile(member)


def build_context(
    dockerfile: str,
    sources: list[tuple[str, bytes, float]],
    wheel_dir: Path,
    wheels: list[str],
    requirements: str,
) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", dockerfile.encode(), 0)
        _add_dir(tar, "wheels")
        _add_bytes(tar, "wheels/requirements.txt", requirements.encode(), 0)
        for name in wheels:
            path = wheel_dir / name
            _add_bytes(tar, f"wheels/{name}", path.read_bytes(), path.stat().st_mtime)
        dirs: set[str] = set()
        for rel, data, mtime in sources:
            parent = rel.rsplit("/", 1)[0]
            chain = parent.split("/")
            for i in range(1, len(chain) + 1):
                d = "/".join(chain[:i])
                if d not in dirs:
                    dirs.add(d)
                    _add_dir(tar, d)
            _add_bytes(tar, rel, data, mtime)
    buf.seek(0)
    return buf


def docker_build(
    client: docker.DockerClient,
    context: io.BytesIO,
    *,
    base_ref: str,
    tag: str,
    labels: dict[str, str],
    progress: Progress,
) -> str:
    tail: deque[str] = deque(maxlen=40)
    image_id: str | None = None
    try:
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            buildargs={"BASE_IMAGE": base_ref},
            labels=labels,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message", "")
                raise ImageBuildError(
                    f"building the agent layer failed: {str(detail).strip()}\n" + "\n".join(list(tail)[-20:])
                )
            text = chunk.get("stream")
            if isinstance(text, str):
                for raw in text.splitlines():
                    line = raw.rstrip()
                    if not line:
                        continue
                    tail.append(line)
                    if line.startswith("Step "):
                        progress(f"  {line[:160]}")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                image_id = aux["ID"]
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"building the agent layer failed: {docker_error(exc)}") from None
    if image_id is None:
        image_id = find_image(client, tag)
    if image_id is None:
        raise ImageBuildError("the build finished without an image id:\n" + "\n".join(tail))
    return image_id
