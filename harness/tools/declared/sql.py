"""``kind = "sql"``: one SQL statement on a SQLite file or a PostgreSQL server, run from the sandbox.

The statement runs in the sandbox, in ``python3 -I -c SOURCE`` where SOURCE is
:mod:`harness.tools.declared.sql_runner` (argv form, no shell), with the request as JSON on
stdin: the statement, its parameters, the caps, the statement's timeout and, for
PostgreSQL, the password, read on the harness's host just before (never in an argument, the
sandbox's environment or a command line). A PostgreSQL server is reached through the
sandbox's egress proxy (``network = "allowlist"``, the runner tunnels libpq's connection
through ``CONNECT``, so the allowlist and the egress log apply) or directly (``open``).
What the database enforces (one statement, one transaction, read-only unless ``write``, the
statement timeout) is described in the runner's module.

Results: the rows as a text table (``col | col``, ``NULL`` for null) with the row count and,
when a cap cut them, which one and how to narrow the query; a statement without rows shows
its command tag (PostgreSQL's ``INSERT 0 3``) or the rows it changed. The structured
content is ``{columns, types, rows, row_count, truncated, status, affected}`` (``types``:
PostgreSQL's type names; null for SQLite). The database's refusal (a write in a read-only
transaction, a second statement, a syntax error) is ``tool_failed`` with the database's own
words and its SQLSTATE (SQLite's error name); a statement stopped by its timeout is
``timed_out``. The password is taken out of every text the result holds.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool
from harness.core.declared_sql import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, DEFAULT_STATEMENT_TIMEOUT_S
from harness.core.errors import CallboxError
from harness.core.redaction import replacement
from harness.core.registry import Tool
from harness.engine.exec_result import ExecResult
from harness.tools.declared.running import definition_for, run_argv
from harness.tools.shell import NotRan, agent_failure

__all__ = ["RUNNER", "render_table", "sql_tool"]

RUNNER = (Path(__file__).with_name("sql_runner.py")).read_text(encoding="utf-8")
"""The source the sandbox runs (:mod:`harness.tools.declared.sql_runner`)."""
_STDERR_TAIL = 2000
_CELL_LIMIT = 500
"""Characters of one cell the text table shows (the structured rows hold it whole)."""


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text if len(text) <= _CELL_LIMIT else text[:_CELL_LIMIT] + "..."


def render_table(columns: list[str], rows: list[list[Any]]) -> str:
    """``rows`` under ``columns`` as an aligned text table, psql's way."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    lines = [" | ".join(name.ljust(w) for name, w in zip(columns, widths, strict=True)).rstrip(),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _summary(envelope: dict[str, Any], max_rows: int, max_bytes: int) -> str:
    count = envelope["row_count"]
    noun = "row" if count == 1 else "rows"
    if envelope["truncated"] == "max_rows":
        return (f"({count} {noun} shown: the result has more; this tool returns at most {max_rows} rows: "
                "narrow the query with WHERE, LIMIT or aggregates)")
    if envelope["truncated"] == "max_bytes":
        return (f"({count} {noun} shown: the result has more; this tool returns at most {max_bytes} bytes of rows: "
                "select fewer or narrower columns, or fewer rows)")
    return f"({count} {noun})"


def _text(envelope: dict[str, Any], max_rows: int, max_bytes: int) -> str:
    if envelope["columns"]:
        return render_table(envelope["columns"], envelope["rows"]) + "\n" + _summary(envelope, max_rows, max_bytes)
    if envelope.get("status"):
        return str(envelope["status"])
    affected = envelope.get("affected")
    return "OK" if affected is None or affected < 0 else f"OK, {affected} row{'s' if affected != 1 else ''} changed"


def _hide(value: Any, secret: str, stand_in: str) -> Any:
    """``value`` with ``secret`` replaced by ``stand_in`` in every string in it."""
    if isinstance(value, str):
        return value.replace(secret, stand_in)
    if isinstance(value, list):
        return [_hide(v, secret, stand_in) for v in value]
    if isinstance(value, dict):
        return {k: _hide(v, secret, stand_in) for k, v in value.items()}
    return value


