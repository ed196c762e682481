"""The hardened container defaults hold in a real sandbox."""

from __future__ import annotations

import os
import socket

import pytest

from harness.engine.docker.engine import AGENT_PIDS_RESERVE
from tests.conftest import RUNTIME
from tests.integration.helpers import run
from tests.security.engines import ON_RAY, docker_client, listening_neighbours, socket_dir

pytestmark = pytest.mark.docker


@pytest.fixture
def sandbox(clean_sandbox):  # type: ignore[no-untyped-def]
    """The module's shared default sandbox (reset before each test): these tests read the
    defaults of a default sandbox, and the one attack among them (on the agent) would break
    the sandbox for every later test too, so it cannot pass unseen. Tests that need a spec of
    their own (mounts, env) still make their own sandbox."""
    return clean_sandbox


def test_tool_processes_are_unprivileged(sandbox):
    status = run(sandbox, "grep -E '^(Uid|CapEff|CapPrm|NoNewPrivs):' /proc/self/status").stdout.data().decode()
    fields = {line.split(":")[0]: line.split(":", 1)[1].split() for line in status.splitlines()}
    assert fields["Uid"][0] == "1000"
    assert fields["CapEff"] == ["0000000000000000"]
    assert fields["CapPrm"] == ["0000000000000000"]
    # gVisor's /proc/self/status has no NoNewPrivs line; the flag itself is asked for with
    # prctl(PR_GET_NO_NEW_PRIVS) under both runtimes.
    if "NoNewPrivs" in fields or RUNTIME != "runsc":
        assert fields["NoNewPrivs"] == ["1"]
    asked = run(sandbox, ["python3", "-c", "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"])
    assert asked.stdout.data() == b"1\n", asked
    assert run(sandbox, ["id", "-u"]).stdout.data() == b"1000\n"


def test_agent_cannot_be_signalled_or_ptraced_by_tools(sandbox):
    pid = run(sandbox, "pgrep -f /opt/callbox/agent.py | head -1").stdout.data().strip().decode()
    assert pid.isdigit(), "agent process not found"
    killed = run(sandbox, f"kill -9 {pid}")
    assert killed.exit_code != 0
    assert b"not permitted" in killed.stderr.data()
    ptrace = run(sandbox, ["python3", "-c", (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"r = libc.ptrace(16, {pid}, 0, 0)\n"  # PTRACE_ATTACH
        "print(r, ctypes.get_errno())\n"
    )])
    assert ptrace.stdout.data().split()[0] == b"-1"
    environ = run(sandbox, f"cat /proc/{pid}/environ")
    if RUNTIME == "runsc":
        # A finding: gVisor's /proc lets a tool read the agent's environment (runc's kernel
        # refuses). It holds nothing a tool should not see: the image's variables and the
        # agent's own switches, no credential.
        names = {entry.split(b"=", 1)[0] for entry in environ.stdout.data().split(b"\0") if entry}
        assert names <= {b"PATH", b"HOSTNAME", b"HOME", b"LANG", b"LC_ALL", b"PYTHONDONTWRITEBYTECODE",
                         b"GRPC_ENABLE_FORK_SUPPORT", b"TERM"}, names
    else:
        assert environ.exit_code != 0
    # and the agent still answers
    assert run(sandbox, ["true"]).exit_code == 0


def test_root_filesystem_is_read_only(sandbox):
    for path in ("/usr/local/x", "/etc/x", "/x", "/opt/callbox/x"):
        result = run(sandbox, ["touch", path])
        assert result.exit_code != 0, path
        assert b"Read-only file system" in result.stderr.data() or b"Permission denied" in result.stderr.data()
    assert run(sandbox, "touch /tmp/ok /workspace/ok && echo yes").stdout.data() == b"yes\n"


def test_ro_mount_refuses_writes_and_rw_mount_writes_with_host_owner(make_sandbox, tmp_path):
    # A mount's source is a path on the machine that runs the sandbox: on the Ray test cluster
    # that is a node sharing this machine's filesystem, so tmp_path is one there too.
    ro = tmp_path / "ro"
    rw = tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "in.txt").write_text("from host\n")
    os.chmod(ro, 0o777)  # even a world-writable host dir stays read-only through a :ro mount
    os.chown(rw, 1234, 1234) if os.geteuid() == 0 else None
    box = make_sandbox(mounts=[{"source": ro, "target": "/data/ro", "read_only": True},
                               {"source": rw, "target": "/data/rw", "read_only": False}])
    assert run(box, ["cat", "/data/ro/in.txt"]).stdout.data() == b"from host\n"
    denied = run(box, "echo x > /data/ro/new.txt")
    assert denied.exit_code != 0
    assert not (ro / "new.txt").exists()
    wrote = run(box, "echo made-inside > /data/rw/out.txt && id -u")
    assert wrote.exit_code == 0, wrote.stderr.data()
    out = rw / "out.txt"
    assert out.read_text() == "made-inside\n"
    expected_uid = 1234 if os.geteuid() == 0 else os.getuid()
    assert out.stat().st_uid == expected_uid
    assert wrote.stdout.data().strip() == str(expected_uid).encode()


