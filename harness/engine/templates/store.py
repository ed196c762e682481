"""The template store: templates by owner and name, their uploaded files, and the build cache, on disk.

It lives in a persistent state directory (templates survive a restart of the server):
``$CALLBOX_TEMPLATE_DIR``, else ``$XDG_STATE_HOME/callbox/templates`` (absolute only), else
``~/.local/state/callbox/templates``::

    <template dir>/
        templates/<id>.json      one template: id, name, owner, its current build (see Template)
        files/<owner>/<hash>     the archive a client uploaded for a COPY step's files hash
        cache/<key>/build.json   a built image: its tag, env, workdir, seeded places (see Built)
        cache/<key>/seed-N.tar   the files the image has in a place a sandbox covers with a
                                 scratch tmpfs (/home/user, /workspace, a template's workdir)

Ownership: a template belongs to the client that built it (its E2B API key's name) or to the
operator (``owner = ""``, built with ``callbox template build``). A client sees, uses and
removes its own; it sees and uses the operator's, which only the operator removes. A name
is unique per owner, and a client cannot build under a name the operator's templates use.
Uploaded files are kept per owner, so a client never learns what another one uploaded.

Every file is written to a temporary name and renamed into place, so a reader never sees
half of one; the index is the files themselves, read again on each lookup (a server and the
CLI share the directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from harness.core.errors import CallboxError, ErrorCode
from harness.core.state_dirs import state_dir

if TYPE_CHECKING:
    from harness.engine.base import LivingSandbox

__all__ = ["OPERATOR", "Built", "Template", "TemplateStore", "default_template_dir", "valid_name"]

OPERATOR = ""
"""The owner of the operator's templates."""
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_ID = re.compile(r"[a-z0-9]{20}")
_KEY = re.compile(r"[0-9a-f]{64}")


def default_template_dir() -> Path:
    """``$CALLBOX_TEMPLATE_DIR``, else ``$XDG_STATE_HOME/callbox/templates`` (absolute only),
    else ``~/.local/state/callbox/templates``."""
    if chosen := os.environ.get("CALLBOX_TEMPLATE_DIR"):
        return Path(chosen)
    return state_dir() / "templates"


def valid_name(name: str) -> str:
    """``name`` as a template name: lower-case letters, digits, ``.``, ``_``, ``-`` (at most
    63), or ``invalid_request`` saying so."""
    if not _NAME.fullmatch(name):
        raise CallboxError(f"template name {name!r} is not valid: use 1 to 63 lower-case letters, digits, "
                           "'.', '_' or '-', starting with a letter or digit", code=ErrorCode.INVALID_REQUEST)
    return name


@dataclass(frozen=True)
class Built:
    """A built image in the cache, under its recipe's cache key."""

    key: str
    image: str
    """The local image's tag, ``callbox-template:<key[:24]>``."""
    image_id: str
    env: dict[str, str] = field(default_factory=dict)
    """What the recipe's ENV steps set, as the built image has it (``$VAR`` expanded)."""
    workdir: str | None = None
    seeds: dict[str, str] = field(default_factory=dict)
    """Sandbox place -> its archive's file name in the cache entry."""
    built_at: float = 0.0
    build_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Built:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


@dataclass
class Template:
    """One template: who owns it, its name, and its current build's result."""

    template_id: str
    name: str
    owner: str
    created_at: float
    updated_at: float
    key: str | None = None
    """The cache key of its current image (None: never built successfully)."""
    recipe: dict[str, Any] = field(default_factory=dict)
    """The recipe it was built from (:meth:`Recipe.to_json`)."""
    start_cmd: str | None = None
    ready_cmd: str | None = None
    build_id: str | None = None
    """The E2B door's id of the build that made the current image."""
    tags: list[str] = field(default_factory=list)
    """The tags the current build was requested under (E2B's ``name:tag``; ``default`` when none)."""
    build_count: int = 0
    spawn_count: int = 0
    cpu_count: int | None = None
    memory_mb: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Template:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


def _owner_dir(owner: str) -> str:
    """A directory name for ``owner`` (client names may hold any character)."""
    return "operator" if owner == OPERATOR else "c-" + hashlib.sha256(owner.encode()).hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".tmp-{path.name}-{secrets.token_hex(4)}")
    temporary.write_bytes(data)
    os.replace(temporary, path)


