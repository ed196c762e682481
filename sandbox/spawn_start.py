"""How the spawner starts one command: ``posix_spawn`` as the tool user, with its marker group.

``subprocess`` can only fork to start a process as another user: vfork is unsafe there in
general, because glibc changes the ids of every thread of a process. The spawner has one
thread, so it can do what a vfork child cannot: it takes the command's groups and its real
uid and gid itself, keeping root as its effective and saved ids (and with them its
capabilities), and calls ``posix_spawn`` with ``POSIX_SPAWN_RESETIDS``. glibc's child,
created with ``CLONE_VM | CLONE_VFORK``, sets its effective ids to those real ids, which
drops every capability; the exec then makes all its ids the tool user's. The spawner
takes its own ids back at once. Measured against ``subprocess`` on a 2-CPU host: a third
of the CPU per command, and no copy of the spawner's page tables.

Everything else ``subprocess`` would do for the command is done here too:
- a new session (``setsid``); SIGPIPE and SIGXFSZ, which CPython ignores, back to default;
- the OOM score: the child inherits the spawner's, raised around the spawn;
- the working directory: entered by the spawner with the tool user's filesystem ids (the
  spawner has no CAP_DAC_OVERRIDE, and a 0700 project mounted from the host must work),
  inherited by the child, and left again;
- no descriptor but stdio: every descriptor of the spawner is close-on-exec;
- ``argv[0]`` searched on the command's own PATH, with ``subprocess``'s errors
  (the first that is not ENOENT or ENOTDIR, else the last; the filename is ``argv[0]``,
  or the working directory when that is what failed).

While the spawner's real uid is the tool user's (a few microseconds per command), a tool
process may signal it; it cannot trace it (the spawner has capabilities the tool has not).
Killing it only stops one's own sandbox from starting commands, as a tool process could
do anyway by exhausting the pids limit.

A command that gets a controlling terminal still starts through ``subprocess``: taking a
terminal needs code in the child, and terminals are interactive, where a millisecond does
not show.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import subprocess
import termios

from sandbox.identity import FsIdentity

TYPE_CHECKING = False  # the spawner imports this module before the agent imports typing
if TYPE_CHECKING:
    from typing import Any

OOM_SCORE_ADJ = "/proc/self/oom_score_adj"
TOOL_OOM_SCORE = b"1000"
"""Tool processes are the OOM killer's first choice, so a memory bomb of many small
processes cannot get the agent killed."""

_SKIPPED = (errno.ENOENT, errno.ENOTDIR)


class Starter:
    """Starts commands for the spawner (single-threaded: it changes the process's own ids)."""

    def __init__(self) -> None:
        # The spawner raises its own OOM score around each start and lowers it back, which
        # needs no privilege as long as it goes no lower than where it started.
        try:
            self._oom = os.open(OOM_SCORE_ADJ, os.O_RDWR | os.O_CLOEXEC)
            self._own_oom = os.pread(self._oom, 32, 0).strip() or b"0"
        except OSError:
            self._oom = -1
            self._own_oom = b""
        _close_on_exec_everything()

    def start(self, request: dict[str, Any], stdin: int, stdout: int,
              stderr: int) -> tuple[int, subprocess.Popen[bytes] | None]:
        """Start the request's command on these stdio descriptors; its pid (and its Popen, if
        ``subprocess`` started it). Raise the OSError of a failed start, or ValueError for
        what exec cannot take (a NUL byte)."""
        self._set_oom(TOOL_OOM_SCORE)
        try:
            if request.get("ctty"):
                proc = _popen(request, stdin, stdout, stderr)
                return proc.pid, proc
            return _posix_spawn(request, stdin, stdout, stderr), None
        finally:
            self._set_oom(self._own_oom)

    def _set_oom(self, value: bytes) -> None:
        if self._oom >= 0:
            with contextlib.suppress(OSError):
                os.pwrite(self._oom, value, 0)


def _close_on_exec_everything() -> None:
    """Mark every descriptor above stdio close-on-exec: ``posix_spawn`` closes nothing itself,
    and what CPython opens later is close-on-exec already."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _posix_spawn(request: dict[str, Any], stdin: int, stdout: int, stderr: int) -> int:
    argv: list[str] = request["argv"]
    env: dict[str, str] = request["env"]
    cwd: str = request["cwd"]
    uid, gid, groups = request.get("uid"), request.get("gid"), request.get("groups")
    if not argv:
        raise ValueError("an empty argv")
    for fd in (stdin, stdout, stderr):
        os.set_inheritable(fd, False)  # as received; the dup2s below give the child its own
    acting = FsIdentity(uid, gid if gid is not None else uid).acting() if uid is not None \
        else contextlib.nullcontext()
    with acting:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, cwd) from None
        try:
            candidates = _candidates(argv[0], env)
        except BaseException:
            os.chdir("/")
            raise
    try:
        return _spawn_as(argv, env, candidates, uid, gid, groups, (stdin, stdout, stderr))
    finally:
        os.chdir("/")


def _candidates(program: str, env: dict[str, str]) -> list[str]:
    """The paths to try for ``program``, as ``subprocess`` does, less those that do not exist
    for the tool user (checked with its filesystem ids: a cheap stat instead of a spawn)."""
    if os.path.dirname(program):
        return [program]
    paths = [os.path.join(directory, program) for directory in os.get_exec_path(env)]
    found = []
    for path in paths:
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno in _SKIPPED:
                continue
        found.append(path)
    return found


def _spawn_as(argv: list[str], env: dict[str, str], candidates: list[str], uid: int | None,
              gid: int | None, groups: list[int] | None, stdio: tuple[int, int, int]) -> int:
    saved_uid, saved_gid, saved_groups = os.getresuid(), os.getresgid(), os.getgroups()
    file_actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)]
    try:
        if groups is not None:
            os.setgroups(groups)
        if gid is not None:
            os.setresgid(gid, saved_gid[1], saved_gid[2])
        if uid is not None:
            os.setresuid(uid, saved_uid[1], saved_uid[2])
        failure: OSError | None = None
        for path in candidates:
            try:
                return os.posix_spawn(
                    path, argv, env, file_actions=file_actions, setsid=True,
                    resetids=uid is not None or gid is not None,
                    setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                )
            except OSError as exc:
                if failure is None or failure.errno in _SKIPPED:
                    failure = exc
        failure = failure or OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        raise OSError(failure.errno, failure.strerror, argv[0])
    finally:
        # Root again before anything else happens; if that failed, the spawner must stop
        # (the exception ends it) rather than go on with the tool user's ids.
        os.setresuid(*saved_uid)
        os.setresgid(*saved_gid)
        os.setgroups(saved_groups)


def _popen(request: dict[str, Any], stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    ids: dict[str, object] = {}
    if request.get("uid") is not None:
        ids["user"] = request["uid"]
    if request.get("gid") is not None:
        ids["group"] = request["gid"]
    if request.get("groups") is not None:
        ids["extra_groups"] = request["groups"]
    # The child changes into the working directory before it drops to the tool user; the
    # kernel checks that chdir against the filesystem ids, which the child inherits from
    # this thread, so the fork happens while they are the tool user's.
    acting = FsIdentity(request["uid"], request.get("gid") or request["uid"]).acting() \
        if request.get("uid") is not None else contextlib.nullcontext()
    with acting:
        return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
            request["argv"], stdin=stdin, stdout=stdout, stderr=stderr, cwd=request["cwd"],
            env=request["env"], start_new_session=True, close_fds=True,
            # The spawner has a single thread, so a preexec_fn is safe here.
            preexec_fn=take_controlling_tty, **ids,  # noqa: PLW1509
        )


def take_controlling_tty() -> None:
    """In the child, after ``setsid`` and the switch to the tool user: make stdin (the slave
    side of a fresh pseudo-terminal) the session's controlling terminal, so ``tty``, job
    control and SIGWINCH work. A session leader without a terminal needs no privilege to
    take one that no other session holds."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
