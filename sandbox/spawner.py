"""A small pre-forked process that starts tool processes for the agent.

Starting a process as another user with an extra group is something CPython's
``subprocess`` can only do by fork, and forking the agent (large, with gRPC's threads)
costs over a millisecond and is fragile. So the agent forks this spawner once, at
start-up, before gRPC is even imported: a single-threaded process with a few MiB of
memory, which can start commands with ``posix_spawn`` (see ``spawn_start``). The agent
sends it one request per command (argv, environment, cwd, identity, and the three stdio
pipe ends as SCM_RIGHTS descriptors); the spawner starts the process, answers with its
pid or the errno of the failure, and reports each exit status when the child ends. The
agent watches the child with a pidfd, as it would its own child (where the kernel has no
pidfds, as under gVisor, with a pipe that the spawner closes when the child has ended).

The spawner runs as root in the container with the agent's capabilities, so tool
processes cannot trace it, and can signal it only in the moment it starts one of them
(``spawn_start`` says why that is harmless); it is reached only through an anonymous
socketpair. It exits when the agent closes its end.
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from sandbox.spawn_start import Starter

# The agent forks the spawner right after importing this module, and every page the agent
# writes after that is copied: so this module imports neither typing nor dataclasses (some
# 3 MiB of objects the agent imports anyway, after the fork, held once instead of twice).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MESSAGE = 1 << 20


class SpawnRequest:
    """One command to start: argv, environment, working directory and identity.

    ``controlling_tty``: make the child's stdin (a terminal) its controlling terminal, in
    its new session."""

    __slots__ = ("argv", "controlling_tty", "cwd", "env", "gid", "groups", "uid")

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, uid: int | None, gid: int | None,
                 groups: Sequence[int] | None, controlling_tty: bool = False) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.controlling_tty = controlling_tty


class SpawnerDied(RuntimeError):
    """The spawner process is gone; no new command can start."""


class _Pending:
    """A reply the agent is waiting for: a spawn result or an exit status."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: dict[str, Any] = {}


