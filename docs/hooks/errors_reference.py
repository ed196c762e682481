"""The error references, read from the one error table in :mod:`harness.core.errors`.

That module holds ``ERRORS`` (one ``ErrorKind`` per stable error code, keyed by it: what it
means, whether the same request may succeed if sent again, what to do about it, and how each
door reports it) and ``EXIT_STATUSES`` (the CLI's exit statuses). Three sections come from them:

* ``errors``: code, meaning, retry safe, fix; each code anchored at itself (``#sandbox_not_found``);
* ``error-mapping``: each code as the CLI, the gRPC door, the E2B door and the console, and
  the MCP door report it, the code linking to its row of the ``errors`` table;
* ``exit-statuses``: each exit status and its meaning, anchored at ``#exit-N``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from docs.hooks.text import cell, code, table


class ErrorKindLike(Protocol):
    """The fields of ``harness.core.errors.ErrorKind`` the references read."""

    code: str
    meaning: str
    retry: bool
    fix: str
    exit_status: int
    grpc_status: str
    grpc_reason: str
    http_status: int
    mcp: str


class ExitStatusLike(Protocol):
    status: int
    meaning: str


class ErrorTableMissing(Exception):
    """The errors module has no ``ERRORS`` or ``EXIT_STATUSES`` table."""


def _table(module: ModuleType, name: str) -> tuple[Any, ...]:
    """The rows of ``module.name``: a tuple of rows, or a mapping whose values are the rows
    (``ERRORS`` is keyed by code), in their order."""
    value = getattr(module, name, None)
    if isinstance(value, Mapping):
        value = tuple(value.values())
    if not isinstance(value, tuple) or not value:
        raise ErrorTableMissing(f"{module.__name__} has no {name} table (rows in a tuple or a mapping) to document")
    return value


def errors_of(module: ModuleType) -> tuple[ErrorKindLike, ...]:
    return _table(module, "ERRORS")


def exit_statuses_of(module: ModuleType) -> tuple[ExitStatusLike, ...]:
    return _table(module, "EXIT_STATUSES")


def render_errors(errors: tuple[ErrorKindLike, ...]) -> str:
    rows = [(f'<a id="{e.code}"></a>{code(e.code)}', cell(e.meaning), "yes" if e.retry else "no", cell(e.fix))
            for e in errors]
    return table(("code", "meaning", "retry safe", "fix"), rows) + "\n"


def render_mapping(errors: tuple[ErrorKindLike, ...], *, errors_page: str) -> str:
    """``errors_page`` is the path from the page being built to the page with the ``errors``
    table (``../troubleshooting.md``), or ``""`` for the same page."""
    rows = [(f"[{code(e.code)}]({errors_page}#{e.code})", str(e.exit_status), _grpc(e), str(e.http_status),
             cell(e.mcp)) for e in errors]
    return table(("code", "CLI exit status", "gRPC status / reason", "HTTP status (E2B door, console)", "MCP"),
                 rows) + "\n"


def _grpc(error: ErrorKindLike) -> str:
    """The gRPC status and reason; a code only ever carried by a tool call's result has none
    (the RPC succeeds and its result says it)."""
    if not error.grpc_status:
        return "none: in the call's result"
    if not error.grpc_reason:
        return code(error.grpc_status)
    return f"{code(error.grpc_status)} / {code(error.grpc_reason)}"


def render_exit_statuses(statuses: tuple[ExitStatusLike, ...]) -> str:
    rows = [(f'<a id="exit-{s.status}"></a>{code(str(s.status))}', cell(s.meaning)) for s in statuses]
    return table(("exit status", "meaning"), rows) + "\n"


def _module() -> ModuleType:
    import harness.core.errors

    return harness.core.errors


def generate_errors() -> str:
    return render_errors(errors_of(_module()))


def generate_mapping(errors_page: str) -> str:
    return render_mapping(errors_of(_module()), errors_page=errors_page)


def generate_exit_statuses() -> str:
    return render_exit_statuses(exit_statuses_of(_module()))
