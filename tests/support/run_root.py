"""What a sandbox can leave under an engine's run root: socket directories and lifetime records."""

from __future__ import annotations

from pathlib import Path

from harness.engine.docker.lifetime import LIFETIME_DIR


def leftovers(run_root: Path) -> list[str]:
    """The socket directories and lifetime records under ``run_root`` (the records' directory
    itself, which stays once made, is not one), sorted; empty when nothing was left."""
    if not run_root.exists():
        return []
    found = [p.name for p in run_root.iterdir() if p.is_dir() and p.name != LIFETIME_DIR]
    records = run_root / LIFETIME_DIR
    if records.is_dir():
        found += [f"{LIFETIME_DIR}/{p.name}" for p in records.iterdir()]
    return sorted(found)