class Spawner:
    """Agent side: start commands through the pre-forked spawner process.

    ``fresh`` starts the spawner as a new interpreter instead of a fork of this process:
    for a process that has already started gRPC (tests), whose fork handlers a forked
    spawner would inherit and run in every child it starts.
    """

    def __init__(self, *, fresh: bool = False) -> None:
        agent_end, spawner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._fresh: subprocess.Popen[bytes] | None = None
        if fresh:
            self._fresh = subprocess.Popen(
                [sys.executable, "-c", "import sys; from sandbox.spawner import serve_fd; serve_fd(int(sys.argv[1]))",
                 str(spawner_end.fileno())],
                pass_fds=(spawner_end.fileno(),), close_fds=True,
            )
            pid = self._fresh.pid
        else:
            pid = os.fork()
        if pid == 0:  # the spawner
            agent_end.close()
            try:
                _serve(spawner_end)
            finally:
                os._exit(0)
        spawner_end.close()
        self.pid = pid
        self._sock = agent_end
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._next_id = 0
        self._replies: dict[int, _Pending] = {}
        self._exits: dict[int, _Pending] = {}
        self._dead = False
        self._reader = threading.Thread(target=self._read_loop, name="spawner-reader", daemon=True)
        self._reader.start()

    def spawn(self, request: SpawnRequest, stdin: int, stdout: int, stderr: int) -> tuple[int, int]:
        """Start the command; return its pid and a pidfd for it, or raise the start's OSError.

        The pidfd is opened by the spawner before it can reap the child, so it always
        refers to this child, even if the child has already exited.
        """
        with self._lock:
            if self._dead:
                raise SpawnerDied("the process spawner has exited")
            self._next_id += 1
            request_id = self._next_id
            reply = self._replies[request_id] = _Pending()
        header = json.dumps({
            "id": request_id, "argv": list(request.argv), "env": dict(request.env), "cwd": request.cwd,
            "uid": request.uid, "gid": request.gid,
            "groups": list(request.groups) if request.groups is not None else None,
            "ctty": request.controlling_tty,
        }).encode()
        fds = array.array("i", [stdin, stdout, stderr])
        try:
            with self._send_lock:
                self._sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError:
            with self._lock:
                self._replies.pop(request_id, None)
            raise SpawnerDied("the process spawner has exited") from None
        reply.event.wait()
        value = reply.value
        if "pid" in value:
            return int(value["pid"]), int(value["pidfd"])
        if value.get("died"):
            raise SpawnerDied("the process spawner has exited")
        filename = value.get("filename")
        if filename is not None:
            raise OSError(int(value.get("errno", 0)), str(value.get("error", "spawn failed")), str(filename))
        raise OSError(int(value.get("errno", 0)), str(value.get("error", "spawn failed")))

    def wait(self, pid: int) -> int:
        """Block until the spawner reports the child's exit; return it as Popen.returncode."""
        pending = self._exit_slot(pid)
        pending.event.wait()
        with self._lock:
            self._exits.pop(pid, None)
        if pending.value.get("died"):
            raise SpawnerDied("the process spawner exited before reporting the exit status")
        return int(pending.value["returncode"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._fresh is not None:
            self._fresh.wait()
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _exit_slot(self, pid: int) -> _Pending:
        with self._lock:
            slot = self._exits.get(pid)
            if slot is None:
                slot = self._exits[pid] = _Pending()
                if self._dead:
                    slot.value = {"died": True}
                    slot.event.set()
            return slot

    def _read_loop(self) -> None:
        fd_size = array.array("i").itemsize
        while True:
            try:
                data, ancdata, _flags, _addr = self._sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(fd_size))
            except OSError:
                data, ancdata = b"", []
            if not data:
                self._mark_dead()
                return
            message = json.loads(data)
            fds = _received_fds(ancdata)
            if fds:
                message["pidfd"] = fds[0]
            if "exit" in message:
                slot = self._exit_slot(int(message["exit"]))
                slot.value = message
                slot.event.set()
            else:
                with self._lock:
                    reply = self._replies.pop(int(message["id"]), None)
                if reply is not None:
                    reply.value = message
                    reply.event.set()

    def _mark_dead(self) -> None:
        with self._lock:
            self._dead = True
            waiting = [*self._replies.values(), *self._exits.values()]
            self._replies.clear()
        for pending in waiting:
            if not pending.event.is_set():
                pending.value = {"died": True}
                pending.event.set()


# ---- the spawner process ------------------------------------------------------------


def serve_fd(fd: int) -> None:
    """The main of a ``fresh`` spawner: serve the socket inherited as ``fd``."""
    _serve(socket.socket(fileno=fd))


class _ExitPipes:
    """Stand-ins for pidfds where the kernel has none (gVisor has no ``pidfd_open``): per
    child, a pipe whose write end the spawner closes once it has reaped the child, so the
    read end, which the agent gets instead of a pidfd, turns readable (EOF) at the exit,
    as a pidfd would. The spawner learns of exits from SIGCHLD through a wake-up pipe."""

    def __init__(self, sel: selectors.BaseSelector) -> None:
        import signal

        self.writers: dict[int, int] = {}
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        sel.register(self.wake_r, selectors.EVENT_READ, "sigchld")

    def open(self, pid: int) -> int:
        """A new exit pipe for ``pid``; its read end (the caller sends it and closes it)."""
        read_end, self.writers[pid] = os.pipe2(os.O_CLOEXEC)
        return read_end

    def exited(self, children: dict[int, subprocess.Popen[bytes] | None]) -> list[int]:
        """The children that have exited (not yet reaped), after a SIGCHLD."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass
        ended = []
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    ended.append(pid)
        return ended


def _serve(sock: socket.socket) -> None:
    """Spawner main loop: start requested commands, report exits, stop on EOF."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    starter = Starter()
    pipes = None if _has_pidfd() else _ExitPipes(sel)
    # The children, by pid; those started through subprocess keep their Popen, which reaps them.
    children: dict[int, subprocess.Popen[bytes] | None] = {}
    while True:
        for key, _ in sel.select():
            if key.data is None:
                if not _handle_request(sock, sel, starter, children, pipes):
                    return
            elif key.data == "sigchld":
                assert pipes is not None
                for pid in pipes.exited(children):
                    _report_exit(sock, pid, children.pop(pid))
                    os.close(pipes.writers.pop(pid))
            else:
                pid = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _report_exit(sock, pid, children.pop(pid))


def _report_exit(sock: socket.socket, pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    """Reap ``pid`` (which has exited) and tell the agent its status."""
    returncode = proc.wait() if proc is not None else os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with contextlib.suppress(OSError):
        sock.send(json.dumps({"exit": pid, "returncode": returncode}).encode())


def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return False
        raise
    return True


def _handle_request(sock: socket.socket, sel: selectors.BaseSelector, starter: Starter,
                    children: dict[int, subprocess.Popen[bytes] | None], pipes: _ExitPipes | None) -> bool:
    fds = array.array("i")
    try:
        data, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(3 * fds.itemsize))
    except OSError:
        return False
    if not data:
        return False
    fds.extend(_received_fds(ancdata))
    request = json.loads(data)
    try:
        if len(fds) != 3:
            raise OSError(0, "expected three stdio descriptors")
        pid, proc = starter.start(request, fds[0], fds[1], fds[2])
    except OSError as exc:
        reply = {"id": request["id"], "errno": exc.errno or 0, "error": exc.strerror or str(exc)}
        if exc.filename is not None:
            reply["filename"] = os.fsdecode(exc.filename)
    except (ValueError, TypeError) as exc:
        # What exec cannot take (a NUL byte in an argument or the environment):
        # the request's fault, answered as EINVAL; the spawner must live on for the next one.
        reply = {"id": request["id"], "errno": errno.EINVAL, "error": str(exc)}
    else:
        children[pid] = proc
        reply = {"id": request["id"], "pid": pid}
        if pipes is None:
            pidfd = os.pidfd_open(pid)
            sel.register(pidfd, selectors.EVENT_READ, pid)
            # The agent gets its own pidfd, opened before this loop can reap the child.
            sock.sendmsg([json.dumps(reply).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                          array.array("i", [pidfd]))])
        else:
            read_end = pipes.open(pid)
            try:
                sock.sendmsg([json.dumps(reply).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                              array.array("i", [read_end]))])
            finally:
                os.close(read_end)
            # A child that has already ended left its SIGCHLD's byte in the wake-up pipe,
            # which this loop reads only after the child is in ``children``.
        return True
    finally:
        for fd in fds:
            os.close(fd)
    sock.send(json.dumps(reply).encode())
    return True


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return list(fds)
