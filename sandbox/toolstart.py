"""Starting tool processes: who they run as, their environment, and why one did not start.

Exec commands and bash sessions start the same way: as the tool user (uid, gid) with its
supplementary groups replaced by the tool user's group plus a marker group (see
``proctree``), with the tool environment plus the request's variables, through the
configured ``Launcher``. A process that cannot start is an ``AgentError`` worded as a
shell would say it.

A job the harness asks to run as root (``as_root``: only when its policy allows root
commands) starts with the agent's own ids, uid 0 and gid 0, with the marker group as its
only supplementary group and ``HOME=/root``. It keeps no capability the agent has not: the
container's bounding set (CAP_SETUID, CAP_SETGID, CAP_KILL) and no-new-privileges bound
what an exec as uid 0 regains. Without CAP_DAC_OVERRIDE, file permissions apply to it like
to any other uid.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence

from sandbox.errors import (
    BUSY,
    COMMAND_NOT_FOUND,
    INTERNAL,
    INVALID_ARGUMENT,
    NO_SUCH_FILE,
    PERMISSION_DENIED,
    SPAWN_FAILED,
    AgentError,
)
from sandbox.launch import BASE_ENV, Child, DirectLauncher, Identity, Launcher, ToolUser
from sandbox.spawner import SpawnerDied

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 24 * 3600 * 1000
ROOT_HOME = "/root"


def checked_timeout_ms(requested: int) -> int:
    """A request's deadline in milliseconds (0: the default); AgentError above the maximum."""
    timeout_ms = requested or DEFAULT_TIMEOUT_MS
    if timeout_ms > MAX_TIMEOUT_MS:
        raise AgentError(INVALID_ARGUMENT, f"timeout_ms must be at most {MAX_TIMEOUT_MS}")
    return timeout_ms


class ToolStarter:
    """Starts tool processes as ``user`` (None: as the agent itself) through ``launcher``."""

    def __init__(self, user: ToolUser | None, launcher: Launcher | None = None) -> None:
        self.user = user
        self.launcher: Launcher = launcher or DirectLauncher()

    def identity(self, marker: int) -> Identity:
        """The tool user with the marker group; as root without a tool user, root with it added."""
        if self.user is not None:
            return Identity(self.user.uid, self.user.gid, [self.user.gid, marker])
        if os.geteuid() == 0:
            return Identity(None, None, [*os.getgroups(), marker])
        # Not root (tests on a host): no marker, so only the process group is killed.
        return Identity(None, None, None)

    def root_identity(self, marker: int) -> Identity:
        """Root (the agent's own uid and gid) with only the marker group; PERMISSION_DENIED
        when the agent does not run as root (tests on a host)."""
        if os.geteuid() != 0:
            raise AgentError(PERMISSION_DENIED, "cannot run a command as root: the agent itself does not run as root")
        return Identity(None, None, [0, marker])

    def environment(self, extra: Mapping[str, str], *, as_root: bool = False) -> dict[str, str]:
        """The tool environment (root's, with ``as_root``) with ``extra`` added."""
        env = self.user.environment() if self.user else dict(BASE_ENV)
        if as_root:
            env.update(HOME=ROOT_HOME, USER="root", LOGNAME="root")
        env.update(extra)
        return env

    def start(
        self,
        argv: Sequence[str],
        cwd: str,
        extra_env: Mapping[str, str],
        marker: int,
        *,
        with_stdin: bool,
        blame_cwd: bool = True,
        terminal: int | None = None,
        as_root: bool = False,
    ) -> Child:
        """Start ``argv`` in ``cwd``; AgentError if it cannot start. ``blame_cwd`` False words
        every failure as the program's, even one entering ``cwd``. ``terminal``: the slave side
        of a pseudo-terminal, the child's stdio and controlling terminal (see ``launch``).
        ``as_root``: run as root instead of the tool user (see the module docstring)."""
        env = self.environment(extra_env, as_root=as_root)
        identity = self.root_identity(marker) if as_root else self.identity(marker)
        try:
            if terminal is not None:
                return self.launcher.launch(list(argv), cwd, env, identity, with_stdin=True, terminal=terminal)
            return self.launcher.launch(list(argv), cwd, env, identity, with_stdin=with_stdin)
        except SpawnerDied as exc:
            raise AgentError(INTERNAL, f"cannot start {argv[0]}: {exc}") from None
        except OSError as exc:
            raise start_error(exc, argv[0], cwd, blame_cwd=blame_cwd, search_path=env.get("PATH", "")) from None


