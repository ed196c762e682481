"""Host directories mounted into real sandboxes, through `callbox exec`, `callbox call` and
the Python Session: a mount at a scratch place replaces its tmpfs (none over it, none
under it), nested mounts sit on top of the tmpfs, the host sees every write with the
right owner, :ro refuses writes, an unwritable rw mount is refused before anything runs,
and the scratch places are executable unless noexec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.policy import load_policy
from harness.core.session import Session
from harness.engine.spec import Mount, SandboxSpec
from harness.tools import builtin_registry
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to other users needs root")
CALLBOX = Path(sys.executable).with_name("callbox")
SCRATCH = ("/workspace", "/tmp", "/home/sandbox")


def callbox(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    command = [str(CALLBOX)] if CALLBOX.exists() else [sys.executable, "-m", "harness.cli.main"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def exec_sh(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return callbox("exec", "--image", IMAGE, *flags, "--", "sh", "-c", script)


def project(path: Path, uid: int | None = None, gid: int | None = None) -> Path:
    """A host directory with one file, owned by uid:gid (default: 1000 as root, else the caller)."""
    path.mkdir(parents=True)
    (path / "from-host.txt").write_text("written on the host\n")
    path.chmod(0o755)
    if ROOT:
        owner, group = (1000, 1000) if uid is None else (uid, gid if gid is not None else uid)
        os.chown(path, owner, group)
    return path


def mount_lines(proc_mounts: str, target: str) -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount at ``target`` or under it."""
    found = []
    for line in proc_mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and (fields[1] == target or fields[1].startswith(target.rstrip("/") + "/")):
            found.append((fields[1], fields[2]))
    return found


def harness(spec: SandboxSpec, tmp_path: Path, engine: Any) -> Session:
    return Session(builtin_registry(), load_policy(None), AuditStore(tmp_path / "audit.sqlite3"), spec=spec,
                   engine_factory=lambda: engine)


def shell(h: Session, command: str, call_id: str) -> Any:
    return h.call(ToolCall(name="shell", arguments=json.dumps({"command": command}), call_id=call_id))


# ---- a mount at a scratch place wins: no tmpfs over it, none under it --------------------------


@pytest.mark.parametrize("target", [*SCRATCH, "/home"])
def test_a_mount_at_a_scratch_place_replaces_its_tmpfs(engine, tmp_path, target):
    host = project(tmp_path / "p")
    proc = exec_sh(f"cat {target}/from-host.txt && echo made > {target}/made.txt && cat /proc/mounts",
                   "--mount", f"{host}:{target}:rw")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("written on the host\n"), proc.stdout
    assert (host / "made.txt").read_text() == "made\n"  # the write reached the host
    mounts = mount_lines(proc.stdout, target)
    assert len(mounts) == 1 and mounts[0][0] == target and mounts[0][1] != "tmpfs", mounts
    if target == "/home":  # a parent of the home directory: no home tmpfs inside the mount either
        assert mount_lines(proc.stdout, "/home/sandbox") == []
    for other in SCRATCH:  # the other scratch places keep their tmpfs
        if not other.startswith(target):
            assert mount_lines(proc.stdout, other)[0] == (other, "tmpfs"), proc.stdout


def test_a_nested_mount_sits_on_top_of_the_workspace_tmpfs(engine, tmp_path):
    host = project(tmp_path / "p")
    spec = SandboxSpec(image=IMAGE, mounts=(Mount.parse(f"{host}:/workspace/project:rw"),))
    with harness(spec, tmp_path, engine) as h:
        result = shell(h, "cat /workspace/project/from-host.txt; echo nested > /workspace/project/n.txt; "
                          "echo scratch > /workspace/s.txt; stat -c '%u %g' /workspace/project/n.txt; "
                          "cat /proc/mounts", "c1")
    assert not result.is_error, result.text
    assert "written on the host\n" in result.text
    assert (host / "n.txt").read_text() == "nested\n"
    assert not (host / "s.txt").exists()  # the tmpfs around the mount is the sandbox's own
    mounts = mount_lines(result.text, "/workspace")
    assert mounts[0] == ("/workspace", "tmpfs") and mounts[1][0] == "/workspace/project", mounts
    assert mounts[1][1] != "tmpfs" and len(mounts) == 2, mounts
    owner = host.stat()
    assert (owner.st_uid, owner.st_gid) == ((host / "n.txt").stat().st_uid, (host / "n.txt").stat().st_gid)


