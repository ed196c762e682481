"""The agent's wheelhouse: pinned dependency versions, manylinux platforms, ``pip download`` and its cache."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from harness.engine.image.common import Progress
from harness.engine.image.errors import ImageBuildError
from harness.engine.image.probe import BaseInfo

#: The agent's runtime dependencies (sandbox/ depends on the stdlib and these only).
AGENT_DEPENDENCIES: tuple[str, ...] = ("grpcio", "protobuf", "psutil")
_WHEEL_MANIFEST = "callbox-wheels.json"


def dependency_pins(names: tuple[str, ...] = AGENT_DEPENDENCIES) -> dict[str, str]:
    """The versions installed next to the harness (importlib.metadata), so the image matches them."""
    pins: dict[str, str] = {}
    for name in names:
        try:
            pins[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise ImageBuildError(
                f"the agent dependency {name} is not installed next to callbox; "
                f"install it (pip install {name}) so its version can be pinned in the image"
            ) from None
    return pins


def manylinux_platforms(glibc: tuple[int, int] | None, machine: str) -> list[str]:
    """The manylinux tags a base with this glibc accepts, newest first (pip does not expand them)."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    major, minor = glibc if glibc and glibc[0] == 2 else (2, 28)
    minor = max(minor, 17)
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    for m, name in legacy.items():
        if m <= minor and (m != 12 or arch in {"x86_64", "i686"}) and (m != 5 or arch in {"x86_64", "i686"}):
            tags.append(f"{name}_{arch}")
    return tags


def pip_download_command(
    *,
    dest: Path,
    python: tuple[int, int],
    platforms: list[str],
    pins: dict[str, str],
    wheelhouse: Path | None,
    executable: str = sys.executable,
) -> list[str]:
    """``pip download`` of the pip wheel and the pinned agent dependencies for the base's Python."""
    xy = f"{python[0]}{python[1]}"
    cmd = [
        executable, "-m", "pip", "download",
        "--disable-pip-version-check", "--no-input", "--quiet",
        "--only-binary=:all:",
        "--python-version", f"{python[0]}.{python[1]}",
        "--implementation", "cp",
        "--abi", f"cp{xy}",
    ]  # fmt: skip
    for plat in platforms:
        cmd += ["--platform", plat]
    if wheelhouse is not None:
        cmd += ["--no-index", "--find-links", str(wheelhouse)]
    # The pip wheel that installs the others inside the build: the host's own version,
    # so a fresh machine gets the same one (it is not an agent dependency).
    cmd += ["-d", str(dest), f"pip=={importlib.metadata.version('pip')}"]
    cmd += [f"{name}=={version}" for name, version in sorted(pins.items())]
    return cmd


def requirements_text(pins: dict[str, str]) -> str:
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def _wheelhouse_dir(cache: Path, info: BaseInfo, platforms: list[str], pins: dict[str, str]) -> tuple[Path, str]:
    key_doc = {"python": info.python, "platforms": platforms, "pins": sorted(pins.items()), "impl": "cp"}
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
    return cache / "wheelhouse" / f"cp{info.python[0]}{info.python[1]}-{info.machine}-{key[:12]}", key


def _cached_wheels(dest: Path, key: str) -> list[str] | None:
    try:
        manifest = json.loads((dest / _WHEEL_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("key") != key or not isinstance(files, list) or not files:
        return None
    if not all(isinstance(f, str) and (dest / f).is_file() for f in files):
        return None
    return sorted(files)


def download_wheels(
    cache: Path, info: BaseInfo, pins: dict[str, str], wheelhouse: Path | None, progress: Progress
) -> tuple[Path, list[str]]:
    platforms = manylinux_platforms(info.glibc, info.machine)
    dest, key = _wheelhouse_dir(cache, info, platforms, pins)
    cached = _cached_wheels(dest, key)
    if cached is not None:
        return dest, cached
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ImageBuildError(f"wheelhouse {wheelhouse} is not a directory")
    where = f"from {wheelhouse}" if wheelhouse is not None else "from the package index"
    pretty = ", ".join(f"{n}=={v}" for n, v in sorted(pins.items()))
    progress(f"downloading wheels for Python {info.python[0]}.{info.python[1]} {where} (pip, {pretty})...")
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):
        stale.unlink()
    cmd = pip_download_command(dest=dest, python=info.python, platforms=platforms, pins=pins, wheelhouse=wheelhouse)
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        if wheelhouse is not None:
            hint = (
                f" (the wheelhouse must hold pip and {pretty} as wheels for CPython "
                f"{info.python[0]}.{info.python[1]} on {platforms[0]} or an older manylinux)"
            )
        else:
            hint = " (offline? pass a wheelhouse directory that holds these wheels)"
        raise ImageBuildError(f"pip download of the agent's wheels failed{hint}:\n{tail}")
    files = sorted(p.name for p in dest.glob("*.whl"))
    if not any(f.startswith("pip-") for f in files):
        raise ImageBuildError(f"pip download produced no pip wheel in {dest}")
    (dest / _WHEEL_MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1) + "\n")
    return dest, files