def test_network_none_has_only_loopback_and_cannot_reach_the_bridge_gateway(sandbox, engine):
    # /proc/net/dev: this namespace's interfaces under both runtimes (gVisor has no /sys/class/net)
    listing = run(sandbox, "tail -n +3 /proc/net/dev | cut -d: -f1").stdout.data().split()
    assert listing == [b"lo"]
    for address, port in listening_neighbours(sandbox, engine):
        if ON_RAY:
            # control: the relay and the GCS really listen (this process, a Ray driver, reaches
            # both), so the sandbox's refusal is its missing network, not a dead target
            socket.create_connection((address, port), timeout=5).close()
        probe = run(sandbox, ["python3", "-c", (
            "import socket, sys\n"
            "s = socket.socket(); s.settimeout(2)\n"
            f"try:\n    s.connect(({address!r}, {port})); print('connected')\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
        )])
        assert probe.stdout.data().startswith(b"refused"), (address, port, probe.stdout.data())


def test_no_host_environment_leaks_into_the_sandbox(make_sandbox, monkeypatch):
    monkeypatch.setenv("CALLBOX_LEAK_CANARY", "secret-value")
    box = make_sandbox(env={"GIVEN": "1"})
    env = run(box, ["env"], env={"GIVEN": "1"}).stdout.data().decode()
    names = {line.split("=", 1)[0] for line in env.splitlines()}
    assert "CALLBOX_LEAK_CANARY" not in names
    assert "secret-value" not in env
    assert names <= {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "GIVEN", "PWD", "SHLVL", "_"}
    # the agent itself runs with an empty environment apart from what the image sets
    agent_env = run(box, "cat /proc/1/environ 2>&1 | tr '\\0' '\\n'").stdout.data()
    assert b"secret-value" not in agent_env


def test_container_has_hardened_host_config(sandbox, engine):
    attrs = docker_client(sandbox).api.inspect_container(sandbox.container_id)
    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert host["ReadonlyRootfs"] is True
    assert host["NetworkMode"] == "none"
    assert host["Privileged"] is False
    assert host["Init"] is True
    assert host["Memory"] == host["MemorySwap"] == 512 << 20
    assert host["PidsLimit"] == 256 + AGENT_PIDS_RESERVE
    assert host["IpcMode"] == "private"
    assert any(o.startswith("no-new-privileges") for o in host["SecurityOpt"])
    assert any(o.startswith("seccomp=") and "io_uring_setup" not in o for o in host["SecurityOpt"])
    assert not host.get("Devices")
    binds = [m["Source"] for m in attrs["Mounts"]]
    assert not any("docker.sock" in b for b in binds)
    assert attrs["Config"]["Labels"]["callbox.sandbox-id"] == sandbox.id
    assert float(attrs["Config"]["Labels"]["callbox.expires"]) > 0


def test_io_uring_is_refused_by_seccomp(sandbox):
    probe = run(sandbox, ["python3", "-c", (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "r = libc.syscall(425, 4, params)\n"  # io_uring_setup on x86_64
        "print(r, ctypes.get_errno())\n"
    )])
    ret, errno = probe.stdout.data().split()
    assert ret == b"-1"
    assert int(errno) in (1, 38)  # EPERM or ENOSYS, never a ring


def test_agent_socket_directory_is_private(sandbox):
    directory = socket_dir(sandbox)
    mode = directory.stat().st_mode & 0o777
    assert mode == 0o700
    sock = (directory / "agent.sock").stat()
    # only the user of the process that serves it: the harness's here, the node's host on a
    # Ray node (the test cluster's nodes run as root, as this test does)
    assert (sock.st_mode & 0o777, sock.st_uid) == (0o600, os.geteuid())
    inside = run(sandbox, "ls /run/callbox")
    assert inside.exit_code != 0
    assert b"Permission denied" in inside.stderr.data()
