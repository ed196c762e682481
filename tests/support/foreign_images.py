"""Images without Python for the tests, built offline from Debian's archive and local images.

- ``busybox_image``: Debian's ``busybox-static`` alone (no libc, no Python, no ``/lib64``),
  with a root-only user database and an image ``/tmp`` of mode 0755, as some images have.
- ``musl_image``: the same BusyBox with Debian's ``musl`` as the image's libc and loader
  (``/lib/ld-musl-x86_64.so.1``), the libc of Alpine: tools may use it, the agent never does.
- ``bookworm_nopython_image``: callbox's debootstrapped bookworm base with every python3
  package purged (bash and coreutils stay), re-imported so no layer keeps Python, and uid 1000
  named ``builder``.

Each tag is content-addressed (a hash of what goes in), so a second build is a lookup.
``python -m tests.support.foreign_images`` builds them all and prints the tags.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker
import docker.errors

CACHE = Path("/var/cache/callbox-test-images")
BUSYBOX_APPLETS = ("sh", "echo", "ls", "cat", "env", "id", "sleep", "true", "false", "mkdir", "rm", "printf",
                   "grep", "head", "wc", "kill", "ps", "tr", "test", "[")
PURGED = "^(lib)?python3"
"""The packages purged from the bookworm base (a grep pattern over package names)."""


class ForeignImageError(RuntimeError):
    """A test image could not be built; the message says which step failed."""


def _say(message: str) -> None:
    print(f"test images: {message}", file=sys.stderr, flush=True)


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(argv: list[str], what: str, **options: object) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(argv, capture_output=True, check=False, **options)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise ForeignImageError(f"{what} failed ({' '.join(argv[:3])}...): {result.stderr.decode()[-400:]}")
    return result  # type: ignore[no-any-return]


def _import(client: docker.DockerClient, root: Path, tag: str, changes: list[str]) -> str:
    argv = ["docker", "import"]
    for change in changes:
        argv += ["--change", change]
    tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    try:
        _run([*argv, "-", tag], f"docker import of {tag}", stdin=tar.stdout)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    return tag


def _deb(package: str) -> Path:
    """Debian's package file for ``package``, downloaded once into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"{package}_*.deb"))
    if not found:
        _say(f"downloading Debian's {package}...")
        _run(["apt-get", "download", package], f"apt-get download {package}", cwd=CACHE)
        found = sorted(CACHE.glob(f"{package}_*.deb"))
    if not found:
        raise ForeignImageError(f"apt-get download left no {package} .deb in {CACHE}")
    return found[-1]


def busybox_image(client: docker.DockerClient) -> str:
    return _busybox_based(client, "busybox", [])


def musl_image(client: docker.DockerClient) -> str:
    return _busybox_based(client, "musl", ["musl"])


def _busybox_based(client: docker.DockerClient, name: str, packages: list[str]) -> str:
    debs = [_deb("busybox-static"), *(_deb(p) for p in packages)]
    inputs = b"".join(d.read_bytes() for d in debs) + " ".join(BUSYBOX_APPLETS).encode() + b"v1"
    tag = f"callbox-test/{name}:{hashlib.sha256(inputs).hexdigest()[:12]}"
    if _exists(client, tag):
        return tag
    _say(f"building {tag}...")
    work = Path(tempfile.mkdtemp(prefix=f"callbox-{name}-"))
    try:
        unpacked = work / "deb"
        _run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], "dpkg-deb -x busybox-static")
        root = work / "root"
        for deb in debs[1:]:
            _run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
        (root / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(unpacked / "bin" / "busybox", root / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
        (root / "etc").mkdir(exist_ok=True)
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        (root / "tmp").mkdir(mode=0o755)
        (root / "tmp").chmod(0o755)
        return _import(client, root, tag, ["ENV PATH=/bin", 'CMD ["/bin/sh"]'])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _callbox_base(client: docker.DockerClient) -> str:
    tags = sorted(t for image in client.images.list(name="callbox-base") for t in image.tags)
    if not tags:
        raise ForeignImageError("no callbox-base image here: build the sandbox image first (`make image`)")
    return tags[-1]


def bookworm_nopython_image(client: docker.DockerClient) -> str:
    base = _callbox_base(client)
    base_id = client.images.get(base).id
    digest = hashlib.sha256(f"{base_id} {PURGED} builder v1".encode()).hexdigest()[:12]
    tag = f"callbox-test/bookworm-nopython:{digest}"
    if _exists(client, tag):
        return tag
    _say(f"building {tag} from {base} without python3...")
    script = (
        "set -e; dpkg --purge --force-depends --force-remove-essential "
        f"$(dpkg-query -W -f='${{Package}}\\n' | grep -E '{PURGED}' | tr '\\n' ' ') >/dev/null; "
        "rm -rf /usr/lib/python3* /usr/bin/python3* /usr/local/lib/python3*; "
        "groupadd -g 1000 builder; useradd -u 1000 -g 1000 -d /home/builder -m -s /bin/bash builder; "
        "! command -v python3"
    )
    container = client.containers.run(base, ["sh", "-c", script], detach=True, network_mode="none", user="0:0")
    try:
        status = container.wait(timeout=300)
        if status.get("StatusCode") != 0:
            logs = container.logs(tail=20).decode("utf-8", "replace")
            raise ForeignImageError(f"purging python3 from {base} failed: {logs}")
        # Flattened from the container's files, so no lower layer still holds Python.
        export = subprocess.Popen(["docker", "export", container.id], stdout=subprocess.PIPE)
        try:
            _run(["docker", "import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                  "/sbin:/bin", "--change", 'CMD ["/bin/bash"]', "-", tag], f"docker import of {tag}",
                 stdin=export.stdout)
        finally:
            assert export.stdout is not None
            export.stdout.close()
            export.wait()
    finally:
        container.remove(force=True)
    _check_tar_has_no_python(client, tag)
    return tag


def _check_tar_has_no_python(client: docker.DockerClient, tag: str) -> None:
    out = client.containers.run(tag, ["sh", "-c", "command -v python3 || echo none"], remove=True,
                                network_mode="none")
    if out.strip() != b"none":
        raise ForeignImageError(f"{tag} still has python3 at {out.decode().strip()}")


def all_images(client: docker.DockerClient) -> dict[str, str]:
    return {"busybox": busybox_image(client), "musl": musl_image(client),
            "bookworm-nopython": bookworm_nopython_image(client)}


if __name__ == "__main__":
    for name, built in all_images(docker.from_env(timeout=600)).items():
        print(f"{name}\t{built}")
