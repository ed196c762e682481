"""Start-up checks for an agent running on gVisor (Docker runtime ``runsc``).

gVisor applies the container's seccomp profile itself (with ``--oci-seccomp``), but the
runsc releases in Debian (up to 20240729) answer every refused call with EPERM and ignore
the profile's per-call errno. The profile answers ``clone3`` with ENOSYS so that glibc
falls back to ``clone``, whose flags seccomp can check; with EPERM instead, glibc gives
up and no thread can start. So before its first thread the agent adds one filter of its
own, inherited by every tool: ``clone3`` answers ENOSYS. Between two filters that both
refuse a call, the errno of the one installed last is returned, so this changes the
errno only, never what is allowed.

Without ``--oci-seccomp`` gVisor applies no profile at all. The agent then refuses to
start, so a sandbox never runs with fewer walls than it asked for.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_NR_CLONE3 = 435  # the same number on x86_64 and aarch64
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# classic BPF opcodes: load a 32-bit word of seccomp_data, jump if equal, return
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# offsets in struct seccomp_data
_NR_OFFSET, _ARCH_OFFSET = 0, 4

NO_PROFILE = (
    "gVisor did not apply the sandbox's seccomp profile (this process shows Seccomp: 0): "
    "the Docker runtime runsc needs --oci-seccomp in its runtimeArgs; run `make runsc` "
    "(scripts/setup_runsc.sh) or add it to /etc/docker/daemon.json and reload dockerd"
)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_mode(status_path: str = "/proc/self/status") -> int:
    """The ``Seccomp:`` field of this process's status (0 none, 2 filter)."""
    with open(status_path, encoding="ascii") as status:
        for line in status:
            if line.startswith("Seccomp:"):
                return int(line.split()[1])
    return 0


def clone3_filter(arch: int) -> bytes:
    """The BPF program: on ``arch``, ``clone3`` returns ENOSYS; everything else is allowed
    (left to the profile's filter)."""
    program = [
        (_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        (_JEQ_K, 1, 0, arch),
        (_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
        (_LD_W_ABS, 0, 0, _NR_OFFSET),
        (_JEQ_K, 0, 1, _NR_CLONE3),
        (_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.ENOSYS),
        (_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    return b"".join(struct.pack("HBBI", *instruction) for instruction in program)


def clone3_errno(libc: ctypes.CDLL) -> int:
    """The errno of a ``clone3`` with no arguments (EINVAL where it is allowed)."""
    ctypes.set_errno(0)
    libc.syscall(_NR_CLONE3, None, 0)
    return ctypes.get_errno()


def prepare() -> None:
    """Check that the profile is applied and make ``clone3`` answer ENOSYS; call while the
    process is single-threaded. Raises SystemExit with the fix when it cannot."""
    if seccomp_mode() == 0:
        raise SystemExit(f"callbox-agent: {NO_PROFILE}")
    arch = AUDIT_ARCH.get(platform.machine())
    if arch is None:
        raise SystemExit(f"callbox-agent: gVisor on {platform.machine()} is not supported")
    libc = ctypes.CDLL(None, use_errno=True)
    if clone3_errno(libc) != errno.ENOSYS:
        install_clone3_filter(libc, arch)


def install_clone3_filter(libc: ctypes.CDLL, arch: int) -> None:
    """Add the ``clone3`` → ENOSYS filter to this process (and so to all it starts)."""
    code = clone3_filter(arch)
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _SockFprog(len(code) // 8, ctypes.addressof(buffer))
    # no_new_privs is set already (Docker's no-new-privileges); setting it again is a no-op
    # and is what the kernel asks of an unprivileged process installing a filter.
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise SystemExit(f"callbox-agent: cannot add the clone3 filter: {os.strerror(ctypes.get_errno())}")
    if (answer := clone3_errno(libc)) != errno.ENOSYS:
        raise SystemExit(f"callbox-agent: clone3 still answers {errno.errorcode.get(answer, answer)}, "
                         "not ENOSYS: threads cannot start on this gVisor")
