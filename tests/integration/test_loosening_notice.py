"""A loosened default is said once, before the first call, by every command that starts a
sandbox: once per setting, whether it came from the policy file (named by its key) or from
a flag, never repeated by the engine in the middle of the call's output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "proj"
    project.mkdir()
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)
    return project


def _notices(stderr: bytes) -> list[str]:
    return [line for line in stderr.decode().splitlines() if "loosens a hardened default" in line]


def test_call_with_a_policy_mount_says_it_once_by_its_key(engine, tmp_path):
    project = _project(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[sandbox]\nimage = "{IMAGE}"\n[[sandbox.mounts]]\nsource = "{project}"\n'
                      'target = "/workspace/project"\nmode = "rw"\n')
    proc = callbox("call", "shell", '{"command": "echo hi > /workspace/project/x"}', "--policy", str(policy),
                   "--audit-db", str(tmp_path / "audit.sqlite3"))
    assert proc.returncode == 0, proc.stderr
    notices = _notices(proc.stderr)
    assert len(notices) == 1, notices
    assert "sandbox.mounts[0]" in notices[0] and "read-write" in notices[0]
    assert (project / "x").read_text() == "hi\n"


@pytest.mark.parametrize("command", ["call", "exec"])
def test_a_flag_mount_is_said_once(engine, tmp_path, command):
    project = _project(tmp_path)
    mount = f"{project}:/workspace/project:rw"
    if command == "call":
        argv = ["call", "shell", '{"command": "true"}', "--image", IMAGE, "--mount", mount,
                "--audit-db", str(tmp_path / "audit.sqlite3")]
    else:
        argv = ["exec", "--image", IMAGE, "--mount", mount, "--", "true"]
    proc = callbox(*argv)
    assert proc.returncode == 0, proc.stderr
    assert _notices(proc.stderr) == ["callbox: this policy loosens a hardened default: read-write mount(s): "
                                     "/workspace/project"]
