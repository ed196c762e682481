"""``kind = "sql"`` declared tools: the table and its load errors, the model's view, the text
table, and the sandbox-side runner on SQLite files (run here, on the host's own sqlite3:
the runner depends on the standard library only).

The PostgreSQL side runs against a real server in tests/integration/test_declared_sql.py.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.core.declared_sql import parse_database
from harness.core.secrets import tool_password_pairs
from harness.tools import registry_for
from harness.tools.declared import sql_runner
from harness.tools.declared.sql import RUNNER, render_table
from tests.support.declared_policies import load, problem

SQLITE_TOOL = """
[[tool]]
name = "shop"
kind = "sql"
database = "sqlite:///data/shop.db"
"""
PG_TOOL = """
[[tool]]
name = "orders"
kind = "sql"
database = "postgresql://reader@db.example.com:6543/orders?sslmode=require"
password = { env = "CALLBOX_TEST_ORDERS_PASSWORD" }
write = true
max_rows = 5
"""
ALLOWLIST = '[sandbox]\nnetwork = "allowlist"\nallow_hosts = ["db.example.com:6543"]\n'


# ---- the table -------------------------------------------------------------------------------------


def test_database_urls_parse() -> None:
    lite = parse_database("sqlite:///workspace/../data/app.db")
    assert (lite.engine, lite.path) == ("sqlite", "/data/app.db")
    pg = parse_database("postgres://app%40corp@db.internal/orders")
    assert (pg.engine, pg.user, pg.host, pg.port, pg.dbname, pg.sslmode) == (
        "postgresql", "app@corp", "db.internal", 5432, "orders", None)
    assert parse_database("postgresql://u@[::1]:5433/d").target == "[::1]:5433"


@pytest.mark.parametrize(("url", "says"), [
    ("sqlite://data/app.db", "sqlite:///ABSOLUTE/PATH"),
    ("sqlite:///", "name the database file"),
    ("sqlite:///a.db?mode=rwc", "no query"),
    ("mysql://u@h/d", "unknown kind of database"),
    ("postgresql://u:secret@h/d", "the URL holds a password; remove it"),
    ("postgresql://h/d", "names its user, host and database"),
    ("postgresql://u@h/", "names its user, host and database"),
    ("postgresql://u@h:99999/d", "the port is not a number"),
    ("postgresql://u@h/d?sslmode=maybe", "the only query parameter is sslmode"),
    ("postgresql://u@h/d?connect_timeout=1", "the only query parameter is sslmode"),
])
def test_a_bad_database_url_is_refused_at_load(url: str, says: str) -> None:
    message = problem(f'[[tool]]\nname = "db"\nkind = "sql"\ndatabase = "{url}"\n')
    assert "tool[0]" in message and says in message
    assert "secret" not in message or "password" in message


@pytest.mark.parametrize(("extra", "says"), [
    ('argv = ["x"]', "key 'argv' is for kind = \"command\" tools"),
    ("[tool.arguments.q]\nrequired = true", "a sql tool's arguments are fixed"),
    ('env = { A = "b" }', "env: a sql tool runs no program of yours"),
    ('password = { env = "PW" }', "a SQLite database has none"),
    ('password = { env = "PW", file = "/pw" }', "exactly one of password"),
    ('password = { file = "pw" }', "must be an absolute path"),
    ("timeout_s = 5\nstatement_timeout_s = 5", "must be shorter than timeout_s"),
    ("max_rows = 0", "max_rows"),
])
def test_a_bad_sql_table_is_refused_at_load(extra: str, says: str) -> None:
    assert says in problem(SQLITE_TOOL + extra + "\n")


def test_a_sql_key_on_another_kind_is_refused() -> None:
    message = problem('[[tool]]\nname = "x"\nkind = "command"\nargv = ["true"]\nwrite = true\n')
    assert "key 'write' is for kind = \"sql\" tools" in message


@pytest.mark.parametrize(("sandbox", "says"), [
    ("", 'sandbox, whose network is "none"; set network = "allowlist" and allow_hosts = ["db.example.com:6543"]'),
    ('[sandbox]\nnetwork = "allowlist"\nallow_hosts = ["db.example.com:5432"]\n',
     'add "db.example.com:6543" to sandbox.allow_hosts'),
])
def test_a_postgresql_server_the_sandbox_cannot_reach_is_refused_at_load(sandbox: str, says: str) -> None:
    assert says in problem(sandbox + PG_TOOL)


def test_the_model_sees_a_query_and_its_params_and_the_annotations_follow_write() -> None:
    registry = registry_for(load('[sandbox]\nnetwork = "open"\n' + SQLITE_TOOL + PG_TOOL))
    shop, orders = registry.get("shop"), registry.get("orders")
    assert shop is not None and orders is not None
    schema = shop.definition.input_model.model_json_schema()
    assert set(schema["properties"]) == {"query", "params"} and schema["required"] == ["query"]
    assert "write ? for them" in schema["properties"]["query"]["description"]
    assert "$1, $2" in orders.definition.input_model.model_json_schema()["properties"]["query"]["description"]
    assert shop.definition.description == ("Run one SQL statement on the SQLite database /data/shop.db "
                                           "(read-only: the database refuses changes).")
    assert "PostgreSQL database orders on db.example.com:6543 (it may change data)" in orders.definition.description
    assert shop.definition.annotations.read_only and not shop.definition.annotations.destructive
    assert not orders.definition.annotations.read_only and orders.definition.annotations.destructive
    assert shop.definition.command_field == "query"  # [tools.shop] command rules match the query
    args = shop.definition.input_model.model_validate({"query": "SELECT ?", "params": ["a", 1, 2.5, True, None]})
    assert args.model_dump()["params"] == ["a", 1, 2.5, True, None]


def test_a_command_rule_can_ask_before_a_write() -> None:
    policy = load(SQLITE_TOOL.replace('kind = "sql"', 'kind = "sql"\nwrite = true') + """
