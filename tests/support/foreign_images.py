"""Foreign images for the tests: images callbox did not build, to prove its agent runs in any image.

Each is built offline from Debian's archive (``apt-get download``) or the local ``callbox-base`` image
and loaded with ``docker import``. The tag is content-addressed: a hash of everything that goes in
(package versions, the base image's ID, the recipe), so when the tag exists the builder returns at once.

- ``callbox-test/busybox:<hash12>``: a static busybox and its applets; no libc, no Python, root only.
- ``callbox-test/bookworm-nopython:<hash12>``: callbox-base with every Python package purged,
  flattened to one layer, with a user ``builder`` (uid 1000, home /home/builder).
- ``callbox-test/musl:<hash12>``: musl's loader, a program linked against it, and busybox for sh.

``python -m tests.support.foreign_images`` builds all three and prints their tags.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

RECIPE_VERSION = 2
REPO = "callbox-test"
BASE_REPO = "callbox-base"
ROOT_PASSWD = "root:x:0:0:root:/root:/bin/sh\n"
ROOT_GROUP = "root:x:0:\n"
IMPORT_CHANGES = ["ENV PATH=/bin", 'CMD ["/bin/sh"]']
#: Docker import drops the base's config: Debian's PATH and bash again.
DEBIAN_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]']
#: Applets the tests count on; the build fails if busybox lacks one.
REQUIRED_APPLETS = ("sh", "echo", "ls", "cat", "env", "id", "sleep", "true", "false", "mkdir", "rm",
                    "printf", "grep", "head", "wc")
MUSL_PROGRAM = r"""#include <stdio.h>
int main(void) {
#ifdef __GLIBC__
    puts("libc=glibc");
#else
    puts("libc=musl");
#endif
    return 0;
}
"""
#: What the bookworm image loses: every installed package whose name says python, then any file left.
NOPYTHON_SCRIPT = r"""set -eu
pkgs=$(dpkg-query -W -f '${Package}\n' | grep -i python || true)
if [ -n "$pkgs" ]; then dpkg --purge --force-depends $pkgs >/dev/null; fi
rm -rf /usr/bin/python* /usr/bin/py3* /usr/bin/pydoc* /usr/bin/pip* /usr/lib/python3* /usr/local/lib/python3* \
       /usr/share/python3* /usr/include/python3* /usr/lib/x86_64-linux-gnu/libpython3*
