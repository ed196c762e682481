"""SandboxSpec.space_for: what bounds the space of a path, named for a message when a write ran out of it."""

from __future__ import annotations

from harness.engine.spec import SandboxSpec


def test_a_scratch_place_names_its_size_and_policy_key() -> None:
    spec = SandboxSpec(image="img", memory=512 << 20, tmp_size=16 << 20)
    assert spec.space_for("/tmp/a/b.bin").startswith("/tmp is a tmpfs of 16")
    assert "[sandbox] tmp_size" in spec.space_for("/tmp/a/b.bin")
    assert "workspace_size" in spec.space_for("/workspace/x") and "home_size" in spec.space_for("/home/sandbox/.c")


def test_a_separate_workdir_is_sized_as_the_workspace_and_other_paths_say_where_to_write() -> None:
    spec = SandboxSpec(image="img", workdir="/home/user")
    assert spec.space_for("/home/user/f").startswith("/home/user is a tmpfs of")
    assert "workspace_size" in spec.space_for("/home/user/f")
    assert "read-only" in spec.space_for("/usr/lib/f")
