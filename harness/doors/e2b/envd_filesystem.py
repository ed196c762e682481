"""envd's ``filesystem.Filesystem`` service, over the sandbox agent's own Filesystem RPCs.

Every method maps onto what the agent already does for every other door (``Stat``, ``List``,
``MakeDir``, ``Move``, ``Remove``, ``Watch``), so the agent's confinement applies unchanged:
a path outside the sandbox's allowed places (the workdir, ``/tmp``, the home directory and
the mounts) is ``permission_denied`` naming them.

Users and paths: the sandbox has one unprivileged user (``sandbox``); E2B's default user
``user`` means that user too, no user means it, and any other user is ``permission_denied``,
never silently ignored. ``root`` is refused too, unless the policy allows root commands
(``sandbox.root_commands = true``): then a file operation as root is served exactly as the
sandbox's user's (its places, its permissions, files it writes owned by it), and where
that user may not go the refusal says so (:data:`ROOT_FILES`). Root's own rights on
files (uid 0, without CAP_DAC_OVERRIDE) are for root commands. ``~`` and ``~/...`` expand to its ``HOME``
(``/home/user`` in the E2B door's templates, as in E2B); an empty or relative path is taken
from the sandbox's workdir (``/home/user`` too), the directory commands start in
(:mod:`harness.doors.e2b.envd_process`), so ``files.write("a.txt")`` and ``commands.run("cat
a.txt")`` meet, as they do in an E2B sandbox. The path is then normalised lexically (``..`` as text), and
every path reported back is absolute.

What the SDK sees:

* ``Stat`` follows a final symlink (like envd's ``os.Stat``): a dangling one is ``not_found``,
  so ``files.exists`` says False for it; the entry reports the link (``is_symlink``, the
  target made absolute) with its target's type.
* ``ListDir`` lists hidden entries too, ``depth`` levels down (at most 64), never through a
  symlinked directory; more than 100 000 entries is ``resource_exhausted``, never a silent cut.
* ``MakeDir`` creates parents; an existing directory is ``already_exists`` (the SDK's
  ``make_dir`` returns False), an existing file ``invalid_argument``.
* ``Move`` creates the destination's parents and replaces an existing file (rename(2)).
* ``Remove`` removes a directory with its contents; a path that does not exist is fine
  (envd's ``os.RemoveAll``).
* ``WatchDir`` streams a start event, then changes; ``CreateWatcher`` starts the same watch
  kept here (at most :data:`MAX_WATCHERS` per sandbox, :data:`MAX_PENDING` events each),
  polled by ``GetWatcherEvents``, ended by ``RemoveWatcher`` or with the sandbox.

Watch events, from the agent's inotify: created -> CREATE, modified (content or attributes)
-> WRITE, removed -> REMOVE, moved away -> RENAME, moved in -> CREATE; names relative to the
watched directory. The agent writes files whole under a temporary ``.callbox-*.tmp`` name and
renames it into place; those temporary names are left out and the rename into place is
reported as CREATE and WRITE of the file, what envd reports for a file written in place. A
lost event (the kernel queue overflowed, too many unpolled events) ends the watch with
``data_loss``: events are never dropped silently. Listing, stat, watch, move, remove and
mkdir are not actions of the policy (as in the gRPC door); only copying files in and out is
(:mod:`harness.doors.e2b.envd_files`).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import secrets
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from harness.core.errors import AgentCallError, CallboxError, ErrorCode
from harness.core.root_commands import ROOT_COMMANDS_KEY, ROOT_USER
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.envd import filesystem_pb2 as pb
from harness.doors.e2b.errors import E2bError, from_callbox, invalid, not_found
from harness.doors.e2b.rpc import EnvdCall, Method, Service
from harness.engine.base import LivingSandbox
from harness.engine.cancel import CallScope, current_scope
from harness.engine.spec import HOME, SandboxSpec
from harness.engine.transfer import Watch, WatchChange
from sandbox.v1 import filesystem_pb2 as agent_pb

__all__ = ["HOME", "MAX_PENDING", "MAX_WATCHERS", "ROOT_FILES", "USER", "FilesystemHandlers", "check_user",
           "entry_info",
           "filesystem_service", "fs_errors", "sandbox_path"]

log = logging.getLogger("callbox.e2b")

USER = "user"
"""The sandbox's one user (uid 1000 in the image), named as E2B's default user; ``sandbox``,
its earlier name, means it too."""
USER_ALIASES = frozenset({USER, "sandbox"})
MAX_LIST_DEPTH = 64
"""The agent's deepest listing; deeper is refused rather than cut short."""
LIST_LIMIT = 100_000
MAX_WATCHERS = 4
"""Polled watchers per sandbox (the agent runs at most 8 watches at once, streams included)."""
MAX_PENDING = 10_000
"""Events a polled watcher keeps until they are fetched; one more ends it with data_loss."""
MAX_SYMLINK_HOPS = 40
_TEMP_NAME = re.compile(r"\.callbox-[A-Za-z0-9_-]+\.tmp")
"""The agent's temporary names for a file written whole (Write, Upload, Move across mounts)."""
_EVENT_TYPES = {
    "created": pb.EVENT_TYPE_CREATE,
    "modified": pb.EVENT_TYPE_WRITE,
    "removed": pb.EVENT_TYPE_REMOVE,
    "moved_from": pb.EVENT_TYPE_RENAME,
    "moved_to": pb.EVENT_TYPE_CREATE,
    "attrib": pb.EVENT_TYPE_CHMOD,
}
_FILE_TYPES = {
    agent_pb.FILE_TYPE_FILE: pb.FILE_TYPE_FILE,
    agent_pb.FILE_TYPE_DIRECTORY: pb.FILE_TYPE_DIRECTORY,
    agent_pb.FILE_TYPE_SYMLINK: pb.FILE_TYPE_SYMLINK,
}


