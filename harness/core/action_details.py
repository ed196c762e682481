"""Reading a sandbox action's details for its policy rules (:mod:`harness.core.actions`): ports
and port ranges, a command, sandbox paths."""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

__all__ = ["detail_command", "detail_paths", "detail_port", "path_hit", "port_range", "show_ports"]

_PORT_RANGE = re.compile(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", re.ASCII)


def port_range(entry: int | str) -> tuple[int, int]:
    if isinstance(entry, int):
        low = high = entry
    else:
        found = _PORT_RANGE.fullmatch(entry)
        if found is None:
            raise ValueError(f'ports entry {entry!r} is neither a port nor a range; write 8000 or "8000-8100"')
        low = int(found.group(1))
        high = int(found.group(2) or low)
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"ports entry {entry!r} is not a port or an ascending range of ports (1 to 65535)")
    return low, high


def show_ports(ports: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(p) if isinstance(p, int) else f'"{p}"' for p in ports) + "]"


def detail_port(value: Any) -> int | None:
    """A port detail as an integer (digits in a string count: a deny rule must not miss "22")."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def detail_command(value: Any) -> str | None:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return " ".join(" ".join(value).split())
    return None


def detail_paths(value: Any, workdir: str) -> list[tuple[str, str | None]]:
    """Each sandbox path of the details as (absolute normalised path, path relative to workdir or None)."""
    items = value if isinstance(value, list | tuple) else () if value is None else (value,)
    out: list[tuple[str, str | None]] = []
    for item in items:
        if not isinstance(item, str | os.PathLike):
            continue
        norm = posixpath.normpath(posixpath.join(workdir, os.fsdecode(item)))
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        base = workdir.rstrip("/") + "/"
        relative = "" if norm == workdir else norm[len(base):] if norm.startswith(base) else None
        out.append((norm, relative))
    return out


def path_hit(matcher: re.Pattern[str], anchored: bool, absolute: str, relative: str | None) -> bool:
    if anchored:
        return relative is not None and matcher.fullmatch(relative) is not None
    return matcher.fullmatch(absolute) is not None