def sql_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``kind = "sql"`` table."""
    database = declared.sql_database
    write = bool(declared.write)
    max_rows = declared.max_rows or DEFAULT_MAX_ROWS
    max_bytes = declared.max_bytes or DEFAULT_MAX_BYTES
    argv = ("python3", "-I", "-c", RUNNER)

    def handler(ctx: ToolContext, args: BaseModel) -> ToolOutput:
        given = args.model_dump()
        call_s = ctx.timeout_for(declared.timeout_s)
        statement_s = min(declared.statement_timeout_s or DEFAULT_STATEMENT_TIMEOUT_S, call_s * 0.8)
        request: dict[str, Any] = {"engine": database.engine, "write": write, "query": given["query"],
                                   "params": given.get("params"), "max_rows": max_rows, "max_bytes": max_bytes,
                                   "timeout_ms": max(1, int(statement_s * 1000))}
        password: str | None = None
        if database.engine == "sqlite":
            request["path"] = database.path
        else:
            if declared.password is not None:
                try:
                    password = declared.password.read(declared.name)
                except CallboxError as exc:
                    return ToolOutput(text=f"{declared.name}: {exc.message}", is_error=True,
                                      error=ErrorCode.TOOL_FAILED, structured={"stage": "password"})
            proxy = ctx.runtime().env.get("HTTP_PROXY")
            request.update(host=database.host, port=database.port, dbname=database.dbname, user=database.user,
                           sslmode=database.sslmode, password=password, proxy=proxy or None)
        ran = run_argv(ctx, argv, env={}, timeout_s=declared.timeout_s, stdin=json.dumps(request).encode(),
                       streamed=())
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        output = _output(database.engine, ran.result, max_rows, max_bytes)
        if password:  # the session redacts it too, as it does a [[secret]]: this is for a password set since
            stand_in = replacement(f"secret:{declared.name}.password")
            output = replace(output, text=_hide(output.text, password, stand_in),
                             structured=_hide(output.structured, password, stand_in))
        return output

    # The query is the tool's command: [tools.NAME] command rules match its text.
    return Tool(definition_for(declared, command_field="query"), handler)


def _output(engine: str, result: ExecResult, max_rows: int, max_bytes: int) -> ToolOutput:
    raw = result.stdout.total_bytes + result.stderr.total_bytes
    facts: dict[str, Any] = {"exit_code": result.shell_exit_code, "duration_ms": round(result.duration_ms, 3)}
    stderr = result.stderr.data().decode("utf-8", errors="replace").strip()[-_STDERR_TAIL:]
    if result.timed_out or result.oom_killed:
        what = (f"timed out after {int(result.duration_ms)} milliseconds (the call's timeout)" if result.timed_out
                else "was killed by the out-of-memory killer (sandbox memory limit)")
        return ToolOutput(text=f"the statement's process {what}", is_error=True,
                          error=ErrorCode.TIMED_OUT if result.timed_out else ErrorCode.OOM_KILLED,
                          structured={**facts, "timed_out": result.timed_out, "oom_killed": result.oom_killed},
                          raw_bytes=raw)
    envelope: Any = None
    if result.exit_code == 0 and not result.stdout.truncated:
        try:
            envelope = json.loads(result.stdout.data())
        except ValueError:
            envelope = None
    if not isinstance(envelope, dict):
        return ToolOutput(text=f"the sql tool's process failed (exit code {result.shell_exit_code})"
                          + (f"\nstderr:\n{stderr}" if stderr else ""), is_error=True, error=ErrorCode.TOOL_FAILED,
                          structured=facts, raw_bytes=raw)
    if not envelope.get("ok"):
        name = "SQLite" if engine == "sqlite" else "PostgreSQL"
        state = envelope.get("sqlstate")
        where = {"connect": f"could not connect to {name}", "client": "the sql tool could not run",
                 "transaction": "the transaction failed"}.get(envelope.get("stage", ""),
                                                               f"{name} refused the statement")
        text = f"{where}: {envelope.get('error')}" + (f" ({state})" if state else "")
        timed_out = bool(envelope.get("timed_out"))
        if timed_out:
            text += "; the statement ran past its timeout and was stopped by the database: make it cheaper"
        return ToolOutput(text=text, is_error=True, error=ErrorCode.TIMED_OUT if timed_out else ErrorCode.TOOL_FAILED,
                          structured={"stage": envelope.get("stage"), "error": envelope.get("error"),
                                      "sqlstate": state, "timed_out": timed_out}, raw_bytes=raw)
    structured = {key: envelope.get(key) for key in ("columns", "types", "rows", "row_count", "truncated", "status",
                                                      "affected")}
    return ToolOutput(text=_text(envelope, max_rows, max_bytes), structured=structured, raw_bytes=raw)