# ---- users, paths, errors ------------------------------------------------------------------------


ROOT_FILES = (f"(a file operation as {ROOT_USER!r} is served as the sandbox's user {USER!r}, uid 1000: in its "
              f"places and with its permissions only; run a command as root for the rest)")
"""What a refusal of a file operation asked for as root adds: whose rights it had."""


def check_user(user: str | None, *, root_allowed: bool = False) -> bool:
    """Refuse any user but the sandbox's own (``None``, ``""``, ``sandbox`` or E2B's ``user``),
    and ``root`` unless ``root_allowed`` (the policy's ``sandbox.root_commands``). True when
    the request is root's, which is then served as the sandbox's user's."""
    if not user or user in USER_ALIASES:
        return False
    if user == ROOT_USER:
        if root_allowed:
            return True
        raise E2bError(ErrorCode.PERMISSION_DENIED,
                       f"file operations act as the sandbox's unprivileged user {USER!r} (uid 1000); as "
                       f"{ROOT_USER!r} they are served (as {USER!r}) only where the policy allows root commands "
                       f"({ROOT_COMMANDS_KEY} = false here, the default): leave the user unset, or set [sandbox] "
                       f"root_commands = true in the policy")
    raise E2bError(ErrorCode.PERMISSION_DENIED,
                   f"this sandbox runs everything as its one unprivileged user {USER!r} (uid 1000, E2B's "
                   f"default user) and cannot act as {user!r}: leave the user unset")


def root_allowed(sandbox: E2bSandbox) -> bool:
    """Whether ``sandbox``'s policy allows root commands (and so file operations asked as root)."""
    return sandbox.session.policy.sandbox.root_commands


def sandbox_path(path: str, spec: SandboxSpec) -> str:
    """The absolute, normalised sandbox path of ``path`` in a sandbox of ``spec`` (see the
    module docstring; ``~`` is its ``HOME``)."""
    home = spec.env.get("HOME", HOME)
    if "\0" in path:
        raise invalid("a path cannot contain a NUL character")
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise invalid(f"cannot expand {path.split('/', 1)[0]!r}: only '~' (the home directory {home}) is known")
        path = home + path[1:]
    if not path.startswith("/"):
        path = posixpath.join(spec.workdir, path)
    return "/" + posixpath.normpath(path).lstrip("/")