if command -v python3 python python3.11 >/dev/null 2>&1; then echo "python still found" >&2; exit 1; fi
groupadd -g 1000 builder
useradd -m -u 1000 -g 1000 -d /home/builder -s /bin/bash builder
rm -rf /tmp/* /var/tmp/*
"""


class ForeignImageError(RuntimeError):
    """A foreign test image could not be built; the message names what failed."""


def progress(message: str) -> None:
    print(f"[foreign-images] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """/var/cache/callbox-test-images as root, else ``$XDG_CACHE_HOME``/``~/.cache`` callbox-test-images."""
    if os.geteuid() == 0:
        return Path("/var/cache/callbox-test-images")
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return root / "callbox-test-images"


def _tag(name: str, spec: dict[str, object]) -> str:
    digest = hashlib.sha256(json.dumps({"recipe": RECIPE_VERSION, **spec}, sort_keys=True).encode()).hexdigest()
    return f"{REPO}/{name}:{digest[:12]}"


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


@contextlib.contextmanager
def _lock(cache: Path) -> Iterator[None]:
    """One build at a time per cache dir (parallel test sessions)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "build.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except FileNotFoundError:
        raise ForeignImageError(f"{what}: {cmd[0]} is not installed") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-800:]
        raise ForeignImageError(f"{what} failed (exit {done.returncode}): {detail}")
    return done.stdout


def _candidates(*packages: str) -> dict[str, str]:
    """The versions apt would download for ``packages`` (from the local lists, in one call: no network)."""
    if not shutil.which("apt-cache"):
        raise ForeignImageError("apt-cache is not installed: the foreign images are built from Debian packages")
    out = _run(["apt-cache", "policy", *packages], "apt-cache policy")
    found: dict[str, str] = {}
    current = ""
    for line in out.splitlines():
        if line and not line[0].isspace():
            current = line.rstrip(":")
            continue
        key, _, value = line.strip().partition(":")
        if key == "Candidate" and value.strip() not in ("", "(none)"):
            found.setdefault(current, value.strip())
    missing = [pkg for pkg in packages if pkg not in found]
    if missing:
        raise ForeignImageError(f"apt knows no candidate for {missing}; run `apt-get update` (is Debian in sources?)")
    return {pkg: found[pkg] for pkg in packages}


def _download(package: str, version: str, cache: Path) -> Path:
    """The package's .deb in ``cache/debs``, downloaded with ``apt-get download`` unless already there."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    arch = _run(["dpkg", "--print-architecture"], "dpkg --print-architecture").strip()
    for found in (debs / f"{package}_{version.replace(':', '%3a')}_{arch}.deb",
                  Path("/var/cache/apt/archives") / f"{package}_{version.replace(':', '%3a')}_{arch}.deb"):
        if found.is_file():
            return found
    progress(f"apt-get download {package}={version}")
    _run(["apt-get", "download", "-q", f"{package}={version}"], f"apt-get download {package}={version}", cwd=debs)
    matches = sorted(debs.glob(f"{package}_*.deb"))
    if not matches:
        raise ForeignImageError(f"apt-get download {package} left no .deb in {debs}")
    return matches[-1]


def _extract(deb: Path, into: Path) -> None:
    _run(["dpkg-deb", "-x", str(deb), str(into)], f"dpkg-deb -x {deb.name}")


class _Tar:
    """A root filesystem written straight into a tar, every entry owned by root."""

    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path, "w")  # noqa: SIM115 (closed in close())

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.uname, info.gname = kind, mode, 0, 0, "root", "root"
        info.mtime = 0
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def close(self) -> None:
        self.tar.close()


def _busybox_tree(tar: _Tar, busybox: Path) -> list[str]:
    """/bin/busybox with a symlink per applet, /etc/passwd and /etc/group with root only, an empty 0755 /tmp."""
    applets = sorted(set(_run([str(busybox), "--list"], "busybox --list").split()))
    missing = [a for a in REQUIRED_APPLETS if a not in applets]
    if missing:
        raise ForeignImageError(f"busybox-static lacks applets {missing}")
    for name in ("bin", "etc", "root", "dev", "proc", "sys"):
        tar.dir(name, 0o700 if name == "root" else 0o755)
    # 0755, as some images have it: the sandbox's scratch /tmp must still be 1777 over it.
    tar.dir("tmp", 0o755)
    tar.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in applets:
        if applet != "busybox":
            tar.symlink(f"bin/{applet}", "busybox")
    tar.file("etc/passwd", ROOT_PASSWD.encode())
    tar.file("etc/group", ROOT_GROUP.encode())
    return applets


def _import(client: docker.DockerClient, archive: Path, tag: str, changes: list[str] = IMPORT_CHANGES) -> None:
    repo, _, name = tag.rpartition(":")
    progress(f"docker import as {tag}")
    try:
        client.api.import_image_from_file(str(archive), repository=repo, tag=name, changes=changes)
    except docker.errors.APIError as exc:
        raise ForeignImageError(f"docker import of {tag} failed: {exc.explanation or exc}") from None
    if not _exists(client, tag):
        raise ForeignImageError(f"docker import reported success but {tag} does not exist")


def busybox_image(client: docker.DockerClient) -> str:
    """``callbox-test/busybox:<hash12>``: Debian's busybox-static alone (no libc, no Python, no uid 1000)."""
    version = _candidates("busybox-static")["busybox-static"]
    tag = _tag("busybox", {"busybox-static": version, "passwd": ROOT_PASSWD, "group": ROOT_GROUP,
                           "changes": IMPORT_CHANGES})
    if _exists(client, tag):
        return tag
    cache = cache_dir()
    with _lock(cache):
        if _exists(client, tag):
            return tag
        started = time.monotonic()
        progress(f"building {tag}")
        work = Path(tempfile.mkdtemp(prefix="busybox-", dir=cache))
        try:
            _extract(_download("busybox-static", version, cache), work / "deb")
            archive = work / "rootfs.tar"
            tar = _Tar(archive)
            try:
                _busybox_tree(tar, work / "deb/bin/busybox")
            finally:
                tar.close()
            _import(client, archive, tag)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        progress(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def _sandbox_base(client: docker.DockerClient) -> docker.models.images.Image:
    """The callbox-base the test image was built on (its ``callbox.image.base`` label), not
    the newest one: an image variant (code interpreter, desktop) has a base of its own, with
    more Debian packages on Python than the purge below expects."""
    from tests.conftest import IMAGE

    try:
        labels = client.images.get(IMAGE).labels or {}
    except docker.errors.ImageNotFound:
        raise ForeignImageError(f"no local {IMAGE}; build it first with `make image`") from None
    base = labels.get("callbox.image.base", "")
    if not base.startswith(f"{BASE_REPO}:"):
        raise ForeignImageError(f"{IMAGE} names no {BASE_REPO} image it was built on (label callbox.image.base: "
                                f"{base!r}); rebuild it with `make image`")
    try:
        return client.images.get(base)
    except docker.errors.ImageNotFound:
        raise ForeignImageError(f"{base}, which {IMAGE} was built on, is gone; rebuild with `make image`") from None


def bookworm_nopython_image(client: docker.DockerClient) -> str:
    """``callbox-test/bookworm-nopython:<hash12>``: callbox-base without any Python, one layer, user builder (1000)."""
    base = _sandbox_base(client)
    tag = _tag("bookworm-nopython", {"base": base.id, "script": NOPYTHON_SCRIPT, "changes": DEBIAN_CHANGES})
    if _exists(client, tag):
        return tag
    cache = cache_dir()
    with _lock(cache):
        if _exists(client, tag):
            return tag
        started = time.monotonic()
        progress(f"building {tag} from {base.tags[0]}")
        work = Path(tempfile.mkdtemp(prefix="nopython-", dir=cache))
        container = None
        try:
            container = client.containers.create(base.id, ["bash", "-c", NOPYTHON_SCRIPT], network_mode="none",
                                                 user="0", entrypoint=[])
            container.start()
            status = container.wait(timeout=300)
            if status.get("StatusCode") != 0:
                logs = container.logs().decode(errors="replace")[-800:]
                raise ForeignImageError(f"purging Python from {base.tags[0]} failed: {logs}")
            # Exported and imported again: one flat layer, so no lower layer still holds Python.
            progress("exporting the purged file system")
            archive = work / "rootfs.tar"
            with archive.open("wb") as out:
                for chunk in container.export():
                    out.write(chunk)
            _import(client, archive, tag, DEBIAN_CHANGES)
        except docker.errors.APIError as exc:
            raise ForeignImageError(f"building {tag} failed: {exc.explanation or exc}") from None
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
            shutil.rmtree(work, ignore_errors=True)
        progress(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def musl_image(client: docker.DockerClient) -> str:
    """``callbox-test/musl:<hash12>``: musl's loader as /lib/ld-musl-x86_64.so.1, /bin/hello-musl linked
    dynamically against it, busybox for sh; no glibc. Compiled with the host's gcc and musl's specs file
    from the extracted Debian packages, so nothing is installed on the host."""
    versions = _candidates("musl", "musl-dev", "musl-tools", "busybox-static")
    tag = _tag("musl", {**versions, "program": MUSL_PROGRAM, "passwd": ROOT_PASSWD, "changes": IMPORT_CHANGES})
    if _exists(client, tag):
        return tag
    gcc = shutil.which("gcc")
    if not gcc:
        raise ForeignImageError("gcc is not installed on the host (apt-get install gcc): it compiles the musl program")
    cache = cache_dir()
    with _lock(cache):
        if _exists(client, tag):
            return tag
        started = time.monotonic()
        progress(f"building {tag}")
        work = Path(tempfile.mkdtemp(prefix="musl-", dir=cache))
        try:
            sysroot = work / "musl"
            for pkg, version in versions.items():
                _extract(_download(pkg, version, cache), work / "busybox" if pkg == "busybox-static" else sysroot)
            triple = "x86_64-linux-musl"
            specs = (sysroot / f"usr/lib/{triple}/musl-gcc.specs").read_text()
            specs = specs.replace(f"/usr/include/{triple}", str(sysroot / f"usr/include/{triple}"))
            specs = specs.replace(f"/usr/lib/{triple}", str(sysroot / f"usr/lib/{triple}"))
            (work / "musl.specs").write_text(specs)
            (work / "hello.c").write_text(MUSL_PROGRAM)
            _run([gcc, "-specs", str(work / "musl.specs"), "-O2", "-o", str(work / "hello-musl"),
                  str(work / "hello.c")], "compiling the musl program")
            loader = sysroot / f"usr/lib/{triple}/libc.so"
            if not loader.is_file():
                loader = sysroot / f"lib/{triple}/libc.so"
            archive = work / "rootfs.tar"
            tar = _Tar(archive)
            try:
                _busybox_tree(tar, work / "busybox/bin/busybox")
                tar.dir("lib")
                tar.file("lib/ld-musl-x86_64.so.1", loader.read_bytes(), 0o755)
                tar.file("bin/hello-musl", (work / "hello-musl").read_bytes(), 0o755)
            finally:
                tar.close()
            _import(client, archive, tag)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        progress(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def main() -> int:
    client = docker.from_env()
    try:
        for build in (busybox_image, bookworm_nopython_image, musl_image):
            print(build(client), flush=True)
    except ForeignImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
