"""``kind = "sql"``: the parts of a declared tool that name a database, and their checks.

A ``kind = "sql"`` table (its handler is :mod:`harness.tools.declared.sql`) takes:

* ``database``: ``sqlite:///PATH`` (an absolute path inside the sandbox, typically in a
  mount) or ``postgresql://USER@HOST[:PORT]/DBNAME`` (``postgres://`` too; port 5432 by
  default; an optional ``?sslmode=MODE``, libpq's modes). A password in the URL is refused:
  the policy file is no place for it.
* ``password``: ``{ env = "VAR" }`` or ``{ file = "/path" }`` on the harness's host
  (PostgreSQL only), read when a call runs and handed to the query's process in the
  sandbox on its stdin (never an argument, an environment variable or a command line), and
  redacted from every result like a ``[[secret]]``. The model, the audit store and the
  logs never see it. A variable that is not set is the call's error, naming it.
* ``write``: ``false`` (default): the database refuses changes (SQLite ``mode=ro`` and
  ``query_only``, a PostgreSQL ``READ ONLY`` transaction). ``true`` commits them.
* ``max_rows`` (default 100), ``max_bytes`` (default 65536): caps of the rows returned;
  ``statement_timeout_s`` (default 10): the statement's own timeout, enforced by the
  database, never longer than the call's timeout allows.

The model's arguments are fixed, not declared: ``query`` (one SQL statement) and ``params``
(values for its placeholders, ``?`` in SQLite, ``$1``, ``$2``, ... in PostgreSQL). Whether a
PostgreSQL server is reachable is checked against ``[sandbox]`` when the registry is built
(:func:`harness.tools.declared.declared_tools`): ``allowlist`` permitting the host and port,
or ``open``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from harness.engine.secrets import read_source

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "DEFAULT_STATEMENT_TIMEOUT_S", "SQL_KEYS", "Database",
           "SqlPassword", "check_sql_table", "parse_database", "sql_input_model"]

DEFAULT_MAX_ROWS = 100
DEFAULT_MAX_BYTES = 65536
DEFAULT_STATEMENT_TIMEOUT_S = 10.0
SQL_KEYS = ("database", "password", "write", "max_rows", "max_bytes", "statement_timeout_s")
"""The keys only a ``kind = "sql"`` table takes."""
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SqlPassword(BaseModel):
    """``password = { env = "VAR" }`` or ``{ file = "/path" }``: where the harness reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    """The environment variable of the harness process (the host) holding the password."""
    file: Path | None = None
    """Or a file on the harness's host holding it (one trailing newline is dropped)."""

    @model_validator(mode="after")
    def _one(self) -> SqlPassword:
        if (self.env is None) == (self.file is None):
            raise ValueError('give exactly one of password = { env = "VARIABLE" } or { file = "/path" }')
        if self.env is not None and _ENV_NAME.fullmatch(self.env) is None:
            raise ValueError(f"password.env {self.env!r} is not an environment variable name (letters, digits, '_')")
        if self.file is not None and not self.file.is_absolute():
            raise ValueError(f"password.file {str(self.file)!r} must be an absolute path on the harness's host")
        return self

    def read(self, tool: str) -> str:
        """The password now; SecretUnavailable naming the source and the fix (never the value)."""
        return read_source(f"the password of the sql tool {tool!r}", self.env, self.file)


@dataclass(frozen=True)
class Database:
    """A parsed ``database`` URL."""

    engine: Literal["sqlite", "postgresql"]
    path: str = ""
    """SQLite: the file inside the sandbox."""
    host: str = ""
    port: int = 5432
    dbname: str = ""
    user: str = ""
    sslmode: str | None = None

    @property
    def target(self) -> str:
        """``HOST:PORT`` as ``allow_hosts`` writes it (IPv6 in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def shown(self) -> str:
        """The database as the tool's description names it."""
        if self.engine == "sqlite":
            return f"the SQLite database {self.path}"
        return f"the PostgreSQL database {self.dbname} on {self.target}"


def parse_database(url: str) -> Database:
    """``database`` as a :class:`Database`; ValueError naming the problem and the fix."""
    form = 'write database = "sqlite:///PATH" or "postgresql://USER@HOST[:PORT]/DBNAME"'
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///") or "?" in url or "#" in url:
            raise ValueError(f"database {url!r}: a SQLite database is sqlite:///ABSOLUTE/PATH (three slashes, "
                             "the path inside the sandbox, no query)")
        path = "/" + posixpath.normpath(unquote(url[len("sqlite:///"):])).lstrip("/")
        if path in ("/", "/.") or "\0" in path:
            raise ValueError(f"database {url!r}: name the database file, e.g. sqlite:///workspace/app.db")
        return Database(engine="sqlite", path=path)
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"database {url!r}: unknown kind of database; {form}")
    if parts.password is not None:
        raise ValueError("database: the URL holds a password; remove it and give it as password = "
                         '{ env = "VARIABLE" } (or { file = "/path" }), read on the harness\'s host')
    try:
        port = parts.port or 5432
    except ValueError:
        raise ValueError(f"database {url!r}: the port is not a number from 1 to 65535") from None
    host, user, dbname = parts.hostname or "", unquote(parts.username or ""), unquote(parts.path.lstrip("/"))
    if not host or not user or not dbname or "/" in dbname or parts.fragment:
        raise ValueError(f"database {url!r}: a PostgreSQL database names its user, host and database; {form}")
    sslmode = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != "sslmode" or value not in _SSLMODES:
            raise ValueError(f"database {url!r}: the only query parameter is sslmode, one of {', '.join(_SSLMODES)}")
        sslmode = value
    return Database(engine="postgresql", host=host, port=port, dbname=dbname, user=user, sslmode=sslmode)


def check_sql_table(*, database: str | None, password: SqlPassword | None, has_arguments: bool, has_env: bool,
                    timeout_s: float | None, statement_timeout_s: float | None) -> Database:
    """The checks of a ``kind = "sql"`` table; ValueError naming the key and the fix."""
    if database is None:
        raise ValueError('a kind = "sql" tool needs database = "sqlite:///PATH" or "postgresql://USER@HOST/DBNAME"')
    parsed = parse_database(database)
    if has_arguments:
        raise ValueError("a sql tool's arguments are fixed (query, and params for its placeholders); remove "
                         "arguments/parameters")
    if has_env:
        raise ValueError("env: a sql tool runs no program of yours; remove env (a password is "
                         'password = { env = "VARIABLE" })')
    if password is not None and parsed.engine == "sqlite":
        raise ValueError("password: a SQLite database has none; remove it")
    if timeout_s is not None and statement_timeout_s is not None and statement_timeout_s >= timeout_s:
        raise ValueError(f"statement_timeout_s ({statement_timeout_s}) must be shorter than timeout_s ({timeout_s}), "
                         "the whole call's, which also connects and sends the rows back")
    return parsed


def sql_input_model(model_name: str, description: str, database: Database) -> type[BaseModel]:
    """The model's arguments of a sql tool: ``query`` and ``params``."""
    style = "?" if database.engine == "sqlite" else "$1, $2 and so on"
    model: type[BaseModel] = create_model(
        model_name, __config__=ConfigDict(extra="forbid"), __doc__=description, __module__=__name__,
        query=(str, Field(description="One SQL statement (no BEGIN/COMMIT: each call is a transaction of its own). "
                                      f"Put values in params and write {style} for them in the statement.")),
        params=(list[str | int | float | bool | None] | None,
                Field(default=None, description=f"Values for the statement's placeholders ({style}), in order.")),
    )
    return model
