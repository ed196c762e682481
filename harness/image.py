"""Build the sandbox image offline and idempotently (``callbox image build``).

Two layers, no registry needed (DESIGN.md section 5):

1. **Base** (skipped with ``base=IMAGE``): a Debian root filesystem made with
   ``debootstrap --variant=minbase --include=...`` for the host's suite (VERSION_CODENAME from
   /etc/os-release on a Debian host, otherwise ``bookworm``), from the first mirror in the machine's own
   apt sources that serves that suite (or debootstrap's default; no mirror host is written here), loaded
   with ``docker import`` as ``callbox-base:<suite>-<hash12>``. The tag is content-addressed over the
   suite, package list and architecture, so it is reused as long as it exists.
2. **Agent layer**: ``images/Dockerfile`` (classic builder, works on Docker 20.10) on top of the base:
   user ``sandbox`` (1000:1000), ``/workspace``, the agent's Python dependencies (the exact grpcio,
   protobuf and psutil versions installed on the host, so generated gRPC code matches) installed from a
   host-side wheelhouse into ``/opt/callbox/lib``, the ``sandbox/`` package next to them, and
   ``ENTRYPOINT ["/usr/bin/python3", "-I", "-S", "/opt/callbox/agent.py"]``.

Idempotence: a content hash over (base image id, Dockerfile text, ``sandbox/`` sources, dependency
versions, wheel file names, :data:`IMAGE_FORMAT_VERSION`) is stored as the label ``callbox.image.hash``;
when an image with that label exists it is only (re)tagged. The wheelhouse for a given
(Python, platform, pins) lives in its own cache directory with a manifest, so a rerun skips pip.

Everything here is library code: the CLI wires it to ``callbox image build [--base IMAGE] [--tag TAG]``.
User-facing failures raise :class:`ImageBuildError` with a readable message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from harness.errors import CallboxError

__all__ = [
    "DEFAULT_TAG",
    "IMAGE_FORMAT_VERSION",
    "ImageBuildError",
    "ImageBuildResult",
    "build_image",
    "default_repo_root",
    "find_image",
]

DEFAULT_TAG = "callbox-sandbox:latest"
IMAGE_REPO = "callbox-sandbox"
BASE_REPO = "callbox-base"
#: Bump when the image layout changes in a way the hashed inputs do not capture.
IMAGE_FORMAT_VERSION = 1
LABEL_HASH = "callbox.image.hash"
LABEL_VERSION = "callbox.image.version"
LABEL_BASE = "callbox.image.base"

DEFAULT_SUITE = "bookworm"
MIN_PYTHON = (3, 11)
#: Packages on top of debootstrap's minbase; passwd provides useradd/groupadd.
BASE_PACKAGES: tuple[str, ...] = (
    "bash",
    "coreutils",
    "python3",
    "git",
    "procps",
    "ripgrep",
    "patch",
    "curl",
    "ca-certificates",
    "passwd",
)
#: The agent's runtime dependencies (sandbox/ depends on the stdlib and these only).
AGENT_DEPENDENCIES: tuple[str, ...] = ("grpcio", "protobuf", "psutil")
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
_SANDBOX_SUFFIXES = (".py", ".pyi")
_WHEEL_MANIFEST = "callbox-wheels.json"

Progress = Callable[[str], None]


class ImageBuildError(CallboxError):
    """The image could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class ImageBuildResult:
    tag: str
    image_id: str
    content_hash: str
    built: bool  # False when it was already up to date
    seconds: float


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` entry of the machine's apt configuration."""

    uri: str
    suites: tuple[str, ...]


@dataclass(frozen=True)
class BaseInfo:
    """What the agent layer needs to know about the base image (probed by running it once)."""

    python: tuple[int, int]
    glibc: tuple[int, int] | None
    machine: str


# --------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested without Docker)


def default_repo_root() -> Path:
    """The checkout that holds ``sandbox/`` and ``images/`` (harness is installed editable from it)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/callbox``, else ``~/.cache/callbox``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return root / "callbox"


def parse_os_release(text: str) -> dict[str, str]:
    """Parse /etc/os-release (shell-style ``KEY=value`` lines, values optionally quoted)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The Debian suite to debootstrap: the host's codename on Debian, else ``bookworm``."""
    try:
        info = parse_os_release(os_release.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return DEFAULT_SUITE
    codename = info.get("VERSION_CODENAME", "")
    if info.get("ID") == "debian" and re.fullmatch(r"[a-z][a-z0-9-]*", codename):
        return codename
    return DEFAULT_SUITE


def parse_one_line_sources(text: str) -> list[AptSource]:
    """Parse the one-line format (``deb [opts] URI SUITE [COMPONENT...]``); ``deb-src`` is skipped."""
    out: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind != "deb":
            continue
        rest = rest.strip()
        if rest.startswith("["):
            close = rest.find("]")
            if close < 0:
                continue
            rest = rest[close + 1 :].strip()
        fields = rest.split()
        if len(fields) < 2:
            continue
        out.append(AptSource(uri=fields[0], suites=(fields[1],)))
    return out


def parse_deb822_sources(text: str) -> list[AptSource]:
    """Parse deb822 ``.sources`` stanzas (``Types``/``URIs``/``Suites``; ``Enabled: no`` is skipped)."""
    out: list[AptSource] = []
    for stanza in _deb822_stanzas(text):
        if stanza.get("enabled", "yes").strip().lower() in {"no", "false", "0"}:
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        suites = tuple(stanza.get("suites", "").split())
        out.extend(AptSource(uri=uri, suites=suites) for uri in stanza.get("uris", "").split())
    return out


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    last: str | None = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if stanza:
                yield stanza
            stanza, last = {}, None
            continue
        if raw[0] in " \t":
            if last is not None:
                stanza[last] += " " + raw.strip()
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        last = key.strip().lower()
        stanza[last] = value.strip()
    if stanza:
        yield stanza


def apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """All ``deb`` entries in apt's reading order: sources.list, then sources.list.d/ by file name."""
    out: list[AptSource] = []
    main = etc_apt / "sources.list"
    with contextlib.suppress(OSError):
        out.extend(parse_one_line_sources(main.read_text(encoding="utf-8", errors="replace")))
    parts = etc_apt / "sources.list.d"
    try:
        names = sorted(p for p in parts.iterdir() if p.is_file())
    except OSError:
        names = []
    for path in names:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if path.name.endswith(".list"):
            out.extend(parse_one_line_sources(text))
        elif path.name.endswith(".sources"):
            out.extend(parse_deb822_sources(text))
    return out


def find_mirror(suite: str, sources: list[AptSource]) -> str | None:
    """The first usable ``deb`` URI whose suites include ``suite`` exactly, or None."""
    for source in sources:
        if suite in source.suites and re.match(r"(?i)(https?|file)://", source.uri):
            return source.uri.rstrip("/")
    return None


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


# --------------------------------------------------------------------------------------------------
# Docker helpers


def find_image(client: docker.DockerClient, tag: str = DEFAULT_TAG) -> str | None:
    """The id of the local image ``tag``, or None when there is none."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        # 20.10 answers an invalid reference with 400 rather than 404.
        if exc.status_code == 400:
            return None
        raise
    return str(image.id)


def _image_with_hash(client: docker.DockerClient, digest: str) -> str | None:
    images = client.images.list(filters={"label": f"{LABEL_HASH}={digest}"})
    for image in images:
        if image.labels.get(LABEL_HASH) == digest:
            return str(image.id)
    return None


_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)"
_REFERENCE = re.compile(rf"({_DOMAIN}?{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*)(?::([\w][\w.-]{{0,127}}))?")


def split_tag(tag: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag), validated like Docker does (lowercase name, no digest)."""
    match = _REFERENCE.fullmatch(tag)
    if match is None or len(match.group(1)) > 255:
        raise ImageBuildError(f"invalid image tag {tag!r}: use NAME[:TAG] with a lowercase name (e.g. {DEFAULT_TAG})")
    return match.group(1), match.group(2) or "latest"


def _docker_error(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text).strip().splitlines()[-1] if str(text).strip() else type(exc).__name__


def _ping(client: docker.DockerClient) -> None:
    try:
        client.ping()
    except Exception as exc:  # requests/urllib3 raise various types for an unreachable socket
        raise ImageBuildError(
            f"the Docker engine is unreachable ({_docker_error(exc)}); start dockerd or set DOCKER_HOST"
        ) from None


def _tag(client: docker.DockerClient, image_id: str, tags: list[str]) -> None:
    for full in tags:
        repo, name = split_tag(full)
        try:
            ok = client.api.tag(image_id, repo, name, force=True)
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"could not tag {image_id[7:19]} as {full}: {_docker_error(exc)}") from None
        if not ok:
            raise ImageBuildError(f"the Docker engine refused to tag {image_id[:19]} as {full}")


def _probe_base(client: docker.DockerClient, image: str, image_id: str, cache: Path) -> BaseInfo:
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
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ on PATH): {_docker_error(exc)}"
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


# --------------------------------------------------------------------------------------------------
# Base image: debootstrap + docker import


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


def _build_base(client: docker.DockerClient, tag: str, suite: str, cache: Path, progress: Progress) -> str:
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
            f"--include={','.join(BASE_PACKAGES)}",
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
            raise ImageBuildError(f"docker import of the base failed: {_docker_error(exc)}") from None
        image_id = find_image(client, tag)
        if image_id is None:
            raise ImageBuildError(f"docker import reported success but {tag} does not exist")
        return image_id
    finally:
        _remove_tree(workdir)


# --------------------------------------------------------------------------------------------------
# Wheels


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


def _download_wheels(
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


# --------------------------------------------------------------------------------------------------
# Agent layer


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


def _build_context(
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


def _docker_build(
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
        raise ImageBuildError(f"building the agent layer failed: {_docker_error(exc)}") from None
    if image_id is None:
        image_id = find_image(client, tag)
    if image_id is None:
        raise ImageBuildError("the build finished without an image id:\n" + "\n".join(tail))
    return image_id


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
    _ping(client)
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
                    base_id = _build_base(client, base_ref, suite, cache, progress)
            info = _probe_base(client, base_ref, base_id, cache)
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
            wheel_dir, wheels = _download_wheels(cache, info, pins, wheelhouse, progress)
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
                existing = _image_with_hash(client, digest)
            except docker.errors.APIError as exc:
                raise ImageBuildError(f"could not list images: {_docker_error(exc)}") from None
            if existing is not None:
                _tag(client, existing, tags)
                seconds = time.monotonic() - started
                progress(f"up to date: {tag} ({existing[7:19]}, hash {digest[:12]})")
                return ImageBuildResult(tag=tag, image_id=existing, content_hash=digest, built=False, seconds=seconds)
            progress(f"building agent layer on {base_ref} (Python {info.python[0]}.{info.python[1]})...")
            context = _build_context(
                dockerfile,
                sources,
                wheel_dir,
                wheels,
                requirements_text(pins),
            )
            labels = {LABEL_HASH: digest, LABEL_VERSION: str(IMAGE_FORMAT_VERSION), LABEL_BASE: base_ref}
            image_id = _docker_build(client, context, base_ref=base_ref, tag=tag, labels=labels, progress=progress)
            _tag(client, image_id, tags)
            seconds = time.monotonic() - started
            progress(f"built {tag} ({image_id[7:19]}, hash {digest[:12]}) in {seconds:.0f} s")
            return ImageBuildResult(tag=tag, image_id=image_id, content_hash=digest, built=True, seconds=seconds)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        # ImageBuildError covers what we expect; this is the engine failing or going away mid-build.
        raise ImageBuildError(f"the Docker engine failed during the image build: {_docker_error(exc)}") from None