[[tools.shop.rules]]
action = "ask"
command = "regex:(?is)\\\\s*(insert|update|delete)\\\\b.*"
""")
    registry = registry_for(policy)
    tool = registry.get("shop")
    assert tool is not None
    assert policy.decide(tool.definition, {"query": "DELETE FROM items"}).action.value == "ask"
    assert policy.decide(tool.definition, {"query": "SELECT 1"}).action.value == "allow"


def test_the_password_is_redacted_when_it_can_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = load(ALLOWLIST + PG_TOOL)
    monkeypatch.delenv("CALLBOX_TEST_ORDERS_PASSWORD", raising=False)
    assert tool_password_pairs(policy) == []  # not set: the call's error, not the session's
    monkeypatch.setenv("CALLBOX_TEST_ORDERS_PASSWORD", "pw-0123456789")
    assert tool_password_pairs(policy) == [("secret:orders.password", "pw-0123456789")]


def test_rows_render_as_a_text_table() -> None:
    table = render_table(["id", "name", "tags"], [[1, "a\nb", ["x"]], [22, None, True]])
    assert table.splitlines() == [
        "id | name | tags",
        "---+------+------",
        '1  | a\\nb | ["x"]',
        "22 | NULL | true",
    ]


# ---- the runner, on SQLite ----------------------------------------------------------------------


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL, data BLOB)")
        conn.executemany("INSERT INTO items (name, price, data) VALUES (?, ?, ?)",
                         [(f"item{i}", i * 1.5, bytes([i])) for i in range(1, 51)])
    conn.close()
    return path


def run(path: Path, query: str, params: list[Any] | None = None, **fields: Any) -> dict[str, Any]:
    request = {"engine": "sqlite", "path": str(path), "write": False, "query": query, "params": params,
               "max_rows": 100, "max_bytes": 65536, "timeout_ms": 5000, **fields}
    return sql_runner.run(request)


def count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        value: int = conn.execute("SELECT count(*) FROM items").fetchone()[0]
    conn.close()
    return value


def test_a_read_returns_rows_as_json_values(shop: Path) -> None:
    out = run(shop, "SELECT id, name, price, data FROM items WHERE id <= ? ORDER BY id", [2])
    assert out["ok"] and out["columns"] == ["id", "name", "price", "data"]
    assert out["rows"] == [[1, "item1", 1.5, "\\x01"], [2, "item2", 3.0, "\\x02"]]
    assert out["truncated"] is None and out["row_count"] == 2


@pytest.mark.parametrize("query", [
    "INSERT INTO items (name) VALUES ('x')",
    "UPDATE items SET price = 0",
    "DELETE FROM items",
    "DROP TABLE items",
    "CREATE TABLE t (x)",
])
def test_a_write_is_refused_by_sqlite_itself_when_read_only(shop: Path, query: str) -> None:
    out = run(shop, query)
    assert out == {"ok": False, "stage": "statement", "error": "attempt to write a readonly database",
                   "sqlstate": "SQLITE_READONLY", "timed_out": False}
    assert count(shop) == 50


def test_attach_and_turning_query_only_off_are_refused_when_read_only(shop: Path, tmp_path: Path) -> None:
    attach = run(shop, "ATTACH DATABASE ? AS other", [str(tmp_path / "new.db")])
    assert (attach["ok"], attach["error"]) == (False, "not authorized")
    assert not (tmp_path / "new.db").exists()  # ATTACH would have created it
    assert run(shop, "PRAGMA query_only = OFF")["error"] == "not authorized"


def test_write_true_commits(shop: Path) -> None:
    out = run(shop, "UPDATE items SET price = ? WHERE id <= 3", [0], write=True)
    assert out["ok"] and out["affected"] == 3 and out["columns"] == [] and out["status"] is None
    returning = run(shop, "DELETE FROM items WHERE id > 40 RETURNING id", write=True, max_rows=2)
    assert returning["rows"] == [[41], [42]] and returning["truncated"] == "max_rows"
    assert count(shop) == 40  # every row went, though two came back


@pytest.mark.parametrize("query", [
    "SELECT 1; DELETE FROM items",
    "SELECT ';'; DELETE FROM items",
    "SELECT 1 /* ; */; DELETE FROM items",
    "SELECT 1 -- \n; DELETE FROM items",
])
def test_a_second_statement_is_refused_and_nothing_runs(shop: Path, query: str) -> None:
    out = run(shop, query, write=True)
    assert out["ok"] is False and out["error"] == "You can only execute one statement at a time."
    assert count(shop) == 50


@pytest.mark.parametrize("query", ["COMMIT", "ROLLBACK", "END"])
def test_a_statement_that_ends_the_transaction_is_an_error(shop: Path, query: str) -> None:
    out = run(shop, query, write=True)
    assert out["stage"] == "transaction" and "ended the tool's transaction" in out["error"]


def test_begin_inside_the_transaction_is_refused_by_sqlite(shop: Path) -> None:
    assert run(shop, "BEGIN")["error"] == "cannot start a transaction within a transaction"


def test_a_parameter_is_a_value_never_sql(shop: Path) -> None:
    evil = "x'); DELETE FROM items; --"
    assert run(shop, "SELECT count(*) FROM items WHERE name = ?", ["item1' OR '1'='1"])["rows"] == [[0]]
    out = run(shop, "INSERT INTO items (name) VALUES (?) RETURNING name", [evil], write=True)
    assert out["rows"] == [[evil]] and count(shop) == 51


def test_the_row_and_byte_caps_hold(shop: Path) -> None:
    rows = run(shop, "SELECT id FROM items", max_rows=7)
    assert rows["row_count"] == 7 and rows["truncated"] == "max_rows"
    wide = run(shop, "SELECT id, printf('%.200c', 'x') FROM items", max_bytes=1024)
    assert wide["truncated"] == "max_bytes" and 0 < wide["row_count"] < 10
    assert len(json.dumps(wide["rows"])) <= 1024


def test_the_statement_timeout_interrupts_sqlite(shop: Path) -> None:
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    out = run(shop, endless, timeout_ms=200)
    assert out == {"ok": False, "stage": "statement", "error": "interrupted", "sqlstate": "SQLITE_INTERRUPT",
                   "timed_out": True}


def test_a_missing_file_is_not_created(tmp_path: Path) -> None:
    for write in (False, True):
        out = run(tmp_path / "none.db", "SELECT 1", write=write)
        assert out["stage"] == "connect" and "unable to open database file" in out["error"]
    assert not (tmp_path / "none.db").exists()


def test_the_runner_source_runs_as_a_script_and_keeps_stdout_for_its_envelope(shop: Path) -> None:
    request = {"engine": "sqlite", "path": str(shop), "write": False, "query": "SELECT name FROM items LIMIT 1",
               "params": None, "max_rows": 5, "max_bytes": 4096, "timeout_ms": 5000}
    done = subprocess.run([sys.executable, "-I", "-c", RUNNER], input=json.dumps(request).encode(),
                          capture_output=True, timeout=60, check=True, env={"PATH": os.environ["PATH"]})
    assert json.loads(done.stdout)["rows"] == [["item1"]]


def test_postgresql_without_its_client_library_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg.pq", None)  # import fails as in an image without it
    out = sql_runner.run({"engine": "postgresql", "write": False, "query": "SELECT 1", "params": None,
                          "max_rows": 1, "max_bytes": 1024, "timeout_ms": 1000})
    assert out["stage"] == "client" and "python3-psycopg" in out["error"]


# ---- the runner's tunnel through the egress proxy --------------------------------------------------


class FakeProxy:
    """A local stand-in for the egress proxy: it answers each CONNECT with ``status`` and,
    after a 200, echoes what it receives; it records the targets asked for."""

    def __init__(self, status: str, body: bytes = b"") -> None:
        self.status, self.body = status, body
        self.targets: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            self.targets.append(head.split(b" ")[1].decode())
            conn.sendall(f"HTTP/1.1 {self.status}\r\nContent-Length: {len(self.body)}\r\n\r\n".encode() + self.body)
            while self.status.startswith("200") and (data := conn.recv(4096)):
                conn.sendall(data)


def test_a_refusal_by_the_proxy_is_reported_in_its_words() -> None:
    proxy = FakeProxy("403 Forbidden", b"callbox egress proxy refused db.example.com:5432: not allowed")
    with pytest.raises(sql_runner.Failure) as info:
        sql_runner.Relay(proxy.url, "db.example.com", 5432, 5.0)
    assert info.value.envelope["stage"] == "connect"
    assert info.value.envelope["error"] == ("the egress proxy refused db.example.com:5432: HTTP/1.1 403 Forbidden: "
                                            "callbox egress proxy refused db.example.com:5432: not allowed")


def test_each_connection_to_the_relay_is_a_tunnel_of_its_own() -> None:
    proxy = FakeProxy("200 Connection established")
    relay = sql_runner.Relay(proxy.url, "2001:db8::5", 6543, 5.0)
    for word in (b"first", b"second"):
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as client:
            client.sendall(word)
            assert client.recv(100) == word
    assert proxy.targets == ["[2001:db8::5]:6543", "[2001:db8::5]:6543"]


def test_the_byte_cap_counts_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "wide.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (s TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("é" * 100,)] * 20)  # 200 bytes, 100 characters each
    conn.close()
    out = run(path, "SELECT s FROM t", max_bytes=1024)
    assert out["truncated"] == "max_bytes" and out["row_count"] == 4  # each row is 205 bytes: 5 would be 1025
    assert len(json.dumps(out["rows"], ensure_ascii=False).encode()) <= 1024