@contextlib.contextmanager
def fs_errors(sandbox: E2bSandbox, *, as_root: bool = False) -> Iterator[None]:
    """callbox errors as E2bError, with envd's codes for the agent's file refusals: a wrong type
    is ``invalid_argument`` (envd: "path is not a directory"), a full disk ``resource_exhausted``;
    a refused path of a request asked ``as_root`` says whose rights it had (:data:`ROOT_FILES`)."""
    try:
        yield
    except E2bError:
        raise
    except AgentCallError as error:
        if sandbox.closed:
            raise not_found("sandbox", sandbox.sandbox_id) from None
        if as_root and error.reason in ("PERMISSION_DENIED", "PATH_ESCAPE"):
            raise E2bError(error.code, f"{error.message} {ROOT_FILES}") from None
        if error.reason == "WRONG_TYPE":
            raise E2bError(ErrorCode.INVALID_REQUEST, error.message) from None
        if error.reason == "TOO_LARGE":
            raise E2bError(ErrorCode.TOO_LARGE, error.message) from None
        raise from_callbox(error) from None
    except CallboxError as error:
        if sandbox.closed:
            raise not_found("sandbox", sandbox.sandbox_id) from None
        raise from_callbox(error) from None


# ---- entries -------------------------------------------------------------------------------------


def _permissions(kind: pb.FileType.ValueType, mode: int) -> str:
    """As Go's ``FileMode.String`` (what envd sends): ``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``."""
    prefix = {pb.FILE_TYPE_DIRECTORY: "d", pb.FILE_TYPE_SYMLINK: "L"}.get(kind, "")
    if kind == pb.FILE_TYPE_UNSPECIFIED:
        prefix = "?"
    for bit, char in ((stat.S_ISUID, "u"), (stat.S_ISGID, "g"), (stat.S_ISVTX, "t")):
        if mode & bit:
            prefix += char
    bits = "".join(char if mode & (1 << (8 - i)) else "-" for i, char in enumerate("rwxrwxrwx"))
    return (prefix or "-") + bits


def _name_of(ident: int, box: LivingSandbox, *, group: bool) -> str:
    if ident == 0:
        return "root"
    if ident == (box.tool_gid if group else box.tool_uid):
        return USER
    return str(ident)


