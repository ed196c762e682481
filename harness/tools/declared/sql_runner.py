"""The sandbox side of ``kind = "sql"``: one statement on one database, in one transaction.

This module's source is what the handler (:mod:`harness.tools.declared.sql`) runs in the
sandbox as ``python3 -I -c SOURCE`` (argv form, no shell; ``-I``: nothing the model wrote in
the working directory or ``PYTHON*`` variables is imported), with a JSON request on stdin
and one JSON envelope on the original stdout. It depends on the standard library only,
and for PostgreSQL on ``psycopg.pq`` (Debian's ``python3-psycopg``: libpq through ctypes),
imported when a PostgreSQL request arrives. The host imports it for nothing but its source
(and the unit tests, which run it on the host).

The request: ``engine`` (``sqlite`` or ``postgresql``), ``write``, ``query``, ``params``,
``max_rows``, ``max_bytes``, ``timeout_ms`` (the statement's), and per engine ``path``
(SQLite) or ``host``, ``port``, ``dbname``, ``user``, ``password``, ``sslmode``, ``proxy``
(PostgreSQL; ``proxy`` is the sandbox's egress proxy or null).

What the database itself enforces:

* **one statement**: SQLite through :meth:`sqlite3.Connection.execute`, which refuses a
  second one ("You can only execute one statement at a time."); PostgreSQL through the
  extended query protocol (``PQsendQueryParams``), whose Parse message takes exactly one
  statement ("cannot insert multiple commands into a prepared statement"). No text is
  parsed here, so quotes, comments or dollar quoting cannot fool a check. Parameters are
  sent apart from the statement (``?`` in SQLite, ``$1`` in PostgreSQL), never spliced in.
* **one transaction**: the runner opens it (``BEGIN``; ``BEGIN READ ONLY`` in PostgreSQL),
  runs the statement, and ends it itself: ``COMMIT`` when ``write`` and all went well, else
  ``ROLLBACK``. A statement that ends the transaction itself (``COMMIT``, ``ROLLBACK``) is
  an error, reported as such; nothing else runs after it.
* **read-only** unless ``write``: SQLite opened with ``mode=ro`` and ``PRAGMA query_only``,
  and an authorizer that refuses ``ATTACH`` (which would create a file) and turning
  ``query_only`` off; PostgreSQL in a ``READ ONLY`` transaction, whose refusal of a write is
  the server's own ("cannot execute INSERT in a read-only transaction").
* **a statement timeout**: SQLite's progress handler interrupts the statement past its
  deadline ("interrupted"); PostgreSQL's ``statement_timeout`` is set when the connection
  starts ("canceling statement due to statement timeout").

Caps: at most ``max_rows`` rows and ``max_bytes`` bytes of rows (each row counted as its
JSON text in UTF-8) come back; the envelope says which cap cut the result. PostgreSQL rows arrive
one by one (single-row mode), so a huge result is never held in memory; a read-only
statement is abandoned (its connection closed) once a cap is reached, a writing one is read
to its end (its rows dropped) so that it completes before ``COMMIT``.

Values: JSON scalars as they are; a blob or ``bytea`` as ``\\x`` and hex digits; a float
that JSON cannot hold (NaN, infinities) and PostgreSQL's ``numeric`` as text; PostgreSQL
``json``/``jsonb`` as JSON; any other PostgreSQL type as its text form.

The envelope: ``{"ok": true, "columns", "types", "rows", "row_count", "truncated":
null|"max_rows"|"max_bytes", "status", "affected"}`` (``types`` and ``status``, the command
tag such as ``INSERT 0 3``, are PostgreSQL's; null for SQLite) or ``{"ok": false, "stage":
"connect"|"statement"|"transaction"|"client", "error", "sqlstate", "timed_out"}``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import sys
import threading
import time
import urllib.parse
from typing import Any

JSON_TYPES = {16: "bool", 20: "int", 21: "int", 23: "int", 26: "int", 700: "float", 701: "float", 114: "json",
              3802: "json"}
"""PostgreSQL type OIDs whose text form is turned into a JSON value (the rest stay text)."""
PG_TYPE_NAMES = {16: "bool", 17: "bytea", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid", 114: "json",
                 700: "float4", 701: "float8", 1042: "bpchar", 1043: "varchar", 1082: "date", 1114: "timestamp",
                 1184: "timestamptz", 1700: "numeric", 2950: "uuid", 3802: "jsonb"}
"""Names of the common PostgreSQL types, for ``types``; any other is ``oid:N``."""


class Failure(Exception):
    """Why the request failed, as the envelope says it."""

    def __init__(self, stage: str, error: str, sqlstate: str | None = None, timed_out: bool = False) -> None:
        super().__init__(error)
        self.envelope = {"ok": False, "stage": stage, "error": error, "sqlstate": sqlstate, "timed_out": timed_out}


class Rows:
    """The rows kept, within ``max_rows`` and ``max_bytes``."""

    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.rows: list[list[Any]] = []
        self.size = 0
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.truncated: str | None = None

    def add(self, row: list[Any]) -> bool:
        """Keep ``row`` if it fits; False once a cap is reached (the row is not kept)."""
        if self.truncated is not None:
            return False
        if len(self.rows) >= self.max_rows:
            self.truncated = "max_rows"
            return False
        size = len(json.dumps(row, ensure_ascii=False).encode()) + 1
        if self.size + size > self.max_bytes:
            self.truncated = "max_bytes"
            return False
        self.rows.append(row)
        self.size += size
        return True


def json_value(value: Any) -> Any:
    """A SQLite value as JSON can hold it."""
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def pg_value(text: bytes | None, oid: int) -> Any:
    """A PostgreSQL value in text form as JSON (see :data:`JSON_TYPES`)."""
    if text is None:
        return None
    value = text.decode("utf-8", "replace")
    kind = JSON_TYPES.get(oid)
    if kind == "bool":
        return value == "t"
    if kind == "int":
        return int(value)
    if kind == "float":
        number = float(value)
        return number if math.isfinite(number) else value
    if kind == "json":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _ok(columns: list[str], types: list[str] | None, rows: Rows, status: str | None,
        affected: int | None) -> dict[str, Any]:
    return {"ok": True, "columns": columns, "types": types, "rows": rows.rows, "row_count": len(rows.rows),
            "truncated": rows.truncated, "status": status, "affected": affected}


# ---- SQLite ---------------------------------------------------------------------------------------


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    """Read-only connections: no ATTACH (it creates the file it names), no turning query_only off."""
    if action == sqlite3.SQLITE_ATTACH:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() == "query_only" and arg2 is not None:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def run_sqlite(request: dict[str, Any]) -> dict[str, Any]:
    """The request on the SQLite file ``path``."""
    write = bool(request["write"])
    timeout_s = request["timeout_ms"] / 1000
    uri = "file:" + urllib.parse.quote(request["path"]) + ("?mode=rw" if write else "?mode=ro")
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout_s)
    except sqlite3.Error as exc:
        raise Failure("connect", f"{exc} ({request['path']})", getattr(exc, "sqlite_errorname", None)) from None
    deadline = time.monotonic() + timeout_s
    try:
        if not write:
            conn.execute("PRAGMA query_only = ON")
            conn.set_authorizer(_sqlite_authorizer)
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
        conn.execute("BEGIN")
        rows = Rows(request["max_rows"], request["max_bytes"])
        try:
            cursor = conn.execute(request["query"], request["params"] or ())
            columns = [d[0] for d in cursor.description or ()]
            while columns and not rows.truncated:
                batch = cursor.fetchmany(256)
                if not batch:
                    break
                for row in batch:
                    if not rows.add([json_value(v) for v in row]):
                        break
            affected = cursor.rowcount if cursor.rowcount >= 0 else None
            cursor.close()
        except sqlite3.Error as exc:
            timed_out = str(exc) == "interrupted" and time.monotonic() > deadline
            raise Failure("statement", str(exc), getattr(exc, "sqlite_errorname", None), timed_out) from None
        if not conn.in_transaction:
            raise Failure("transaction", "the statement ended the tool's transaction; send one statement without "
                          "BEGIN, COMMIT or ROLLBACK: the tool opens and ends the transaction itself")
        try:
            conn.execute("COMMIT" if write else "ROLLBACK")
        except sqlite3.Error as exc:
            raise Failure("transaction", str(exc), getattr(exc, "sqlite_errorname", None)) from None
        return _ok(columns, None, rows, None, affected if not columns else None)
    finally:
        conn.close()


# ---- PostgreSQL -----------------------------------------------------------------------------------


class Relay:
    """A local port whose connections reach ``target`` through the egress proxy's CONNECT.

    libpq cannot speak to an HTTP proxy: it connects to this port instead, each connection
    tunnelled on its own. The first tunnel is opened before libpq starts, so a refusal by the
    proxy is reported in the proxy's words rather than as a closed connection."""

    def __init__(self, proxy: str, host: str, port: int, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(proxy)
        if parts.hostname is None:
            raise Failure("connect", f"the sandbox's proxy address {proxy!r} is not a URL")
        self.proxy = (parts.hostname, parts.port or 80)
        self.target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.timeout_s = timeout_s
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.first: socket.socket | None = self.tunnel()
        threading.Thread(target=self._serve, daemon=True).start()

    def tunnel(self) -> socket.socket:
        """A connection to the target through the proxy; Failure with the proxy's answer."""
        try:
            upstream = socket.create_connection(self.proxy, timeout=self.timeout_s)
            upstream.sendall(f"CONNECT {self.target} HTTP/1.1\r\nHost: {self.target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = upstream.recv(4096)
                if not chunk or len(head) > 65536:
                    raise Failure("connect", f"the egress proxy closed the connection to {self.target}")
                head += chunk
        except OSError as exc:
            raise Failure("connect", f"cannot reach the sandbox's egress proxy: {exc}") from None
        head, _, rest = head.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if status.split(" ")[1:2] != ["200"]:
            body = rest.decode("utf-8", "replace").strip()
            refused = f"the egress proxy refused {self.target}: {status}"
            raise Failure("connect", refused + (f": {body}" if body else ""))
        upstream.settimeout(None)
        return upstream

    def _serve(self) -> None:
        while True:
            client, _ = self.listener.accept()
            upstream, self.first = self.first, None
            try:
                upstream = upstream or self.tunnel()
            except Failure:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _conninfo(values: dict[str, str]) -> bytes:
    """libpq's ``key='value'`` form, quoting each value (backslash and quote escaped)."""
    def quote(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return " ".join(f"{key}={quote(value)}" for key, value in values.items()).encode()


def _pg_param(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return b"true" if value else b"false"
    return str(value).encode()


def _pg_error(result: Any, pq: Any) -> tuple[str, str | None]:
    message = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
    sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
    text = (message or result.error_message or b"").decode("utf-8", "replace").strip()
    return text, sqlstate.decode() if sqlstate else None


def run_postgresql(request: dict[str, Any]) -> dict[str, Any]:
    """The request on the PostgreSQL server ``host``:``port``."""
    try:
        import importlib

        pq: Any = importlib.import_module("psycopg.pq")
    except ImportError:
        raise Failure("client", "the sandbox image has no PostgreSQL client (Debian's python3-psycopg and libpq5): "
                      "use callbox's image (`callbox image build`) or add python3-psycopg to yours") from None
    write = bool(request["write"])
    timeout_ms = int(request["timeout_ms"])
    # passfile: a path that cannot exist, so libpq never reads a ~/.pgpass the model wrote
    values = {"dbname": request["dbname"], "user": request["user"], "application_name": "callbox-sql",
              "connect_timeout": str(max(2, timeout_ms // 1000)), "options": f"-c statement_timeout={timeout_ms}",
              "sslmode": request.get("sslmode") or "prefer", "passfile": "/nonexistent/.pgpass"}
    if request.get("password") is not None:
        values["password"] = request["password"]
    if request.get("proxy"):
        relay = Relay(request["proxy"], request["host"], int(request["port"]), max(2.0, timeout_ms / 1000))
        values.update(host=request["host"], hostaddr="127.0.0.1", port=str(relay.port))
    else:
        values.update(host=request["host"], port=str(request["port"]))
    conn = pq.PGconn.connect(_conninfo(values))
    try:
        if conn.status != pq.ConnStatus.OK:
            raise Failure("connect", conn.error_message.decode("utf-8", "replace").strip())
        begun = conn.exec_(b"BEGIN READ WRITE" if write else b"BEGIN READ ONLY")
        if begun.status != pq.ExecStatus.COMMAND_OK:
            raise Failure("transaction", *_pg_error(begun, pq))
        return _pg_statement(conn, pq, request, write)
    finally:
        conn.finish()


def _pg_statement(conn: Any, pq: Any, request: dict[str, Any], write: bool) -> dict[str, Any]:
    params = [_pg_param(v) for v in request["params"] or ()]
    conn.send_query_params(request["query"].encode(), params, result_format=0)
    conn.set_single_row_mode()
    rows = Rows(request["max_rows"], request["max_bytes"])
    columns: list[str] = []
    oids: list[int] = []
    status, affected = "", None
    failure: Failure | None = None
    while (result := conn.get_result()) is not None:
        state = result.status
        if state in (pq.ExecStatus.SINGLE_TUPLE, pq.ExecStatus.TUPLES_OK) and not columns:
            columns = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
            oids = [result.ftype(i) for i in range(result.nfields)]
        if state == pq.ExecStatus.SINGLE_TUPLE:
            if not rows.add([pg_value(result.get_value(0, i), oids[i]) for i in range(result.nfields)]) and not write:
                break  # read-only: the rest is abandoned with the connection
        elif state in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            status = (result.command_status or b"").decode()
            tuples = result.command_tuples
            affected = tuples if tuples is not None and not status.startswith("SELECT") else None
        elif state in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
            raise Failure("statement", "COPY to or from the client is not supported by this tool; use SELECT, "
                          "INSERT or COPY to a server file")
        elif state == pq.ExecStatus.FATAL_ERROR:
            text, sqlstate = _pg_error(result, pq)
            failure = Failure("statement", text, sqlstate, timed_out=sqlstate == "57014")
    if failure is not None:
        raise failure
    if rows.truncated and not write:
        return _ok(columns, [PG_TYPE_NAMES.get(o, f"oid:{o}") for o in oids], rows, "SELECT", None)
    if conn.transaction_status != pq.TransactionStatus.INTRANS:
        raise Failure("transaction", "the statement ended the tool's transaction; send one statement without "
                      "BEGIN, COMMIT or ROLLBACK: the tool opens and ends the transaction itself")
    ended = conn.exec_(b"COMMIT" if write else b"ROLLBACK")
    if ended.status != pq.ExecStatus.COMMAND_OK:
        raise Failure("transaction", *_pg_error(ended, pq))
    return _ok(columns, [PG_TYPE_NAMES.get(o, f"oid:{o}") for o in oids], rows, status, affected)


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The envelope of one request."""
    try:
        if request["engine"] == "sqlite":
            return run_sqlite(request)
        return run_postgresql(request)
    except Failure as failure:
        return failure.envelope


def main() -> None:
    """Read the request from stdin, write the envelope to the original stdout; whatever else
    writes to fd 1 meanwhile (a library, libpq's notices) goes to stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    request = json.loads(sys.stdin.buffer.read())
    try:
        envelope = run(request)
    except Exception as exc:  # a bug here, reported rather than a traceback on stdout
        envelope = {"ok": False, "stage": "client", "error": f"{type(exc).__name__}: {exc}", "sqlstate": None,
                    "timed_out": False}
    out.write(json.dumps(envelope, ensure_ascii=False, allow_nan=False))
    out.flush()


if __name__ == "__main__":
    main()
