"""Sandboxes under gVisor (``runtime = "runsc"``, installed by ``make runsc``): the agent runs,
commands, file tools, timeouts and images without Python work on gVisor's kernel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.integration.helpers import callbox, run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", autouse=True)
def _runsc_installed(engine) -> None:  # type: ignore[no-untyped-def]
    if "runsc" not in (engine.client.info().get("Runtimes") or {}):
        unavailable("the Docker engine has no runtime runsc (run `make runsc`)", module=True)


def test_cli_exec_under_runsc_runs_python_on_gvisors_kernel() -> None:
    result = callbox("exec", "--runtime", "runsc", "--", "python3", "-c", "print(1)")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"1\n"
    kernel = callbox("exec", "--runtime", "runsc", "--", "cat", "/proc/version")
    assert b"Linux version 4.4.0" in kernel.stdout, kernel.stdout  # gVisor's kernel, not the host's


def test_the_seccomp_profile_applies_under_runsc_and_threads_still_start(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(runtime="runsc")
    probe = run(box, ["python3", "-c", (
        "import ctypes, errno, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])\n"
        "libc.syscall(435, None, 0); print(errno.errorcode[ctypes.get_errno()])\n"  # clone3
        "libc.unshare(0x10000000); print(errno.errorcode[ctypes.get_errno()])\n"  # CLONE_NEWUSER
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
    )])
    assert probe.exit_code == 0, probe.stderr.data()
    # a filter applies (gVisor's own copy of callbox's profile), clone3 answers ENOSYS (the
    # agent's repair), unshare is refused by the profile, and threads start
    assert probe.stdout.data().split() == [b"2", b"ENOSYS", b"EPERM", b"thread"]


def test_file_tools_act_as_the_tool_user_under_runsc() -> None:
    # gVisor has no setfsuid: the agent acts as the tool user through per-thread effective ids.
    arguments = json.dumps({"path": "made.txt", "content": "hi\n"})
    result = callbox("call", "--runtime", "runsc", "write_file", arguments)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Wrote 3 bytes" in json.loads(result.stdout)["output"]


def test_timeout_kills_the_tree_under_runsc(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(runtime="runsc")
    result = run(box, "(sleep 1000 &) ; sleep 1001", timeout_ms=1000)
    assert result.timed_out
    left = run(box, ["python3", "-c", "import os; print(sum(open(f'/proc/{p}/comm').read() == 'sleep\\n' "
                                      "for p in os.listdir('/proc') if p.isdigit()))"])
    assert left.stdout.data() == b"0\n"
    assert run(box, ["id", "-u"]).stdout.data() == b"1000\n"


def test_an_image_without_python_runs_under_runsc(busybox_image: str) -> None:
    result = callbox("exec", "--runtime", "runsc", "--image", busybox_image, "--", "sh", "-c", "echo hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hi\n"


def test_an_older_runsc_registration_refuses_a_networked_sandbox_before_any_container(engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Registered with --network=none (callbox's earlier make runsc), runsc would give an open
    sandbox only lo: the engine refuses it, naming the upgrade, and starts nothing."""
    from dataclasses import replace

    from harness.engine.spec import SandboxSpec, SpecError

    before = {c.id for c in engine.client.containers.list(all=True, ignore_removed=True)}
    monkeypatch.setattr(engine, "_host", replace(engine.host_limits(), runsc_network="none"))
    with pytest.raises(SpecError, match=r"--network=none .*make runsc") as refused:
        engine.create(SandboxSpec(runtime="runsc", network="open"))
    assert refused.value.key == "runtime"
    assert {c.id for c in engine.client.containers.list(all=True, ignore_removed=True)} <= before


def test_runsc_refuses_to_give_a_container_the_hosts_network_namespace(engine) -> None:  # type: ignore[no-untyped-def]
    """gVisor's network stack takes over the interfaces of the namespace it starts in: in the
    host's own (Docker's network host) that would strip this machine's addresses. callbox-runsc
    (make runsc) refuses it, where runsc 20240729's own check is wrong on newer kernels."""
    import subprocess

    import docker.errors

    from tests.conftest import IMAGE

    def addresses() -> str:  # of lo and the default route's interface (other tests add and remove bridges)
        route = subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True, check=True).stdout
        devices = ["lo", *route.split(" dev ")[1:2]]
        return "".join(subprocess.run(["ip", "-o", "addr", "show", "dev", dev.split()[0]], capture_output=True,
                                      text=True, check=True).stdout for dev in devices)

    def runsc_sandboxes() -> set[str]:  # ids of the gVisor sandboxes runsc keeps state for
        root = Path("/var/run/docker/runtime-runc/moby")
        return {path.name.partition("_sandbox:")[0] for path in root.glob("*_sandbox:*.state")}

    before = addresses()
    assert "inet 127.0.0.1/8" in before
    sandboxes_before = runsc_sandboxes()
    mark = {"callbox-test": f"runsc-host-network-{os.getpid()}"}
    try:
        with pytest.raises(docker.errors.APIError, match="host's network namespace"):
            engine.client.containers.run(IMAGE, ["true"], entrypoint=[], runtime="runsc", network_mode="host",
                                         remove=True, labels=mark)
    finally:  # a container whose start failed is not removed by remove=True
        for left in engine.client.containers.list(all=True, filters={"label": f"callbox-test={mark['callbox-test']}"},
                                                     ignore_removed=True):
            left.remove(force=True)
    assert addresses() == before
    # the refused container's sandbox (started by `runsc create`) is not left running
    known = {c.id for c in engine.client.containers.list(all=True, ignore_removed=True)}
    assert {i for i in runsc_sandboxes() - sandboxes_before if i not in known} == set()
