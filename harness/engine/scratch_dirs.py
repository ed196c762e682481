"""``[sandbox] scratch_dirs``: more scratch tmpfs places, checked.

A sandbox's root filesystem is read-only; its scratch places (/workspace, /tmp, the home
directory, a separate workdir) are tmpfs. Some frameworks write top-level directories of
their own (Harbor: ``/logs``, ``/tests``, ``/solution``, from root commands and the tool user
both), so a policy may name more: each an empty tmpfs of ``tmp_size``, made like /tmp
(world-writable with the sticky bit: root here has no CAP_DAC_OVERRIDE, so a place the tool
user owns would refuse it). An entry may not hide a system directory the sandbox runs from,
nor be, hold or lie in another scratch place.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

__all__ = ["checked_scratch_dirs"]


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + "/")


def checked_scratch_dirs(value: Iterable[str], taken: tuple[str, ...], reserved: Iterable[str]) -> tuple[str, ...]:
    """``value``'s paths, normalised; ValueError naming the entry and the rule it breaks.
    ``taken`` are the scratch places a sandbox has anyway, ``reserved`` the system
    directories (``/`` among them: no entry may be it)."""
    places: list[str] = []
    for raw in value:
        place = posixpath.normpath(raw) if raw.startswith("/") else raw
        if not place.startswith("/") or place == "/" or place.startswith("//"):
            raise ValueError(f"scratch_dirs: {raw!r} must be an absolute path below / inside the sandbox")
        system = next((d for d in reserved if d != "/" and _within(place, d)), None)
        if system is not None:
            raise ValueError(f"scratch_dirs: {raw!r} would hide the system directory {system} the sandbox runs "
                             "from; choose a directory of your own (e.g. /logs)")
        others = (*taken, *places)
        if any(_within(place, p) or _within(p, place) for p in others):
            raise ValueError(f"scratch_dirs: {raw!r} is, holds or lies in a scratch place already "
                             f"({', '.join(others)})")
        places.append(place)
    return tuple(places)
