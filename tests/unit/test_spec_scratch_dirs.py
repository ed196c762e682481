"""``[sandbox] scratch_dirs``: more scratch tmpfs places, made like /tmp (Harbor's /logs, /tests, /solution)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.core.policy import Policy
from harness.engine.spec import Mount, SandboxSpec


def test_each_scratch_dir_is_a_tmpfs_like_tmp() -> None:
    spec = SandboxSpec(scratch_dirs=("/logs", "/tests/", "/solution"))
    assert spec.scratch_dirs == ("/logs", "/tests", "/solution")
    places = spec.scratch_tmpfs()
    assert {place: places[place] for place in spec.scratch_dirs} == dict.fromkeys(spec.scratch_dirs,
                                                                                  spec.effective_tmp_size)
    # World-writable with the sticky bit: a root command (no CAP_DAC_OVERRIDE) and the tool user both write there.
    assert spec.tmpfs_options("/logs", 1000, 1000).endswith(",mode=1777")
    assert spec.tmpfs_options("/workspace", 1000, 1000).endswith(",mode=0755,uid=1000,gid=1000")
    assert spec.tmpfs_total == SandboxSpec().tmpfs_total  # not counted, as a separate workdir is not


def test_a_mount_covering_a_scratch_dir_replaces_its_tmpfs() -> None:
    spec = SandboxSpec(scratch_dirs=("/logs/agent",), mounts=(Mount(source=Path("/srv"), target="/logs"),))
    assert "/logs/agent" not in spec.scratch_tmpfs()


@pytest.mark.parametrize(("place", "message"), [
    ("/", "absolute path below /"),
    ("logs", "absolute path below /"),
    ("/etc/harbor", "system directory /etc"),
    ("/usr", "system directory /usr"),
    ("/proc/x", "system directory /proc"),
    ("/tmp/logs", "scratch place already"),
    ("/home", "scratch place already"),
])
def test_a_scratch_dir_that_would_hide_the_system_or_a_scratch_place_is_refused(place: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SandboxSpec(scratch_dirs=(place,))


def test_nested_scratch_dirs_are_refused() -> None:
    with pytest.raises(ValidationError, match="scratch place already"):
        SandboxSpec(scratch_dirs=("/logs", "/logs/verifier"))


def test_a_policy_sets_them() -> None:
    policy = Policy.model_validate({"sandbox": {"scratch_dirs": ["/logs", "/tests", "/solution"]}})
    assert policy.sandbox.scratch_dirs == ("/logs", "/tests", "/solution")
