"""What a command run as root (``as_root``, allowed by ``sandbox.root_commands``) still cannot do.

Root in a sandbox is uid 0 with only the container's capabilities (CAP_SETUID, CAP_SETGID,
CAP_KILL). One root job probes, in one sandbox with small memory and pids limits: its
capabilities, writing the read-only root filesystem, taking a file's ownership away,
mounting, reaching the network, seeing a file of the host, and then the pids and memory
limits. Each probe prints one line the test checks, so a probe that silently did nothing
fails the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.docker.container import AGENT_PIDS_RESERVE
from harness.engine.jobs import JobEnded
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME
from tests.job_follower import Follower

pytestmark = pytest.mark.docker

MEMORY = 128 << 20
PIDS = 48
CONTAINER_CAPS = (1 << 5) | (1 << 6) | (1 << 7)
"""CAP_KILL, CAP_SETGID, CAP_SETUID: the container's bounding set, all a root command gets."""

PROBES = r"""
echo "uid $(id -u) gid $(id -g) home $HOME"
grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status
touch /usr/bin/cbx-root-probe 2>/dev/null && echo "rootfs WRITABLE" || echo "rootfs refused"
touch /etc/cbx-root-probe 2>/dev/null && echo "etc WRITABLE" || echo "etc refused"
touch /tmp/cbx-mine && (chown 1000 /tmp/cbx-mine 2>/dev/null && echo "chown DONE" || echo "chown refused")
mkdir -p /tmp/cbx-mnt && (mount -t tmpfs none /tmp/cbx-mnt 2>/dev/null && echo "mount DONE" || echo "mount refused")
(timeout 5 bash -c 'echo > /dev/tcp/1.1.1.1/53' 2>/dev/null && echo "network REACHED" || echo "network refused")
test -e "$HOST_MARKER" && echo "host file SEEN" || echo "host file absent"
"""
LIMIT_PROBES = """python3 -c "$FORKS"
python3 -c 'b = bytearray(512 << 20); print("memory GOT", len(b))' 2>/dev/null; echo "memory exit $?"
"""
GVISOR = RUNTIME == "runsc"
"""Under gVisor a root job at the pids or memory limit stops the whole sandbox, its agent
too: there the limits are probed for the tool user only (test_containment, test_process_limits)."""
FORKS = r"""
import os, signal, time
kids = []
try:
    for _ in range(LIMIT):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as error:
    print("fork refused", error.errno)
print("sleepers", len(kids))
for kid in kids:
    os.kill(kid, signal.SIGKILL)
    os.waitpid(kid, 0)
""".replace("LIMIT", str(PIDS + AGENT_PIDS_RESERVE))


@pytest.fixture(scope="module")
def box(engine: Any) -> Iterator[Any]:
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, memory=MEMORY, pids=PIDS))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def test_a_root_command_keeps_only_the_container_caps_and_every_limit(box: Any) -> None:
    marker = Path("/tmp") / f"cbx-host-marker-{uuid.uuid4().hex}"
    marker.write_text("host only\n")
    try:
        env = {"HOST_MARKER": str(marker), "FORKS": FORKS}
        probes = PROBES if GVISOR else PROBES + LIMIT_PROBES
        info = box.agent.jobs.start(["bash", "-c", probes], env=env, as_root=True)
        events = Follower(box.agent.jobs.attach(info.pid, follow=True), wait_s=120).finish()
    finally:
        marker.unlink()
    ended = events[-1]
    assert isinstance(ended, JobEnded), events
    text = b"".join(getattr(e, "data", b"") for e in events).decode()
    assert "uid 0 gid 0 home /root" in text, text
    for line in ("CapEff", "CapPrm", "CapBnd"):
        value = int(text.split(f"{line}:", 1)[1].split()[0], 16)
        assert value == CONTAINER_CAPS, f"{line} {value:#x}: {text}"
    for refused in ("rootfs refused", "etc refused", "chown refused", "mount refused", "network refused",
                    "host file absent"):
        assert refused in text, text
    if not GVISOR:
        sleepers = int(text.split("sleepers ", 1)[1].split()[0])
        # EAGAIN before the container's whole pids limit (the spec's and the agent's reserve)
        assert "fork refused 11" in text and 0 < sleepers < PIDS + AGENT_PIDS_RESERVE, text
        assert "memory exit 137" in text, text  # SIGKILLed by the OOM killer, over the memory limit


def test_a_tool_user_command_is_not_root(box: Any) -> None:
    info = box.agent.jobs.start(["id", "-u"])
    events = Follower(box.agent.jobs.attach(info.pid, follow=True)).finish()
    text = b"".join(getattr(e, "data", b"") for e in events).decode()
    assert text.strip() != "0" and text.strip().isdigit(), text
