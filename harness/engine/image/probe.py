"""What the agent layer needs to know about a base image: its Python, glibc and machine, learnt by running it once."""

from __future__ import annotations

import contextlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from harness.engine.image.engine import docker_error
from harness.engine.image.errors import ImageBuildError

MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class BaseInfo:
    """What the agent layer needs to know about the base image (probed by running it once)."""

    python: tuple[int, int]
    glibc: tuple[int, int] | None
    machine: str


def parse_probe(output: str) -> BaseInfo:
    """Parse the JSON line the base-image probe prints."""
    for line in reversed(output.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "python" in doc:
            py = doc["python"]
            glibc = doc.get("glibc")
            return BaseInfo(
                python=(int(py[0]), int(py[1])),
                glibc=(int(glibc[0]), int(glibc[1])) if glibc else None,
                machine=str(doc.get("machine") or platform.machine()),
            )
    raise ValueError(f"unexpected probe output: {output.strip()[-200:]!r}")


_PROBE_SCRIPT = (
    "import json, os, platform, sys\n"
    "try:\n"
    "    lib, ver = os.confstr('CS_GNU_LIBC_VERSION').split()\n"
    "except (AttributeError, OSError, ValueError):\n"
    "    lib, ver = platform.libc_ver()\n"
    "g = [int(x) for x in ver.split('.')[:2]] if lib == 'glibc' and '.' in ver else None\n"
    "print(json.dumps({'python': list(sys.version_info[:2]), 'glibc': g, 'machine': platform.machine()}))\n"
)
#: The image's entry point is /usr/bin/python3 (the Dockerfile links it to PATH's python3 when missing),
#: so that is the interpreter to probe.
_PROBE_SHELL = (
    'py=/usr/bin/python3; [ -x "$py" ] || py="$(command -v python3)" || '
    '{ echo "no python3 in the image" >&2; exit 127; }; exec "$py" -I -c "$0"'
)


def probe_base(client: docker.DockerClient, image: str, image_id: str, cache: Path) -> BaseInfo:
    """Run the base's python3 once (no network) to learn its version, glibc and machine; cached by id."""
    record = cache / "probe" / f"{image_id.replace(':', '-')}.json"
    with contextlib.suppress(OSError, ValueError):
        return parse_probe(record.read_text())
    try:
        raw = client.containers.run(
            image,
            entrypoint=["/bin/sh", "-c", _PROBE_SHELL],
            command=[_PROBE_SCRIPT],
            network_mode="none",
            user="0",
            remove=True,
            stdout=True,
            stderr=True,
        )
    except docker.errors.ContainerError as exc:
        err = exc.stderr.decode(errors="replace").strip() if isinstance(exc.stderr, bytes) else ""
        raise ImageBuildError(
            f"the base image {image} has no working python3 (need Python "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+): {err[-300:] or exc}"
        ) from None
    except docker.errors.APIError as exc:
        raise ImageBuildError(
            f"could not run python3 in the base image {image} (need Python "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ on PATH): {docker_error(exc)}"
        ) from None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    try:
        info = parse_probe(text)
    except ValueError as exc:
        raise ImageBuildError(f"could not read the Python version of the base image {image}: {exc}") from None
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(text.strip() + "\n")
    return info
