"""A file read asked for as root that the sandbox's user may not do, done with root's rights.

Where the policy sets ``sandbox.root_commands = true``, envd's ``GET /files`` as
``user="root"`` is first served as the sandbox's user (:mod:`harness.doors.e2b.envd_files`:
its places, its permissions). A file only root may read (outside the user's places, or
``0600`` and root's: Harbor keeps the environment it records at a template's build so, in
``/var/lib/harbor``, and reads it back as root) is then read by a root command, ``cat`` as
uid 0, as any root command of the client could: nothing a root command cannot already do.
The read is the policy's ``copy_out`` action, recorded with ``"user": "root"`` and
``"via": "root command"``. Root here has only the container's capabilities (no
CAP_DAC_OVERRIDE), so what root may not read either is refused with the reason ``cat``
gives. Writes are never done so: a file a client writes stays the sandbox user's.

The file passes through the command's output buffer, so it is bounded:
:data:`MAX_ROOT_READ_BYTES`, past which the read is refused naming the bound.
"""

from __future__ import annotations

from harness.core.errors import ErrorCode
from harness.core.root_commands import ROOT_USER
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.envd_filesystem import fs_errors
from harness.doors.e2b.errors import E2bError, invalid
from harness.engine.jobs import JobChunk, JobEnded, JobGap

__all__ = ["MAX_ROOT_READ_BYTES", "ROOT_ONLY", "ROOT_READ_TIMEOUT_S", "read_as_root"]

ROOT_ONLY = frozenset({ErrorCode.PERMISSION_DENIED, ErrorCode.PATH_ESCAPE})
"""The refusals of a read as the sandbox's user that a read as root may not get."""
MAX_ROOT_READ_BYTES = 16 << 20
"""The largest file a read as root that needs root's rights returns (it is held whole)."""
ROOT_READ_TIMEOUT_S = 60.0
_REFUSALS = (("No such file or directory", ErrorCode.NOT_FOUND), ("Is a directory", ErrorCode.INVALID_REQUEST),
             ("Permission denied", ErrorCode.PERMISSION_DENIED))


def read_as_root(sandboxes: E2bSandboxes, sandbox: E2bSandbox, path: str) -> bytes:
    """The bytes of the file at absolute ``path``, read by ``cat`` as root in ``sandbox``
    (the caller checked the client asked as root and the policy allows it); E2bError naming
    the reason otherwise."""
    box = sandbox.running()
    details = {"path": path, "user": ROOT_USER, "via": "root command"}
    with sandboxes.acting(sandbox, "copy_out", details) as ticket, fs_errors(sandbox, as_root=True):
        info = box.jobs.start(["cat", "--", path], tag="read_as_root", cwd="/", as_root=True,
                              buffer_bytes=MAX_ROOT_READ_BYTES + (1 << 16))
        out: list[bytes] = []
        err: list[bytes] = []
        size = 0
        code: int | None = None
        for event in box.jobs.attach(info.pid, follow=True, timeout=ROOT_READ_TIMEOUT_S):
            if isinstance(event, JobGap):
                size = MAX_ROOT_READ_BYTES + 1
            elif isinstance(event, JobChunk):
                (out if event.stream == "stdout" else err).append(event.data)
                size += len(event.data) if event.stream == "stdout" else 0
            elif isinstance(event, JobEnded):
                code = event.info.exit_code if event.info.state == "exited" else -1
            if size > MAX_ROOT_READ_BYTES:
                box.jobs.kill(info.pid)
                raise E2bError(ErrorCode.TOO_LARGE, f"{path} needs root's rights to read, and a file read so is "
                                                    f"at most {MAX_ROOT_READ_BYTES >> 20} MiB; copy it where the "
                                                    "sandbox's user may read it with a root command")
        if code is None:
            box.jobs.kill(info.pid)
            raise E2bError(ErrorCode.TIMED_OUT, f"reading {path} as root did not finish in "
                                                f"{ROOT_READ_TIMEOUT_S:.0f} s")
        if code != 0:
            reason = b"".join(err).decode(errors="replace").strip() or f"cat exited with {code}"
            found = next((c for text, c in _REFUSALS if text in reason), ErrorCode.PERMISSION_DENIED)
            if found is ErrorCode.INVALID_REQUEST:
                raise invalid(f"path {path!r} is a directory; read the files in it one by one")
            raise E2bError(found, f"{path}: read as root: {reason}")
        data = b"".join(out)
        ticket.outcome["bytes"] = len(data)
        return data
