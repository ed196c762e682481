"""The documentation site builds strictly and offline (tests/docs/conftest.py), every page is
in the nav and reachable, and the generated references cover what they are generated from:
every CLI command, every policy and server-configuration key, every error code. No page
loads anything from another host."""

from __future__ import annotations

import argparse
import re
import tomllib
import typing
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def _url(page: str) -> str:
    """A page's directory URL, relative to the site's root (``reference/cli/``)."""
    stem = page.removesuffix(".md")
    return "" if stem == "index" else stem.removesuffix("/index") + "/"


def _ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_every_page_is_in_the_nav_and_reachable_from_the_home_page(built_site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = list(_nav_pages(config["nav"]))
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
    assert sorted(nav) == pages, "mkdocs.yml's nav and the pages under docs/ differ"
    home = (built_site / "index.html").read_text()
    for page in nav:
        assert (built_site / _url(page) / "index.html").is_file(), f"{page} was not built"
        if page != "index.md":
            assert f'href="{_url(page)}"' in home, f"the home page's navigation has no link to {page}"


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield words
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.prog.endswith(" " + name):  # an alias's parser is its command's, whose prog it is not
                    yield from _commands(sub, (*words, name))


def test_every_cli_command_is_in_the_cli_reference_with_its_anchor(built_site: Path) -> None:
    from harness.cli.main import build_parser

    parser = build_parser()
    page = (built_site / "reference" / "cli" / "index.html").read_text()
    ids = _ids(page)
    every = list(_commands(parser, ("callbox",)))
    assert len(every) > 30
    missing = ["-".join(words) for words in every if "-".join(words) not in ids]
    assert not missing, f"commands without their section in the CLI reference: {missing}"
    for action in parser._actions:  # and the top-level options
        for option in action.option_strings:
            assert option in page


def _models_in(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models an annotation holds, each with how it nests: ``table``, ``dict`` or ``array``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "table", annotation
    elif origin is typing.Annotated:
        yield from _models_in(args[0])
    elif origin in (dict,) and len(args) == 2:
        for _, model in _models_in(args[1]):
            yield "dict", model
    elif origin in (tuple, list) and args:
        for _, model in _models_in(args[0]):
            yield "array", model
    else:
        for arg in args:
            yield from _models_in(arg)


def _keys(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of ``model``'s TOML, a user's own names (a tool's) written NAME."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        nested = list(_models_in(info.annotation))
        for how, inner in nested:
            yield from _keys(inner, (*path, key, "NAME") if how == "dict" else (*path, key))
        if not nested or any(a is not type(None) and not _is_nested(a) for a in _alternatives(info.annotation)):
            yield (*path, key)


def _alternatives(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Annotated:
        return _alternatives(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType):
        return [a for arg in typing.get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


def _is_nested(annotation: Any) -> bool:
    return any(True for _ in _models_in(annotation))


def _documented(path: tuple[str, ...], ids: set[str], html: str) -> bool:
    """Whether the reference documents ``path``: its own anchor, or a table of names written
    NAME (``actions.NAME.decision``) that lists the name (``process``)."""
    if ".".join(path) in ids:
        return True
    for i, part in enumerate(path):
        generic = (*path[:i], "NAME", *path[i + 1:])
        if ".".join(generic) in ids and f"<code>{part}</code>" in html:
            return True
    return False


def _toml_keys(data: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _toml_keys(value, (*path, key))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                yield from _toml_keys(item, (*path, key))
        else:
            yield (*path, key)


def test_every_policy_key_is_in_the_policy_reference(built_site: Path) -> None:
    from harness.core.policy import Policy

    html = (built_site / "reference" / "policy" / "index.html").read_text()
    ids = _ids(html)
    keys = set(_keys(Policy))
    assert len(keys) > 60
    missing = sorted(".".join(k) for k in keys if not _documented(k, ids, html))
    assert not missing, f"policy keys missing from the policy reference: {missing}"
    # The packaged default policy, which sets the keys a user copies, is covered too.
    default = tomllib.loads((ROOT / "harness" / "data" / "default-policy.toml").read_text())
    missing = sorted(".".join(k) for k in _toml_keys(default) if not _documented(k, ids, html))
    assert not missing, f"keys of the default policy missing from the policy reference: {missing}"


def test_every_server_config_key_is_in_the_config_reference(built_site: Path) -> None:
    from harness.cli.server_config import ServerConfig

    html = (built_site / "reference" / "config" / "index.html").read_text()
    ids = _ids(html)
    keys = set(_keys(ServerConfig))
    assert len(keys) > 35
    missing = sorted(".".join(k) for k in keys if not _documented(k, ids, html))
    assert not missing, f"server configuration keys missing from its reference: {missing}"


class _Assets(HTMLParser):
    """Every URL a page loads by itself: ``src`` and ``srcset`` of any element, ``href`` of a
    ``<link>``, ``data`` of an ``<object>`` (links a reader follows, ``<a href>``, are not loads)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (name in ("src", "srcset", "poster") or (tag == "link" and name == "href")
                          or (tag == "object" and name == "data")):
                self.urls.append(value)


def test_no_page_loads_anything_from_another_host(built_site: Path) -> None:
    remote = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
    found = []
    for path in built_site.rglob("*.html"):
        parser = _Assets()
        parser.feed(path.read_text())
        found.extend(f"{path.relative_to(built_site)}: {url}" for url in parser.urls if remote.match(url))
    for path in built_site.rglob("*.css"):
        text = path.read_text()
        found.extend(f"{path.relative_to(built_site)}: {m}"
                     for m in re.findall(r"(?:url\(|@import)\s*['\"]?((?:https?:)?//[^'\")\s]+)", text))
    assert not found, "the site loads from other hosts:\n" + "\n".join(found)


def _page_with(built_site: Path, marker: str) -> Path:
    """The built page of the one source page that holds ``marker``."""
    holders = [p for p in DOCS.rglob("*.md") if marker in p.read_text()]
    assert len(holders) == 1, f"{marker} should be on exactly one page, found on {holders}"
    return built_site / _url(holders[0].relative_to(DOCS).as_posix()) / "index.html"


def test_every_error_code_is_in_the_errors_reference(built_site: Path) -> None:
    from harness.core.errors import ERRORS, EXIT_STATUSES

    codes = [str(kind.code) for kind in ERRORS.values()]
    assert len(codes) > 10
    table = (_page_with(built_site, "<!-- generated: errors -->")).read_text()
    missing = [code for code in codes if code not in _ids(table)]
    assert not missing, f"error codes without their row in the errors table: {missing}"
    mapping = (_page_with(built_site, "<!-- generated: error-mapping -->")).read_text()
    missing = [code for code in codes if f"#{code}" not in mapping]
    assert not missing, f"error codes missing from the door mapping: {missing}"
    statuses = (_page_with(built_site, "<!-- generated: exit-statuses -->")).read_text()
    missing = [str(s.status) for s in EXIT_STATUSES if f"exit-{s.status}" not in _ids(statuses)]
    assert not missing, f"exit statuses missing from the reference: {missing}"


def test_a_broken_link_a_missing_anchor_or_a_page_outside_the_nav_fails_the_build(tmp_path: Path) -> None:
    """The strict settings are what make the real build a check: a small site with the real
    configuration's strictness, theme and extensions (its own nav, no generators or API pages)
    and one of each mistake does not build, and the output names each; without the mistakes
    it builds."""
    import os
    import subprocess
    import sys

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["validation"]["links"]["anchors"] == "warn"
    for generated in ("hooks", "watch", "plugins", "exclude_docs", "extra_css"):
        config.pop(generated, None)
    config["nav"] = ["index.md", "concepts.md", "tools.md"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[Concepts](concepts.md)\n")
    (docs / "tools.md").write_text("# Tools\n\n## Shell\n\n[back](index.md)\n")
    concepts = docs / "concepts.md"

    def build() -> subprocess.CompletedProcess[str]:
        (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                               str(tmp_path / "site")], cwd=tmp_path, capture_output=True, text=True,
                              timeout=240, check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})

    concepts.write_text("# Concepts\n\n[shell](tools.md#shell)\n")
    good = build()
    assert good.returncode == 0, good.stdout + good.stderr
    concepts.write_text(concepts.read_text() + "\n[gone](no-such-page.md) and [lost](tools.md#no-such-anchor)\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    done = build()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "no-such-page.md" in output and "no-such-anchor" in output and "orphan.md" in output, output


def test_every_doctor_check_is_in_the_troubleshooting_page(built_site: Path) -> None:
    from harness.doctor.catalog import CHECKS

    page = (_page_with(built_site, "<!-- generated: doctor-checks -->")).read_text()
    missing = [check.id for check in CHECKS if f"<code>{check.id}</code>" not in page]
    assert not missing, f"doctor checks missing from their table: {missing}"
