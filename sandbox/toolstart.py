"""Starting tool processes: who they run as, their environment, and why one did not start.

Exec commands and bash sessions start the same way: as the tool user (uid, gid) with its
supplementary groups replaced by the tool user's group plus a marker group (see
``proctree``), with the tool environment plus the request's variables, through the
configured ``Launcher``. A process that cannot start is an ``AgentError`` worded as a
shell would say it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from sandbox.errors import BUSY, COMMAND_NOT_FOUND, INTERNAL, INVALID_ARGUMENT, SPAWN_FAILED, AgentError
from sandbox.launch import BASE_ENV, Child, DirectLauncher, Identity, Launcher, ToolUser
from sandbox.spawner import SpawnerDied

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 24 * 3600 * 1000


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

    def environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The tool environment with ``extra`` added."""
        env = self.user.environment() if self.user else dict(BASE_ENV)
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
    ) -> Child:
        """Start ``argv`` in ``cwd``; AgentError if it cannot start. ``blame_cwd`` False words
        every failure as the program's, even one entering ``cwd``. ``terminal``: the slave side
        of a pseudo-terminal, the child's stdio and controlling terminal (see ``launch``)."""
        try:
            if terminal is not None:
                return self.launcher.launch(list(argv), cwd, self.environment(extra_env), self.identity(marker),
                                            with_stdin=True, terminal=terminal)
            return self.launcher.launch(
                list(argv), cwd, self.environment(extra_env), self.identity(marker), with_stdin=with_stdin
            )
        except SpawnerDied as exc:
            raise AgentError(INTERNAL, f"cannot start {argv[0]}: {exc}") from None
        except OSError as exc:
            raise start_error(exc, argv[0], cwd if blame_cwd else None) from None


def start_error(exc: OSError, program: str, cwd: str | None) -> AgentError:
    """Why ``program`` did not start, in a shell's words. The child changes into ``cwd``
    with the tool user's permissions: a failure there names the directory, not the program."""
    if isinstance(exc, BlockingIOError):
        return AgentError(
            BUSY, f"cannot start {program}: the sandbox's process limit is reached; retry when processes exit"
        )
    if cwd is not None and exc.filename is not None and exc.filename == cwd:
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            return AgentError(SPAWN_FAILED, f"working directory {cwd} does not exist")
        return AgentError(
            SPAWN_FAILED, f"cannot enter the working directory {cwd}: {exc.strerror or exc} (as the tool user)"
        )
    if isinstance(exc, FileNotFoundError):
        return AgentError(SPAWN_FAILED, f"{program}: {COMMAND_NOT_FOUND}")
    if isinstance(exc, PermissionError):
        return AgentError(SPAWN_FAILED, f"{program}: permission denied")
    return AgentError(SPAWN_FAILED, f"{program}: {exc.strerror or exc}")
