"""Whether a sandbox's tools run on gVisor's kernel, told from evidence that works under runsc.

gVisor's kernel (the Sentry) answers ``uname`` and ``/proc/version`` with a fixed string of
its own, whatever the host runs: release ``4.4.0`` and version ``#1 SMP Sun Jan 10 15:06:54
PST 2016`` (:data:`GVISOR_UNAME_VERSION`). A tool process reads both without privilege, and
``--oci-seccomp`` (which callbox needs) leaves them readable; ``dmesg``, where the Sentry's
boot log says "Starting gVisor...", is refused there (the ``syslog`` call is filtered), so
it only ever adds evidence. Docker records the runtime it started the container with
(``HostConfig.Runtime`` of ``docker inspect``); that says what was asked, the kernel string
says what the tools got. When doctor runs next to the engine, this host's own kernel
version is compared too: a sandbox that sees it runs on the host's kernel.

Everything here is a pure function of :class:`KernelSeen`; :data:`KERNEL_PROBE` is the shell
text a tool process runs to collect it (its sections are parsed by :func:`parse_kernel`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

GVISOR_UNAME_VERSION: Final = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
"""The kernel version gVisor's Sentry reports to every program (its syscall table's
``_LINUX_VERSION``); no Linux build has it."""
GVISOR_MARK: Final = "gVisor"
"""What the Sentry's boot log in ``dmesg`` says, when dmesg is readable at all."""
RUNSC: Final = "runsc"

KERNEL_PROBE: Final = ("echo '--- proc_version'; cat /proc/version 2>/dev/null; "
                       "echo '--- uname_v'; uname -v 2>/dev/null; "
                       "echo '--- dmesg'; dmesg 2>/dev/null | head -n 3")
"""Shell text run as a tool process: the kernel it sees (three ``--- name`` sections)."""
SECTIONS: Final = ("proc_version", "uname_v", "dmesg")


@dataclass(frozen=True)
class KernelSeen:
    """What one sandbox showed of the kernel its tools run on."""

    proc_version: str | None = None
    """The first line of ``/proc/version`` inside the sandbox."""
    uname_version: str | None = None
    """``uname -v`` inside the sandbox."""
    dmesg: str | None = None
    """The first lines of ``dmesg``; None when refused (always, under ``--oci-seccomp``)."""
    docker_runtime: str | None = None
    """The runtime Docker recorded for the container (``HostConfig.Runtime``)."""
    host_version: str | None = None
    """This host's ``uname -v``, when the engine runs here; None when it is remote."""


@dataclass(frozen=True)
class Verdict:
    """Whether the tools run on gVisor's kernel, and the evidence, in words."""

    gvisor: bool
    reason: str


def parse_kernel(sections: dict[str, list[str]]) -> KernelSeen | None:
    """The kernel sections of a probe's output (None when the probe did not print them)."""
    if not any(name in sections for name in SECTIONS):
        return None

    def first(name: str) -> str | None:
        lines = [line.strip() for line in sections.get(name, []) if line.strip()]
        return lines[0] if lines else None

    dmesg = "\n".join(line for line in sections.get("dmesg", []) if line.strip()) or None
    return KernelSeen(proc_version=first("proc_version"), uname_version=first("uname_v"), dmesg=dmesg)


def host_kernel_version() -> str | None:
    """This host's ``uname -v`` (what a sandbox on its kernel would see)."""
    try:
        return os.uname().version
    except AttributeError:  # not a Unix host
        return None


def judge(seen: KernelSeen) -> Verdict:
    """Whether ``seen`` shows gVisor's kernel; the reason quotes the evidence either way."""
    version = seen.uname_version or _version_of(seen.proc_version)
    shown = f"uname -v {version!r}" if version else "no kernel version (neither uname -v nor /proc/version answered)"
    recorded = f"Docker records runtime {seen.docker_runtime}" if seen.docker_runtime else \
        "Docker records the daemon's default runtime"
    boot_log = seen.dmesg is not None and GVISOR_MARK in seen.dmesg
    if seen.host_version is not None and seen.host_version == GVISOR_UNAME_VERSION:
        # This host is itself gVisor: the kernel string cannot tell the two apart.
        if boot_log:
            return Verdict(True, f"dmesg in the sandbox shows gVisor's boot log ({recorded}; this host runs on "
                                 "gVisor too, so its kernel string tells nothing)")
        return Verdict(seen.docker_runtime == RUNSC,
                       f"{recorded}; this host runs on gVisor too, so the sandbox's kernel string tells nothing")
    if version == GVISOR_UNAME_VERSION:
        host = f", not this host's {seen.host_version!r}" if seen.host_version else ""
        return Verdict(True, f"the tools run on gVisor's kernel: {shown} inside the sandbox is gVisor's own"
                             f"{host}; {recorded}")
    if boot_log:
        return Verdict(True, f"the tools run on gVisor's kernel: dmesg in the sandbox shows gVisor's boot log "
                             f"({shown}); {recorded}")
    if version is not None and version == seen.host_version:
        return Verdict(False, f"the sandbox's tools saw this host's kernel ({shown}), not gVisor's; {recorded}")
    return Verdict(False, f"the sandbox's tools did not see gVisor's kernel: {shown}, where gVisor reports "
                          f"{GVISOR_UNAME_VERSION!r}; {recorded}")


def _version_of(proc_version: str | None) -> str | None:
    """The version part of ``/proc/version`` (``Linux version R (builder) VERSION``): from
    its ``#``, as ``uname -v`` prints it."""
    if not proc_version:
        return None
    cut = proc_version.find("#")
    return proc_version[cut:].strip() if cut >= 0 else proc_version.strip()
