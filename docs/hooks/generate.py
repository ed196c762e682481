"""The MkDocs hook (``hooks:`` in mkdocs.yml) that fills the generated sections of the pages.

A page asks for a section with a marker line, ``<!-- generated: NAME -->`` alone on its line
(:mod:`docs.hooks.markers`); the build replaces it with what the generator NAME returns:

==================  ========================================================================
``cli``             every ``callbox`` command and its options (:mod:`docs.hooks.cli_reference`)
``policy``          every key of a policy file (:mod:`docs.hooks.model_reference`)
``config``          every key of a server configuration file (the same)
``errors``          every error code, what it means, retry, fix (:mod:`docs.hooks.errors_reference`)
``error-mapping``   every error code as each door reports it (links to the ``errors`` table)
``exit-statuses``   the CLI's exit statuses
``bench-table``     ``docs/bench-results.json`` as a table (:mod:`docs.hooks.bench_reference`)
``bench-chart``     the same as an SVG chart (:mod:`docs.hooks.bench_chart`)
``doctor-checks``   every check of ``callbox doctor`` (``harness.doctor.catalog.markdown``)
==================  ========================================================================

An unknown marker, a malformed one, or a generator that cannot run (a field without a
docstring, a missing results file) fails the build with a message naming the page.
"""

from __future__ import annotations

import posixpath
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# MkDocs loads this file by its path; the generators are imported as the package
# ``docs.hooks`` from the repository's top directory.
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from mkdocs.exceptions import PluginError  # noqa: E402

from docs.hooks import bench_chart, bench_reference, cli_reference, errors_reference, model_reference  # noqa: E402
from docs.hooks.markers import MarkerError, expand, markers  # noqa: E402

_pages_with: dict[str, list[str]] = {}
"""Generator name -> the pages (source paths) whose markers ask for it, found in ``on_files``."""


def generators(page: str, docs_dir: Path) -> dict[str, Callable[[], str]]:
    """The generators as ``page`` (its path under the docs directory) calls them."""

    def mapping() -> str:
        holders = _pages_with.get("errors", [])
        if len(holders) != 1:
            raise MarkerError(f"{page}: error-mapping links each code to the errors table, which must be on "
                              f"exactly one page (<!-- generated: errors --> is on {len(holders)})")
        target = posixpath.relpath(holders[0], posixpath.dirname(page) or ".")
        return errors_reference.generate_mapping("" if holders[0] == page else target)

    return {
        "cli": cli_reference.generate,
        "policy": model_reference.generate_policy,
        "config": model_reference.generate_config,
        "errors": errors_reference.generate_errors,
        "error-mapping": mapping,
        "exit-statuses": errors_reference.generate_exit_statuses,
        "bench-table": lambda: bench_reference.generate_table(docs_dir),
        "bench-chart": lambda: bench_chart.generate(docs_dir),
        "doctor-checks": doctor_checks,
    }


def doctor_checks() -> str:
    """The doctor's catalog, as the catalog itself renders it for the documentation."""
    from harness.doctor.catalog import markdown

    return f'<div class="callbox-ref" markdown>\n\n{markdown()}\n\n</div>\n'


NAMES = tuple(generators("", Path(".")))
"""Every generator a marker may name."""

_FAILURES = (MarkerError, model_reference.MissingDocstrings, errors_reference.ErrorTableMissing,
             bench_reference.BenchResultsError)


def on_files(files: Any, *, config: Any) -> Any:
    """Find every page's markers before any page is built (a cross-page link needs them)."""
    _pages_with.clear()
    for file in files.documentation_pages():
        try:
            found = markers(file.content_string)
        except MarkerError as exc:
            raise PluginError(f"{file.src_uri}: {exc}") from None
        for _, name in found:
            if name not in NAMES:
                raise PluginError(f"{file.src_uri}: no generator is named {name!r} (known: {', '.join(NAMES)})")
            _pages_with.setdefault(name, []).append(file.src_uri)
    return files


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    try:
        return expand(markdown, generators(src, Path(config["docs_dir"])), page=src)
    except _FAILURES as exc:
        raise PluginError(str(exc)) from None
