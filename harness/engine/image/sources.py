"""The suite and mirror to debootstrap from: /etc/os-release and the machine's apt sources (pure, no Docker)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SUITE = "bookworm"


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` entry of the machine's apt configuration."""

    uri: str
    suites: tuple[str, ...]


def parse_os_release(text: str) -> dict[str, str]:
    """Parse /etc/os-release (shell-style ``KEY=value`` lines, values optionally quoted)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The Debian suite to debootstrap: the host's codename on Debian, else ``bookworm``."""
    try:
        info = parse_os_release(os_release.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return DEFAULT_SUITE
    codename = info.get("VERSION_CODENAME", "")
    if info.get("ID") == "debian" and re.fullmatch(r"[a-z][a-z0-9-]*", codename):
        return codename
    return DEFAULT_SUITE


def parse_one_line_sources(text: str) -> list[AptSource]:
    """Parse the one-line format (``deb [opts] URI SUITE [COMPONENT...]``); ``deb-src`` is skipped."""
    out: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind != "deb":
            continue
        rest = rest.strip()
        if rest.startswith("["):
            close = rest.find("]")
            if close < 0:
                continue
            rest = rest[close + 1 :].strip()
        fields = rest.split()
        if len(fields) < 2:
            continue
        out.append(AptSource(uri=fields[0], suites=(fields[1],)))
    return out


def parse_deb822_sources(text: str) -> list[AptSource]:
    """Parse deb822 ``.sources`` stanzas (``Types``/``URIs``/``Suites``; ``Enabled: no`` is skipped)."""
    out: list[AptSource] = []
    for stanza in _deb822_stanzas(text):
        if stanza.get("enabled", "yes").strip().lower() in {"no", "false", "0"}:
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        suites = tuple(stanza.get("suites", "").split())
        out.extend(AptSource(uri=uri, suites=suites) for uri in stanza.get("uris", "").split())
    return out


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    last: str | None = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if stanza:
                yield stanza
            stanza, last = {}, None
            continue
        if raw[0] in " \t":
            if last is not None:
                stanza[last] += " " + raw.strip()
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        last = key.strip().lower()
        stanza[last] = value.strip()
    if stanza:
        yield stanza


def apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """All ``deb`` entries in apt's reading order: sources.list, then sources.list.d/ by file name."""
    out: list[AptSource] = []
    main = etc_apt / "sources.list"
    with contextlib.suppress(OSError):
        out.extend(parse_one_line_sources(main.read_text(encoding="utf-8", errors="replace")))
    parts = etc_apt / "sources.list.d"
    try:
        names = sorted(p for p in parts.iterdir() if p.is_file())
    except OSError:
        names = []
    for path in names:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if path.name.endswith(".list"):
            out.extend(parse_one_line_sources(text))
        elif path.name.endswith(".sources"):
            out.extend(parse_deb822_sources(text))
    return out


def find_mirror(suite: str, sources: list[AptSource]) -> str | None:
    """The first usable ``deb`` URI whose suites include ``suite`` exactly, or None."""
    for source in sources:
        if suite in source.suites and re.match(r"(?i)(https?|file)://", source.uri):
            return source.uri.rstrip("/")
    return None
