"""Host directory trees for the undo tests: a small project with every kind of entry a revert
must put back, and a listing to compare a tree with, byte for byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

Listing = dict[str, tuple[str, int, bytes | str | None]]


def listing(root: Path) -> Listing:
    """Every entry below ``root``: (type, permission bits, content or symlink target)."""
    found: Listing = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("symlink", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), None)
            else:
                found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def make_project(root: Path, *, binary: bool = False) -> None:
    """A text file, one in a subdirectory, an executable, a symlink (and with ``binary`` a
    binary file) under ``root``; as root, given to uid 1000, since tools never run as root."""
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("one\ntwo\nthree\n")
    (root / "sub" / "b.txt").write_text("bee\n")
    (root / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (root / "tool.sh").chmod(0o755)
    if binary:
        (root / "blob.bin").write_bytes(bytes(range(256)))
    os.symlink("a.txt", root / "link")
    if os.geteuid() == 0:
        for top, dirs, files in os.walk(root):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.chown(name, 1000, 1000, follow_symlinks=False)