class TemplateStore:
    """The templates, files and build cache under one directory; see the module docstring."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else default_template_dir()
        self._lock = threading.Lock()

    # ---- templates ---------------------------------------------------------------------------

    def _template_path(self, template_id: str) -> Path:
        return self.root / "templates" / f"{template_id}.json"

    def all(self) -> list[Template]:
        """Every template, oldest first."""
        found = []
        for path in sorted((self.root / "templates").glob("*.json")):
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                found.append(Template.from_json(json.loads(path.read_text())))
        return sorted(found, key=lambda t: (t.created_at, t.template_id))

    def visible(self, client: str) -> list[Template]:
        """The templates ``client`` sees: its own and the operator's (the operator sees its own)."""
        return [t for t in self.all() if t.owner in (client, OPERATOR)]

    def find(self, client: str, ident: str) -> Template | None:
        """The template ``client`` sees by id or name (its own before the operator's), or None."""
        # name:TAG and name:BUILD_ID name the template's one build, if it was built under that tag
        # or is that build; another tag names nothing (never silently the current build).
        name, _, tag = ident.partition(":")
        seen = self.visible(client)
        for template in seen:
            if template.template_id == ident:
                return template
        mine = [t for t in seen if t.name == name and t.owner == client]
        theirs = [t for t in seen if t.name == name and t.owner == OPERATOR]
        found = mine or theirs
        if not found:
            return None
        template = found[0]
        if tag and tag not in (template.tags or ["default"]) and tag != template.build_id:
            return None
        return template

    def claim(self, owner: str, name: str) -> Template:
        """``owner``'s template ``name``, made if it has none; ``already_exists`` when a
        client names one of the operator's templates."""
        valid_name(name)
        with self._lock:
            for template in self.all():
                if template.name != name:
                    continue
                if template.owner == owner:
                    return template
                if template.owner == OPERATOR:
                    raise CallboxError(f"template name {name!r} is the operator's template on this server; build "
                                       "under another name", code=ErrorCode.ALREADY_EXISTS)
            now = time.time()
            template = Template(template_id=secrets.token_hex(10), name=name, owner=owner, created_at=now,
                                updated_at=now)
            self.save(template)
            return template

    def save(self, template: Template) -> None:
        if not _ID.fullmatch(template.template_id):
            raise CallboxError(f"template id {template.template_id!r} is not one of this store's",
                               code=ErrorCode.INVALID_REQUEST)
        _write_atomically(self._template_path(template.template_id),
                          json.dumps(template.to_json(), indent=1, sort_keys=True).encode())

    def remove(self, template: Template) -> None:
        """Forget ``template`` (its cached image stays for other templates of the same recipe
        until :meth:`prune`)."""
        with contextlib.suppress(FileNotFoundError):
            self._template_path(template.template_id).unlink()

    # ---- uploaded files ----------------------------------------------------------------------

    def files_path(self, owner: str, files_hash: str) -> Path:
        if not _KEY.fullmatch(files_hash):
            raise CallboxError(f"files hash {files_hash!r} is not 64 hex digits", code=ErrorCode.INVALID_REQUEST)
        return self.root / "files" / _owner_dir(owner) / files_hash

    def has_files(self, owner: str, files_hash: str) -> bool:
        return self.files_path(owner, files_hash).is_file()

    def put_files(self, owner: str, files_hash: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        """Keep the archive of ``files_hash`` (streamed); its size. ``too_large`` past ``max_bytes``."""
        path = self.files_path(owner, files_hash)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".tmp-{files_hash}-{secrets.token_hex(4)}")
        size = 0
        try:
            with temporary.open("wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise CallboxError(f"the files of {files_hash[:12]}... are over this server's limit of "
                                           f"{max_bytes >> 20} MiB per COPY step", code=ErrorCode.TOO_LARGE)
                    out.write(chunk)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return size

    @contextlib.contextmanager
    def open_files(self, owner: str, files_hash: str) -> Iterator[IO[bytes]]:
        with self.files_path(owner, files_hash).open("rb") as stream:
            yield stream

    # ---- build cache -------------------------------------------------------------------------

    def cache_dir(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise CallboxError(f"cache key {key!r} is not 64 hex digits", code=ErrorCode.INVALID_REQUEST)
        return self.root / "cache" / key

    def built(self, key: str) -> Built | None:
        """The cache entry of ``key``, or None."""
        try:
            return Built.from_json(json.loads((self.cache_dir(key) / "build.json").read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def staging(self, key: str) -> Path:
        """An empty directory to fill for ``key``'s entry, then :meth:`publish`."""
        path = self.root / "cache" / f".tmp-{key}-{secrets.token_hex(4)}"
        path.mkdir(parents=True)
        return path

    def publish(self, staging: Path, built: Built) -> None:
        (staging / "build.json").write_text(json.dumps(built.to_json(), indent=1, sort_keys=True))
        target = self.cache_dir(built.key)
        with self._lock:
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)

    def seed(self, built: Built, place: str) -> Path:
        return self.cache_dir(built.key) / built.seeds[place]

    def seed_into(self, built: Built, box: LivingSandbox) -> None:
        """Put back, in a new sandbox of ``built``'s image, the files the image holds in the
        places the sandbox covers with scratch tmpfs (a place a mount covers keeps the mount)."""
        places = box.spec.scratch_tmpfs()
        for place in built.seeds:
            if place not in places:
                continue
            with self.seed(built, place).open("rb") as stream:
                box.transfer.upload_tar_stream(place, iter(lambda: stream.read(1 << 20), b""), overwrite=True)

    def keys_in_use(self) -> set[str]:
        return {t.key for t in self.all() if t.key}

    def prune(self) -> list[Built]:
        """Forget every cache entry no template uses; the entries forgotten (their images
        are the caller's to remove)."""
        used = self.keys_in_use()
        gone = []
        for entry in sorted((self.root / "cache").glob("*")):
            if entry.name.startswith(".tmp-"):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if entry.name in used or not _KEY.fullmatch(entry.name):
                continue
            built = self.built(entry.name)
            shutil.rmtree(entry, ignore_errors=True)
            if built is not None:
                gone.append(built)
        return gone
