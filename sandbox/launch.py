"""How a command's process is started: directly, or through the pre-forked spawner.

Both launchers return a ``Child``: the pid, the agent's ends of the stdio pipes and a
way to collect the exit status once the pid's pidfd says it ended. The agent uses the
spawner (cheap, see ``spawner``); tests and tools on the host use the direct launcher.

Given ``terminal`` (the slave side of a pseudo-terminal the caller opened), a launcher
makes it the child's stdin, stdout, stderr and controlling terminal instead of pipes;
the Child then has no pipes of its own (``stdout`` and ``stderr`` are -1): the caller
reads the terminal's master side.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sandbox.spawner import Spawner, SpawnRequest

# Bigger pipes mean fewer wake-ups and larger Output messages for chatty commands.
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
}


@dataclass(frozen=True)
class ToolUser:
    """Who tool processes run as, and their environment defaults."""

    uid: int
    gid: int
    home: str
    name: str = "sandbox"
    image_env: Mapping[str, str] | None = None
    """The image's own environment (an image other than callbox's): its PATH and the rest
    replace the defaults; HOME, USER and LOGNAME stay the tool user's."""

    def environment(self) -> dict[str, str]:
        # Scripts that `pip install --user` writes land in ~/.local/bin: on PATH, after the system's.
        base = {**BASE_ENV, **self.image_env} if self.image_env is not None else dict(BASE_ENV)
        path = f"{base.get('PATH') or BASE_ENV['PATH']}:{self.home.rstrip('/')}/.local/bin"
        return {**base, "PATH": path, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}


@dataclass(frozen=True)
class Identity:
    """Who the process runs as; None fields keep the agent's own."""

    uid: int | None
    gid: int | None
    groups: Sequence[int] | None


@dataclass
class Child:
    """A started command: its pid, the agent's pipe ends, and its exit status once reaped."""

    pid: int
    stdin: int | None
    stdout: int
    stderr: int
    _reap: Callable[[], int] = field(repr=False)
    pidfd: int | None = None
    """A pidfd for the child when the launcher has one; else the caller opens one."""
    returncode: int | None = None

    def reap(self) -> int:
        """Collect the exit status (Popen convention: -N for signal N). Call once it ended."""
        if self.returncode is None:
            self.returncode = self._reap()
        return self.returncode

    def open_pidfd(self) -> int:
        """A pidfd for the child, owned by the caller (it closes it)."""
        if self.pidfd is not None:
            fd, self.pidfd = self.pidfd, None
            return fd
        return os.pidfd_open(self.pid)

    def close_pipes(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr, self.pidfd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.stdin = None
        self.pidfd = None


TAKE_TTY_THEN_EXEC = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "try:\n    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as e:\n    print(f'{sys.argv[1]}: {e.strerror}', file=sys.stderr)\n    os._exit(127)\n"
)
"""The direct launcher's way to give a child its controlling terminal (see ``spawner``)."""

NO_PIPE = -1
"""``Child.stdout`` and ``Child.stderr`` of a child started on a terminal."""


class Launcher(Protocol):
    def launch(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], identity: Identity, with_stdin: bool,
        terminal: int | None = None,
    ) -> Child: ...


def _grow(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)


class SpawnerLauncher:
    """Start commands through the pre-forked spawner process."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner

    def launch(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], identity: Identity, with_stdin: bool,
        terminal: int | None = None,
    ) -> Child:
        if terminal is not None:
            request = SpawnRequest(argv, env, cwd, identity.uid, identity.gid, identity.groups, controlling_tty=True)
            pid, pidfd = self.spawner.spawn(request, terminal, terminal, terminal)
            return Child(pid, None, NO_PIPE, NO_PIPE, lambda: self.spawner.wait(pid), pidfd)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        if with_stdin:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        _grow(out_w)
        _grow(err_w)
        request = SpawnRequest(argv, env, cwd, identity.uid, identity.gid, identity.groups)
        try:
            pid, pidfd = self.spawner.spawn(request, in_r, out_w, err_w)
        except BaseException:
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        return Child(pid, in_w if with_stdin else None, out_r, err_r, lambda: self.spawner.wait(pid), pidfd)


class DirectLauncher:
    """Start commands with subprocess from this process (fork + exec)."""

    def launch(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], identity: Identity, with_stdin: bool,
        terminal: int | None = None,
    ) -> Child:
        ids: dict[str, object] = {}
        if identity.uid is not None:
            ids["user"] = identity.uid
        if identity.gid is not None:
            ids["group"] = identity.gid
        if identity.groups is not None:
            ids["extra_groups"] = list(identity.groups)
        if terminal is not None:
            # A preexec_fn is unsafe in this threaded process: a small Python program takes
            # the terminal, then execs the command (tests and tools on the host only).
            term: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
                [sys.executable, "-c", TAKE_TTY_THEN_EXEC, *argv], stdin=terminal, stdout=terminal,
                stderr=terminal, cwd=cwd, env=dict(env), start_new_session=True, close_fds=True, **ids,
            )
            return Child(term.pid, None, NO_PIPE, NO_PIPE, term.wait)
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            list(argv),
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
            **ids,
        )
        assert proc.stdout is not None and proc.stderr is not None
        # The Child owns the descriptors from here on; detach them from the Popen files.
        stdin = os.dup(proc.stdin.fileno()) if proc.stdin is not None else None
        stdout, stderr = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return Child(proc.pid, stdin, stdout, stderr, proc.wait)
