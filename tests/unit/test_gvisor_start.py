"""The agent's start-up on gVisor: the clone3 → ENOSYS filter and the seccomp check.

The filter is installed for real, in a child process of the test (a filter can never be
removed, so never in pytest's own process)."""

from __future__ import annotations

import errno
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import gvisor

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import ctypes, errno, os, platform, sys, threading
from sandbox import gvisor
libc = ctypes.CDLL(None, use_errno=True)
before = gvisor.clone3_errno(libc)
gvisor.install_clone3_filter(libc, gvisor.AUDIT_ARCH[platform.machine()])
after = gvisor.clone3_errno(libc)
started = []
thread = threading.Thread(target=started.append, args=(1,))
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
# the filter is inherited: a program this process starts sees clone3 refused too
grandchild = os.system(sys.executable + " -c 'import ctypes, sys; from sandbox import gvisor; "
                       "sys.exit(gvisor.clone3_errno(ctypes.CDLL(None, use_errno=True)))'")
print(errno.errorcode.get(before, before), errno.errorcode[after], started, os.waitstatus_to_exitcode(status),
      os.waitstatus_to_exitcode(grandchild))
"""


@pytest.mark.skipif(platform.machine() not in gvisor.AUDIT_ARCH, reason="the filter knows x86_64 and aarch64")
def test_the_filter_makes_clone3_answer_enosys_and_threads_and_fork_still_work() -> None:
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    before, after, started, forked, grandchild = result.stdout.split(maxsplit=4)
    # unfiltered, clone3 with no arguments is EINVAL (or EPERM/ENOSYS under an outer profile)
    assert before in {"EINVAL", "EPERM", "ENOSYS"}
    assert after == "ENOSYS"
    assert started == "[1]" and forked == "7"
    assert int(grandchild) == errno.ENOSYS


def test_the_filter_is_seven_instructions_that_check_the_architecture_first() -> None:
    code = gvisor.clone3_filter(0xC000003E)
    assert len(code) == 7 * 8
    # first instruction loads seccomp_data.arch (offset 4), the second compares it
    assert code[:8] == bytes([0x20, 0, 0, 0, 4, 0, 0, 0])
    assert int.from_bytes(code[12:16], "little") == 0xC000003E


def test_seccomp_mode_reads_the_status_field(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n", encoding="ascii")
    assert gvisor.seccomp_mode(str(status)) == 2
    status.write_text("Name:\tpython3\nSeccomp:\t0\n", encoding="ascii")
    assert gvisor.seccomp_mode(str(status)) == 0


def test_an_agent_with_no_seccomp_profile_refuses_to_start_and_names_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gvisor, "seccomp_mode", lambda status_path="/proc/self/status": 0)
    with pytest.raises(SystemExit) as raised:
        gvisor.prepare()
    message = str(raised.value)
    assert "--oci-seccomp" in message and "make runsc" in message