# ---- owners, :ro, and refusals ------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize(("owner", "flags"), [(1000, ":rw"), (4242, ":rw,uid=4242,gid=4242"), (4343, ":rw")])
def test_files_written_to_a_rw_mount_belong_to_its_owner(engine, tmp_path, owner, flags):
    host = project(tmp_path / "p", owner)
    proc = exec_sh("id -u; id -g; mkdir /workspace/dir && echo x > /workspace/dir/f", "--mount",
                   f"{host}:/workspace{flags}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(owner), str(owner)]
    for path in (host / "dir", host / "dir" / "f"):
        assert (path.stat().st_uid, path.stat().st_gid) == (owner, owner), path


def test_a_private_project_only_its_owner_may_enter_works_as_the_workdir(engine, tmp_path):
    """A 0700 directory (what `mktemp -d` makes) mounted at /workspace: the command starts
    in it although the agent itself may not enter it, as the tool user may."""
    host = project(tmp_path / "p")
    host.chmod(0o700)
    (host / "sub").mkdir(mode=0o700)
    if ROOT:
        os.chown(host / "sub", 1000, 1000)
    proc = exec_sh("pwd; cat from-host.txt; echo made > made.txt", "--mount", f"{host}:/workspace:rw")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["/workspace", "written on the host"]
    assert (host / "made.txt").read_text() == "made\n"
    proc = exec_sh("pwd", "--mount", f"{host}:/workspace:rw", "--workdir", "/workspace/sub")
    assert (proc.returncode, proc.stdout) == (0, "/workspace/sub\n"), proc.stderr


@needs_root
def test_a_workdir_the_tool_user_may_not_enter_is_named_in_the_error(engine, tmp_path):
    host = project(tmp_path / "p")
    (host / "locked").mkdir(mode=0o700)
    os.chown(host / "locked", 4242, 4242)
    proc = exec_sh("pwd", "--mount", f"{host}:/workspace:rw", "--workdir", "/workspace/locked")
    assert proc.returncode == 126, proc.stderr
    assert "cannot enter the working directory /workspace/locked: Permission denied" in proc.stderr
    proc = exec_sh("pwd", "--mount", f"{host}:/workspace:rw", "--workdir", "/workspace/missing")
    assert proc.returncode == 2, proc.stderr  # refused before a sandbox starts
    assert f"{host}/missing is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_read_only_mount_refuses_writes(engine, tmp_path):
    host = project(tmp_path / "p")
    proc = exec_sh("cat /data/from-host.txt; echo x > /data/new.txt", "--mount", f"{host}:/data:ro")
    assert proc.returncode != 0
    assert proc.stdout == "written on the host\n"
    assert "Read-only file system" in proc.stderr, proc.stderr
    assert not (host / "new.txt").exists()


@needs_root
def test_a_root_owned_rw_mount_is_refused_before_the_first_call(engine, tmp_path):
    host = project(tmp_path / "demo-project", 0, 0)
    expected = (f"rw mount {host} (at /workspace/project) is not writable by the tool user uid 1000, gid 1000 "
                "(the sandbox user; no rw mount is owned by a non-root user): owner root (uid 0), group root "
                "(gid 0), mode 0755; chown it to a non-root user")
    mount = f"{host}:/workspace/project:rw"
    for proc in (exec_sh("touch /workspace/project/x", "--mount", mount),
                 callbox("call", "shell", '{"command": "touch /workspace/project/x"}', "--image", IMAGE,
                         "--audit-db", str(tmp_path / "a.db"), "--mount", mount)):
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert proc.stderr.startswith(f"callbox: {expected}") and proc.stderr.count("\n") == 1, proc.stderr
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[[sandbox.mounts]]\nsource = "{host}"\ntarget = "/workspace/project"\nmode = "rw"\n')
    proc = callbox("call", "shell", '{"command": "true"}', "--policy", str(policy), "--audit-db",
                   str(tmp_path / "a.db"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"callbox: policy file {policy}: key 'sandbox.mounts[0].source': {expected}")
    # the Python API: the call gets a result saying why, not "(a bug)", and nothing ran
    spec = SandboxSpec(image=IMAGE, mounts=(Mount.parse(mount),))
    with harness(spec, tmp_path, engine) as h:
        result = shell(h, "touch /workspace/project/x", "c1")
        assert h.active_sandbox is None
    assert result.is_error and result.error == ErrorCode.SANDBOX_UNAVAILABLE, result.text
    assert result.text.startswith(f"the sandbox is unavailable: {expected}"), result.text
    assert sorted(os.listdir(host)) == ["from-host.txt"]


# ---- running what was built or copied into the scratch places --------------------------------

RUN_EVERYWHERE = "; ".join(
    f"printf '#!/bin/sh\\necho ran\\n' > {d}/run.sh && chmod +x {d}/run.sh && {d}/run.sh; echo script={d}:$?; "
    f"cp /bin/true {d}/t && {d}/t; echo binary={d}:$?"
    for d in SCRATCH
) + ("; python3 -m venv --without-pip /tmp/venv && printf '#!/tmp/venv/bin/python\\nprint(6*7)\\n' > "
     "/tmp/venv/bin/tool && chmod +x /tmp/venv/bin/tool && /tmp/venv/bin/tool; echo venv=$?")


def test_scripts_binaries_and_venvs_run_from_every_scratch_place(engine):
    proc = exec_sh(RUN_EVERYWHERE + "; df -B1 --output=size /home/sandbox | tail -1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    for d in SCRATCH:
        assert f"script={d}:0" in lines and f"binary={d}:0" in lines, proc.stdout + proc.stderr
    assert "42" in lines and "venv=0" in lines, proc.stdout + proc.stderr
    assert lines[-1] == str(32 << 20)  # the home directory holds a pip cache now


def test_noexec_turns_execution_from_scratch_places_off(engine):
    proc = exec_sh(RUN_EVERYWHERE + "; sh /tmp/run.sh; grep -E ' /(workspace|tmp|home/sandbox) ' /proc/mounts",
                   "--noexec")
    lines = proc.stdout.splitlines()
    for d in SCRATCH:
        assert f"script={d}:126" in lines and f"binary={d}:126" in lines, proc.stdout + proc.stderr
    assert "venv=126" in lines  # a console script the venv installed
    assert "ran" in lines  # an interpreter still runs the script: noexec is a small tightening
    mounts = [line for line in lines if " tmpfs " in line]
    assert len(mounts) == 3 and all("noexec" in m and "nosuid" in m and "nodev" in m for m in mounts), mounts


def test_a_mounted_project_is_executable_too(engine, tmp_path):
    host = project(tmp_path / "p")
    proc = exec_sh("printf '#!/bin/sh\\necho built\\n' > /workspace/project/build.sh; "
                   "chmod +x /workspace/project/build.sh; /workspace/project/build.sh",
                   "--mount", f"{host}:/workspace/project:rw")
    assert (proc.returncode, proc.stdout) == (0, "built\n"), proc.stderr


def test_the_engine_refuses_what_its_host_cannot_run_before_creating_anything(engine, tmp_path):
    from harness.engine.spec import SpecError

    cpus = engine.host_limits().cpus
    cases = [
        (SandboxSpec(image=IMAGE, cpus=cpus + 1), f"cpus {cpus + 1} is more than the {cpus} CPU(s) of the Docker "
                                                  f"engine's host; use at most {cpus}"),
        (SandboxSpec(image=IMAGE, memory="64t"), "memory 64t is more than the "),
        (SandboxSpec(image=IMAGE, mounts=(Mount.parse(f"{tmp_path}/gone:/data"),)), "does not exist on the host"),
    ]
    for spec, message in cases:
        with pytest.raises(SpecError) as caught:
            engine.create(spec)
        assert message in caught.value.message
