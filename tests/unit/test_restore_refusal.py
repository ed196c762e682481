"""`sandbox restore` of a sandbox that is not gone: what restore is for, and what to do instead."""

from __future__ import annotations

from harness.engine.docker.living import not_gone


def test_a_paused_sandbox_with_a_snapshot() -> None:
    assert not_gone("web", "paused", "snap-1").message == (
        "sandbox web is paused, not gone: restore recreates a gone sandbox (its container stopped or removed, e.g. "
        "when the Docker engine restarted) from its latest snapshot, and web still has its files; "
        "`callbox sandbox resume web` thaws it; to take it back to its latest snapshot (snap-1), remove it "
        "(`callbox sandbox rm web`), then restore it; `callbox sandbox fork web --name NEW` starts a copy of it")


def test_a_running_sandbox_without_a_snapshot_is_told_how_to_take_one() -> None:
    message = not_gone("web", "running", None).message
    assert message.startswith("sandbox web is running, not gone: restore recreates a gone sandbox")
    assert "it has no snapshot (`callbox sandbox snapshot web SNAPSHOT` takes one)" in message
    assert "resume" not in message
