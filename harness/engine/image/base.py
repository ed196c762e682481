"""The base image: a Debian root filesystem made with debootstrap, pruned, loaded with ``docker import``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

import docker
import docker.errors

from harness.engine.image.common import IMAGE_FORMAT_VERSION, Progress
from harness.engine.image.engine import docker_error, find_image, split_tag
from harness.engine.image.errors import ImageBuildError
from harness.engine.image.sources import apt_sources, find_mirror

BASE_REPO = "callbox-base"
#: Packages on top of debootstrap's minbase: what a coding agent expects to find. debootstrap adds their
#: dependencies (not their recommends); passwd provides useradd/groupadd for the Dockerfile.
BASE_PACKAGES: tuple[str, ...] = (
    "bash",
    "coreutils",
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-dev",
    "build-essential",
    "make",
    "git",
    "ripgrep",
    "patch",
    "curl",
    "ca-certificates",
    "xz-utils",
    "file",
    "unzip",
    "procps",
    "less",
    "passwd",
    # The sql declared tool's PostgreSQL client: psycopg 3 (pure Python over libpq5 through ctypes). With
    # libpq5 and python3-typing-extensions it adds 2.1 MB to the image (measured: 2,144,280 bytes on bookworm),
    # small enough for every image rather than a variant. SQLite is Python's own sqlite3.
    "python3-psycopg",
)
#: What is removed from the debootstrapped tree to keep the base small, as (directory, file names kept
#: anywhere below it): apt caches and lists, logs, manuals, translations, docs but their copyright files.
_ROOTFS_PRUNE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("var/cache/apt", ()),
    ("var/lib/apt/lists", ()),
    ("var/log", ()),
    ("usr/share/man", ()),
    ("usr/share/info", ()),
    ("usr/share/locale", ("locale.alias",)),
    ("usr/share/doc", ("copyright",)),
    ("tmp", ()),
    ("var/tmp", ()),
)


def base_tag(suite: str, machine: str, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """The content-addressed tag of the debootstrapped base for this suite and package set."""
    spec = {
        "format": IMAGE_FORMAT_VERSION,
        "variant": "minbase",
        "suite": suite,
        "machine": machine,
        "packages": sorted(packages),
        "prune": [[rel, list(keep)] for rel, keep in _ROOTFS_PRUNE],
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"{BASE_REPO}:{suite}-{digest[:12]}"


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    found: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) < 2:
                continue
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
            if target.startswith(prefix) or target == prefix.rstrip("/"):
                found.append(target)
    return found


def _remove_tree(path: Path) -> None:
    """Remove a debootstrap target, unmounting what a killed debootstrap may have left (proc, sys)."""
    if not path.exists():
        return
    for _ in range(3):
        mounts = _mounts_under(path)
        if not mounts:
            break
        for target in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    if _mounts_under(path):
        raise ImageBuildError(f"{path} still has mounts below it; unmount them and remove it by hand")
    shutil.rmtree(path, ignore_errors=True)


def _debootstrap_binary() -> str:
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if not found:
        raise ImageBuildError(
            "debootstrap is not installed; run `apt-get install debootstrap` "
            "(or pass --base IMAGE with an existing local image that has Python 3.11+)"
        )
    return found


def _prune_dir(top: Path, keep: tuple[str, ...]) -> None:
    """Delete everything below ``top`` except files named in ``keep`` (and the dirs holding them)."""
    if not top.is_dir() or top.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        here = Path(dirpath)
        for name in filenames + dirnames:
            path = here / name
            if path.is_symlink() or not path.is_dir():
                if name not in keep:
                    path.unlink(missing_ok=True)
            elif not any(path.iterdir()):
                path.rmdir()


def _prune_rootfs(rootfs: Path) -> None:
    for rel, keep in _ROOTFS_PRUNE:
        _prune_dir(rootfs / rel, keep)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (rootfs / "var/tmp").chmod(0o1777)
    # debootstrap copies the host's resolver config and name: none of the host's business in the image
    # (the engine mounts its own over both at run time).
    for name, content in (("etc/resolv.conf", ""), ("etc/hostname", "localhost\n")):
        target = rootfs / name
        if target.is_symlink():
            target.unlink()
        target.write_text(content)


def _run_streaming(cmd: list[str], progress: Progress, label: str, log: deque[str]) -> int:
    """Run ``cmd``, keep its output tail in ``log``, report a line every ~10 s so nobody sits in silence."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    try:
        last = time.monotonic()
        for raw in proc.stdout:
            line = raw.rstrip()
            if not line:
                continue
            log.append(line)
            now = time.monotonic()
            if now - last >= 10:
                progress(f"  {label}: {line}")
                last = now
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: stop it before its target directory is removed
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def build_base(client: docker.DockerClient, tag: str, suite: str, cache: Path, progress: Progress,
               packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """debootstrap ``suite`` with ``packages`` (and their dependencies), pruned, imported as ``tag``."""
    debootstrap = _debootstrap_binary()
    if os.geteuid() != 0:
        raise ImageBuildError(
            "building the base image needs root (debootstrap creates device nodes and chroots); "
            "run `callbox image build` as root, or pass --base IMAGE with an existing local image"
        )
    mirror = find_mirror(suite, apt_sources())
    cache.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=cache))
    try:
        rootfs = workdir / "rootfs"
        cmd = [
            debootstrap,
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
            str(rootfs),
        ]
        if mirror:
            cmd.append(mirror)
        progress(f"debootstrap {suite} from {mirror or 'the default mirror'} (about a minute)...")
        log: deque[str] = deque(maxlen=30)
        started = time.monotonic()
        rc = _run_streaming(cmd, progress, "debootstrap", log)
        if rc != 0:
            detail = list(log)
            with contextlib.suppress(OSError):
                text = (rootfs / "debootstrap/debootstrap.log").read_text(errors="replace")
                detail += text.splitlines()[-15:]
            raise ImageBuildError(f"debootstrap {suite} failed (exit {rc}); last output:\n" + "\n".join(detail[-30:]))
        progress(f"debootstrap done in {time.monotonic() - started:.0f} s")
        _prune_rootfs(rootfs)
        progress(f"importing base as {tag}...")
        archive = workdir / "rootfs.tar"
        tar = subprocess.run(
            ["tar", "--numeric-owner", "--one-file-system", "-C", str(rootfs), "-cf", str(archive), "."],
            capture_output=True,
            text=True,
            check=False,
        )
        if tar.returncode != 0:
            raise ImageBuildError(f"could not pack the base root filesystem: {tar.stderr.strip()[-500:]}")
        repo, name = split_tag(tag)
        try:
            client.api.import_image_from_file(str(archive), repository=repo, tag=name)
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import of the base failed: {docker_error(exc)}") from None
        image_id = find_image(client, tag)
        if image_id is None:
            raise ImageBuildError(f"docker import reported success but {tag} does not exist")
        return image_id
    finally:
        _remove_tree(workdir)
