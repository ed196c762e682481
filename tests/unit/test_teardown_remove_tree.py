"""The socket directory's removal: gone is fine, anything else raises so the removal retries."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.docker.teardown import remove_tree


def test_a_full_tree_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "a69c3602abb8"
    (root / "sub").mkdir(parents=True)
    (root / "expires").write_text("1\n")
    (root / "sub" / "agent.sock").write_text("")
    remove_tree(root)
    assert not root.exists()


def test_a_missing_directory_is_no_error(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never-made")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_raises_instead_of_leaving_the_directory_silently(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    with pytest.raises(OSError):
        remove_tree(not_a_directory)
    assert not_a_directory.exists()