def start_error(exc: OSError, program: str, cwd: str, *, blame_cwd: bool = True,
                search_path: str = "") -> AgentError:
    """Why ``program`` did not start, in a shell's words (``search_path``: the PATH it was
    looked up in). The child changes into ``cwd`` with the tool user's permissions: unless
    ``blame_cwd`` is False, a failure there names the directory, not the program."""
    if isinstance(exc, BlockingIOError):
        return AgentError(
            BUSY, f"cannot start {program}: the sandbox's process limit is reached; retry when processes exit"
        )
    if blame_cwd and exc.filename is not None and exc.filename == cwd:
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            return AgentError(SPAWN_FAILED, f"working directory {cwd} does not exist")
        return AgentError(
            SPAWN_FAILED, f"cannot enter the working directory {cwd}: {exc.strerror or exc} (as the tool user)"
        )
    return AgentError(SPAWN_FAILED, f"{program}: {cannot_run(exc, program, cwd, search_path)}")


def cannot_run(exc: OSError, program: str, cwd: str, search_path: str) -> str:
    """What a shell would say of ``program`` that exec refused with ``exc``: ``command not
    found`` for a name found on no PATH directory, ``no such file or directory`` for a path
    to nothing (both exit 127 in a shell), else why the file found cannot run (126)."""
    found = _program_file(program, cwd, search_path)
    if found is None:
        return NO_SUCH_FILE if "/" in program else COMMAND_NOT_FOUND
    try:
        info = os.stat(found)
    except OSError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        return "is a directory, not a program"
    if isinstance(exc, FileNotFoundError):  # the file is there: what it asks to run is not
        interpreter = _interpreter(found)
        if interpreter:
            return f"cannot run it: its interpreter {interpreter} (its #! line) does not exist in the sandbox"
        return f"cannot run it: {exc.strerror or exc}"
    if isinstance(exc, PermissionError):
        if info is not None and stat.S_ISREG(info.st_mode) and not info.st_mode & 0o111:
            return (f"permission denied: the file is not executable (no x permission); `chmod +x {program}`, "
                    f"or run it with its interpreter (e.g. `sh {program}`)")
        return "permission denied"
    if exc.errno == errno.ENOEXEC:
        return "cannot run it: it is neither a program for this machine nor a script with a #! line"
    return str(exc.strerror or exc)


def _program_file(program: str, cwd: str, search_path: str) -> str | None:
    """The file exec tried for ``program``: the path itself when it has a ``/`` (relative to
    ``cwd``), else the first entry of ``search_path`` that holds it and is no directory (a
    shell passes over directories there); None when there is none."""
    if "/" in program:
        path = os.path.join(cwd, program)
        return path if os.path.lexists(path) else None
    for directory in search_path.split(":"):
        candidate = os.path.join(directory or cwd, program)
        if os.path.exists(candidate) and not os.path.isdir(candidate):
            return candidate
    return None


def _interpreter(path: str) -> str:
    """The interpreter a script's ``#!`` line names ("" when it has none or cannot be read)."""
    try:
        with open(path, "rb") as file:
            first = file.readline(256)
    except OSError:
        return ""
    if not first.startswith(b"#!"):
        return ""
    words = first[2:].decode("utf-8", "replace").split()
    return words[0] if words else ""