def entry_info(path: str, info: agent_pb.FileInfo, box: LivingSandbox, *,
               target_type: pb.FileType.ValueType | None = None) -> pb.EntryInfo:
    """envd's EntryInfo for the agent's FileInfo of the absolute ``path``."""
    kind = _FILE_TYPES.get(info.type, pb.FILE_TYPE_UNSPECIFIED)
    entry = pb.EntryInfo(
        name=posixpath.basename(path) or "/", type=kind, path=path, size=info.size, mode=info.mode & 0o777,
        permissions=_permissions(kind, info.mode), owner=_name_of(info.uid, box, group=False),
        group=_name_of(info.gid, box, group=True), modified_time=Timestamp(
            seconds=info.mtime_ns // 1_000_000_000, nanos=info.mtime_ns % 1_000_000_000),
    )
    if info.type == agent_pb.FILE_TYPE_SYMLINK:
        entry.is_symlink = True
        entry.symlink_target = link_target(path, info.link_target)
        if target_type is not None:
            entry.type = target_type
    return entry


def link_target(path: str, target: str) -> str:
    """A symlink's target as an absolute path (a relative target is taken from the link's directory)."""
    return "/" + posixpath.normpath(posixpath.join(posixpath.dirname(path), target)).lstrip("/")


def follow(box: LivingSandbox, path: str) -> tuple[agent_pb.FileInfo, str, agent_pb.FileInfo]:
    """The FileInfo of ``path`` itself, the path a final symlink chain leads to, and its FileInfo
    (``not_found`` for a dangling link, like envd's ``os.Stat``)."""
    own = info = box.agent.stat(path)
    real = path
    for _ in range(MAX_SYMLINK_HOPS):
        if info.type != agent_pb.FILE_TYPE_SYMLINK:
            return own, real, info
        real = link_target(real, info.link_target)
        try:
            info = box.agent.stat(real)
        except AgentCallError as error:
            if error.reason == "NOT_FOUND":
                raise E2bError(ErrorCode.NOT_FOUND, f"{path} is a symlink to {real}, which does not exist") from None
            raise
    raise E2bError(ErrorCode.CONFLICT, f"{path} is a chain of more than {MAX_SYMLINK_HOPS} symlinks (a loop?)")


# ---- watch events --------------------------------------------------------------------------------


class EventTranslator:
    """The agent's watch changes under ``top`` as envd's FilesystemEvents (see the module docstring)."""

    def __init__(self, top: str, box: LivingSandbox, *, include_entry: bool) -> None:
        self.top = top
        self.box = box
        self.include_entry = include_entry
        self._publishing = False

    def __call__(self, change: WatchChange) -> list[pb.FilesystemEvent]:
        if change.kind == "overflow":
            raise E2bError(ErrorCode.DATA_LOST, f"the watch of {self.top} lost events (the sandbox's change queue "
                                        "overflowed); watch it again and list the directory to catch up")
        if _TEMP_NAME.fullmatch(posixpath.basename(change.path)):
            self._publishing = change.kind == "moved_from"
            return []
        publishing, self._publishing = self._publishing, False
        if change.path == self.top:
            return []  # the watched directory itself went away: the stream ends after this
        prefix = self.top.rstrip("/") + "/"
        name = change.path[len(prefix):] if change.path.startswith(prefix) else change.path
        kinds = [pb.EVENT_TYPE_CREATE, pb.EVENT_TYPE_WRITE] if publishing and change.kind == "moved_to" \
            else [_EVENT_TYPES.get(change.kind, pb.EVENT_TYPE_UNSPECIFIED)]
        entry = self._entry(change) if self.include_entry else None
        events = []
        for kind in kinds:
            event = pb.FilesystemEvent(name=name, type=kind)
            if entry is not None:
                event.entry.CopyFrom(entry)
            events.append(event)
        return events

    def _entry(self, change: WatchChange) -> pb.EntryInfo | None:
        if change.kind in ("removed", "moved_from"):
            return None
        try:
            return entry_info(change.path, self.box.agent.stat(change.path), self.box)
        except CallboxError:
            return None  # gone again already


class PolledWatcher:
    """A watch kept for ``GetWatcherEvents``: a thread gathers its events until it ends."""

    def __init__(self, watcher_id: str, sandbox: E2bSandbox, watch: Watch, translate: EventTranslator,
                 on_end: Callable[[PolledWatcher], None]) -> None:
        self.id = watcher_id
        self.sandbox = sandbox
        self.top = translate.top
        self._watch = watch
        self._translate = translate
        self._on_end = on_end
        self._lock = threading.Lock()
        self._events: deque[pb.FilesystemEvent] = deque()
        self._error: E2bError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"e2b-watch-{watcher_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with fs_errors(self.sandbox):
                for change in self._watch:
                    for event in self._translate(change):
                        with self._lock:
                            if len(self._events) >= MAX_PENDING:
                                raise E2bError(ErrorCode.DATA_LOST,
                                    f"watcher {self.id} of {self.top} had {MAX_PENDING} "
                                                            "events not yet fetched and lost the next; poll it "
                                                            "more often, or watch again and list the directory")
                            self._events.append(event)
            self._fail(E2bError(ErrorCode.NOT_FOUND, f"the watch of {self.top} ended: the directory was removed or "
                                             "moved away"))
        except E2bError as error:
            self._fail(error)
        except Exception as error:  # never a silent end of a watcher
            log.exception("watcher %s of sandbox %s failed", self.id, self.sandbox.sandbox_id)
            self._fail(E2bError(ErrorCode.INTERNAL, f"watcher {self.id} failed: {error}"))
        finally:
            self._watch.close()
            self._on_end(self)

    def _fail(self, error: E2bError) -> None:
        with self._lock:
            if self._error is None and not self._closed:
                self._error = error

    def take(self) -> list[pb.FilesystemEvent]:
        """The events since the last call; once they are all fetched, the error that ended it."""
        with self._lock:
            if not self._events and self._error is not None:
                raise self._error
            events = list(self._events)
            self._events.clear()
        return events

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._watch.close()


# ---- the service ---------------------------------------------------------------------------------


class FilesystemHandlers:
    """The handlers of ``filesystem.Filesystem`` and the polled watchers of every sandbox."""

    def __init__(self, sandboxes: E2bSandboxes) -> None:
        self.sandboxes = sandboxes
        self._lock = threading.Lock()
        self._watchers: dict[str, dict[str, PolledWatcher]] = {}

    @staticmethod
    @contextlib.contextmanager
    def _agent(call: EnvdCall) -> Iterator[LivingSandbox]:
        """The running engine sandbox, with the user checked, its errors as E2bError and the
        agent calls made in the request's scope (they end with it)."""
        as_root = check_user(call.user, root_allowed=root_allowed(call.sandbox))
        box = call.sandbox.running()
        with fs_errors(call.sandbox, as_root=as_root), current_scope(call.scope):
            yield box

    def stat(self, request: pb.StatRequest, call: EnvdCall) -> pb.StatResponse:
        with self._agent(call) as box:
            path = sandbox_path(request.path, box.spec)
            own, _, real = follow(box, path)
            return pb.StatResponse(entry=entry_info(path, own, box, target_type=_FILE_TYPES.get(real.type)))

    def list_dir(self, request: pb.ListDirRequest, call: EnvdCall) -> pb.ListDirResponse:
        depth = request.depth or 1
        if depth > MAX_LIST_DEPTH:
            raise invalid(f"depth {depth} is more than this server lists ({MAX_LIST_DEPTH}); ask for less")
        with self._agent(call) as box:
            path = sandbox_path(request.path, box.spec)
            listing = box.agent.list_dir(path, depth=depth, include_hidden=True, limit=LIST_LIMIT)
        if listing.truncated:
            raise E2bError(ErrorCode.TOO_LARGE, f"{path} holds more than {LIST_LIMIT} entries {depth} levels "
                                                 "down; list a subdirectory or a smaller depth")
        entries = [entry_info(posixpath.join(path, info.path), info, box) for info in listing.entries
                   if info.type in _FILE_TYPES]
        return pb.ListDirResponse(entries=entries)

    def make_dir(self, request: pb.MakeDirRequest, call: EnvdCall) -> pb.MakeDirResponse:
        with self._agent(call) as box:
            path = sandbox_path(request.path, box.spec)
            try:
                box.agent.make_dir(path, parents=True, exist_ok=False)
            except AgentCallError as error:
                if error.reason != "ALREADY_EXISTS":
                    raise
                _, _, info = follow(box, path)
                if info.type == agent_pb.FILE_TYPE_DIRECTORY:
                    raise E2bError(ErrorCode.ALREADY_EXISTS, f"directory {path} already exists") from None
                raise invalid(f"{path} already exists and is not a directory") from None
            return pb.MakeDirResponse(entry=entry_info(path, box.agent.stat(path), box))

    def move(self, request: pb.MoveRequest, call: EnvdCall) -> pb.MoveResponse:
        with self._agent(call) as box:
            source = sandbox_path(request.source, box.spec)
            destination = sandbox_path(request.destination, box.spec)
            box.agent.stat(source)  # a missing source is not_found before any directory is made
            box.agent.make_dir(posixpath.dirname(destination), parents=True, exist_ok=True)
            box.transfer.move(source, destination, overwrite=True)
            return pb.MoveResponse(entry=entry_info(destination, box.agent.stat(destination), box))

    def remove(self, request: pb.RemoveRequest, call: EnvdCall) -> pb.RemoveResponse:
        with self._agent(call) as box:
            path = sandbox_path(request.path, box.spec)
            try:
                box.agent.remove(path, recursive=True)
            except AgentCallError as error:
                if error.reason != "NOT_FOUND":
                    raise
        return pb.RemoveResponse()

    def _watch(self, box: LivingSandbox, path: str, *, recursive: bool, include_entry: bool) -> tuple[
            Watch, EventTranslator]:
        _, real, info = follow(box, path)
        if info.type != agent_pb.FILE_TYPE_DIRECTORY:
            raise invalid(f"{path} is not a directory; only a directory can be watched")
        watch = box.transfer.watch(real, recursive=recursive)
        return watch, EventTranslator(real, box, include_entry=include_entry)

    def watch_dir(self, request: pb.WatchDirRequest, call: EnvdCall) -> Iterator[pb.WatchDirResponse]:
        with self._agent(call) as box:
            path = sandbox_path(request.path, box.spec)
            watch, translate = self._watch(box, path, recursive=request.recursive,
                                           include_entry=request.include_entry)
        return self._watch_stream(call.sandbox, watch, translate)

    @staticmethod
    def _watch_stream(sandbox: E2bSandbox, watch: Watch,
                      translate: EventTranslator) -> Iterator[pb.WatchDirResponse]:
        try:
            yield pb.WatchDirResponse(start=pb.WatchDirResponse.StartEvent())
            with fs_errors(sandbox):
                for change in watch:
                    for event in translate(change):
                        yield pb.WatchDirResponse(filesystem=event)
        finally:
            watch.close()

    def create_watcher(self, request: pb.CreateWatcherRequest, call: EnvdCall) -> pb.CreateWatcherResponse:
        sandbox = call.sandbox
        with self._lock:
            if len(self._watchers.get(sandbox.sandbox_id, {})) >= MAX_WATCHERS:
                raise E2bError(ErrorCode.LIMIT_REACHED, f"sandbox {sandbox.sandbox_id} already has {MAX_WATCHERS} "
                                                     "watchers; stop one (WatchHandle.stop) first")
        with self._agent(call) as box, current_scope(CallScope()):  # the watch outlives this request
            path = sandbox_path(request.path, box.spec)
            watch, translate = self._watch(box, path, recursive=request.recursive,
                                           include_entry=request.include_entry)
        watcher_id = "w" + secrets.token_hex(8)
        with self._lock:
            watchers = self._watchers.setdefault(sandbox.sandbox_id, {})
            watchers[watcher_id] = PolledWatcher(watcher_id, sandbox, watch, translate, self._ended)
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    def _ended(self, watcher: PolledWatcher) -> None:
        """A watcher's watch ended: forget it if its sandbox is gone (else it reports why when polled)."""
        if watcher.sandbox.closed:
            self._forget(watcher.sandbox.sandbox_id, watcher.id)

    def _forget(self, sandbox_id: str, watcher_id: str) -> PolledWatcher | None:
        with self._lock:
            watchers = self._watchers.get(sandbox_id, {})
            watcher = watchers.pop(watcher_id, None)
            if not watchers:
                self._watchers.pop(sandbox_id, None)
        return watcher

    def _watcher(self, call: EnvdCall, watcher_id: str) -> PolledWatcher:
        check_user(call.user, root_allowed=root_allowed(call.sandbox))
        with self._lock:
            watcher = self._watchers.get(call.sandbox.sandbox_id, {}).get(watcher_id)
        if watcher is None:
            raise not_found("watcher", watcher_id)
        return watcher

    def get_watcher_events(self, request: pb.GetWatcherEventsRequest, call: EnvdCall) -> pb.GetWatcherEventsResponse:
        return pb.GetWatcherEventsResponse(events=self._watcher(call, request.watcher_id).take())

    def remove_watcher(self, request: pb.RemoveWatcherRequest, call: EnvdCall) -> pb.RemoveWatcherResponse:
        watcher = self._watcher(call, request.watcher_id)
        self._forget(call.sandbox.sandbox_id, watcher.id)
        watcher.close()
        return pb.RemoveWatcherResponse()

    def watchers_of(self, sandbox_id: str) -> list[str]:
        """The ids of a sandbox's polled watchers (for tests and diagnostics)."""
        with self._lock:
            return sorted(self._watchers.get(sandbox_id, {}))


def _keepalive() -> pb.WatchDirResponse:
    return pb.WatchDirResponse(keepalive=pb.WatchDirResponse.KeepAlive())


def filesystem_service(sandboxes: E2bSandboxes) -> Service:
    """envd's ``filesystem.Filesystem`` for the door's sandboxes."""
    fs = FilesystemHandlers(sandboxes)
    unary: list[tuple[str, Any, Callable[..., Any]]] = [
        ("Stat", pb.StatRequest, fs.stat),
        ("ListDir", pb.ListDirRequest, fs.list_dir),
        ("MakeDir", pb.MakeDirRequest, fs.make_dir),
        ("Move", pb.MoveRequest, fs.move),
        ("Remove", pb.RemoveRequest, fs.remove),
        ("CreateWatcher", pb.CreateWatcherRequest, fs.create_watcher),
        ("GetWatcherEvents", pb.GetWatcherEventsRequest, fs.get_watcher_events),
        ("RemoveWatcher", pb.RemoveWatcherRequest, fs.remove_watcher),
    ]
    methods = {name: Method(name, "unary", request, handler) for name, request, handler in unary}
    methods["WatchDir"] = Method("WatchDir", "server_stream", pb.WatchDirRequest, fs.watch_dir, keepalive=_keepalive)
    return Service("filesystem.Filesystem", methods)
