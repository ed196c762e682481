"""``kind = "sql"`` declared tools end to end: a SQLite file in a mount and a real PostgreSQL
server, both queried from one real sandbox (one per module, as are the server and its data).

The server is Debian's ``postgresql`` (``make postgresql``), started with ``initdb`` in a
temporary directory inside the network namespace of the ``destination`` fixture
(tests/netdest.py), listening on the destination's address only with password (SCRAM)
authentication. The sandbox reaches it as ``dest.callbox.test:5432`` through its egress
proxy (``network = "allowlist"``), which the test-only override of ``net_engine`` lets
reach that network. The checks: reads work; a write is refused by the database itself when
the tool is read-only, in the database's words; ``write = true`` commits; the row and byte
caps and the statement timeout hold; an injection through the model's arguments stays
within one statement and one transaction (the data is checked afterwards with ``psql`` on
the server's own socket); the password reaches neither the result nor the audit store.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.spec import HostLimits
from harness.tools import registry_for
from tests.conftest import IMAGE, unavailable

pytestmark = pytest.mark.docker

PASSWORD_VAR = "CALLBOX_TEST_SQL_PASSWORD"
PASSWORD = "pg-" + os.urandom(12).hex()
SCHEMA = """
CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL, price numeric(8,2), tags jsonb, seen boolean);
INSERT INTO items (name, price, tags, seen)
    SELECT 'item' || i, i * 1.25, jsonb_build_array('t' || i), i % 2 = 0 FROM generate_series(1, 40) AS i;
"""


def _server_binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        unavailable("Debian's postgresql is not installed (run `make postgresql`)")
    return found[-1]


class Postgres:
    """A PostgreSQL server in the destination's namespace, and psql on its own socket."""

    def __init__(self, namespace: str, address: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="callbox-pg-"))
        self.dir.chmod(0o755)
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.run(_server_binary("initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--no-sync",
                 "--auth-local=trust", "--auth-host=scram-sha-256")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 scram-sha-256\n")
        self.server = subprocess.Popen(
            # setpriv executes the server in its place (runuser would stay its parent, deaf to SIGINT)
            ["ip", "netns", "exec", namespace, "setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
             _server_binary("postgres"),
             "-D", str(self.data), "-k", str(self.dir), "-p", "5432", "-c", f"listen_addresses={address}",
             "-c", "fsync=off", "-c", "logging_collector=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.server.stderr is not None
        self.log: list[str] = []
        for line in self.server.stderr:  # blocks until the server says it is ready (or exits)
            self.log.append(line)
            if "database system is ready to accept connections" in line:
                break
        else:
            raise RuntimeError("PostgreSQL did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.server.stderr is not None
        for line in self.server.stderr:
            self.log.append(line)

    def run(self, *argv: str) -> str:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, timeout=120,
                              cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def psql(self, sql: str, db: str = "app", user: str = "agent") -> str:
        """``sql`` run on the server's socket (trusted: no password), its rows as text."""
        return self.run(_server_binary("psql"), "-h", str(self.dir), "-p", "5432", "-U", user, "-d", db, "-XAtq",
                        "-v", "ON_ERROR_STOP=1", "-c", sql).strip()

    def close(self) -> None:
        if self.server.poll() is None:
            self.server.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres(destination: Any) -> Iterator[Postgres]:
    server = Postgres(destination.namespace, destination.address)
    try:
        server.psql(f"CREATE ROLE agent LOGIN PASSWORD '{PASSWORD}'", db="postgres", user="postgres")
        server.psql("CREATE DATABASE app OWNER agent", db="postgres", user="postgres")
        server.psql(SCHEMA)
        yield server
    finally:
        server.close()


POLICY = """
[sandbox]
image = "{image}"
network = "allowlist"
allow_hosts = ["dest.callbox.test:5432"]

[[sandbox.mounts]]
source = "{data}"
target = "/data"
mode = "rw"

[[tool]]
name = "shop"
kind = "sql"
database = "sqlite:///data/shop.db"
max_rows = 5

[[tool]]
name = "shop_admin"
kind = "sql"
database = "sqlite:///data/shop.db"
write = true

[[tool]]
name = "pg"
kind = "sql"
database = "postgresql://agent@dest.callbox.test/app"
password = {{ env = "{var}" }}
max_rows = 10
max_bytes = 2048
statement_timeout_s = 1

[[tool]]
name = "pg_admin"
kind = "sql"
database = "postgresql://agent@dest.callbox.test:5432/app"
password = {{ env = "{var}" }}
write = true

[[tool]]
name = "pg_wrong_password"
kind = "sql"
database = "postgresql://agent@dest.callbox.test/app"
password = {{ file = "{wrong}" }}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's directory: data/shop.db (mounted at /data), the policy, the audit store."""
    root = tmp_path_factory.mktemp("sql")
    data = root / "data"
    data.mkdir()
    with sqlite3.connect(data / "shop.db") as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
        conn.executemany("INSERT INTO items (name, price) VALUES (?, ?)", [(f"item{i}", i * 1.5) for i in range(1, 21)])
    conn.close()
    for path in (data, data / "shop.db"):
        os.chown(path, 1000, 1000)  # the sandbox's user may write the file and its journal
    (root / "wrong").write_text("not-the-password\n")
    (root / "policy.toml").write_text(POLICY.format(image=IMAGE, data=data, var=PASSWORD_VAR, wrong=root / "wrong"))
    return root


@pytest.fixture(scope="module")
def session(net_engine: Any, postgres: Postgres, root: Path) -> Iterator[Session]:
    saved = os.environ.get(PASSWORD_VAR)
    os.environ[PASSWORD_VAR] = PASSWORD
    policy = parse_policy((root / "policy.toml").read_text(), source=str(root / "policy.toml"), base_dir=root,
                          host=HostLimits(cpus=None, memory=None))
    audit = AuditStore(root / "audit.sqlite3")
    harness = Session(registry_for(policy), policy, audit, engine_factory=lambda: net_engine)
    try:
        yield harness
    finally:
        harness.close()
        audit.close()
        if saved is None:
            os.environ.pop(PASSWORD_VAR, None)
        else:
            os.environ[PASSWORD_VAR] = saved


_ids = iter(range(10_000))


def call(session: Session, tool: str, query: str, params: list[Any] | None = None) -> ToolResult:
    arguments: dict[str, Any] = {"query": query}
    if params is not None:
        arguments["params"] = params
    return session.call(ToolCall(name=tool, arguments=json.dumps(arguments), call_id=f"c{next(_ids)}"))


# ---- SQLite in a mount -----------------------------------------------------------------------------


def test_sqlite_reads_refuses_writes_and_writes_with_write_true(session: Session, root: Path) -> None:
    read = call(session, "shop", "SELECT id, name, price FROM items WHERE price < ? ORDER BY id", [4])
    assert not read.is_error, read.text
    assert read.text == "id | name  | price\n---+-------+------\n1  | item1 | 1.5\n2  | item2 | 3.0\n(2 rows)"
    assert read.structured is not None and read.structured["rows"] == [[1, "item1", 1.5], [2, "item2", 3.0]]

    refused = call(session, "shop", "DELETE FROM items")
    assert refused.is_error and refused.error is ErrorCode.TOOL_FAILED
    assert refused.text == "SQLite refused the statement: attempt to write a readonly database (SQLITE_READONLY)"

    capped = call(session, "shop", "SELECT id FROM items")
    assert capped.structured is not None and capped.structured["row_count"] == 5
    assert capped.structured["truncated"] == "max_rows"
    assert "(5 rows shown: the result has more; this tool returns at most 5 rows" in capped.text

    evil = "x'); DELETE FROM items; --"
    two = call(session, "shop_admin", "INSERT INTO items (name) VALUES ('a'); DELETE FROM items")
    assert two.is_error and "You can only execute one statement at a time." in two.text
    wrote = call(session, "shop_admin", "INSERT INTO items (name, price) VALUES (?, ?)", [evil, 9])
    assert not wrote.is_error and wrote.text == "OK, 1 row changed"
    with sqlite3.connect(root / "data" / "shop.db") as conn:
        assert conn.execute("SELECT count(*), max(name) FROM items WHERE id > 20").fetchone() == (1, evil)
        assert conn.execute("SELECT count(*) FROM items").fetchone() == (21,)
    conn.close()


# ---- PostgreSQL through the egress proxy -----------------------------------------------------------


def test_postgresql_reads_through_the_egress_proxy(session: Session) -> None:
    read = call(session, "pg", "SELECT id, name, price, tags, seen FROM items WHERE id <= $1 ORDER BY id", [2])
    assert not read.is_error, read.text
    assert read.structured is not None
    assert read.structured["rows"] == [[1, "item1", "1.25", ["t1"], False], [2, "item2", "2.50", ["t2"], True]]
    assert read.structured["types"] == ["int4", "text", "numeric", "jsonb", "bool"]
    assert read.structured["status"] == "SELECT 2"
    assert read.text.splitlines()[0] == "id | name  | price | tags   | seen"
    assert read.text.endswith("(2 rows)")


@pytest.mark.parametrize(("query", "message"), [
    ("INSERT INTO items (name) VALUES ('x')", "cannot execute INSERT in a read-only transaction (25006)"),
    ("UPDATE items SET price = 0", "cannot execute UPDATE in a read-only transaction (25006)"),
    ("DROP TABLE items", "cannot execute DROP TABLE in a read-only transaction (25006)"),
    ("SELECT nextval('items_id_seq')", "cannot execute nextval() in a read-only transaction (25006)"),
    ("SELECT set_config('transaction_read_only', 'off', false)",
     "transaction read-write mode must be set before any query (25001)"),
])
def test_postgresql_refuses_writes_itself_when_read_only(session: Session, postgres: Postgres, query: str,
                                                          message: str) -> None:
    result = call(session, "pg", query)
    assert result.is_error and result.error is ErrorCode.TOOL_FAILED
    assert result.text == f"PostgreSQL refused the statement: {message}"
    assert postgres.psql("SELECT count(*), sum(price) FROM items") == "40|1025.00"


def test_postgresql_caps_and_statement_timeout_hold(session: Session) -> None:
    rows = call(session, "pg", "SELECT i FROM generate_series(1, 1000000) AS i")
    assert rows.structured is not None and rows.structured["row_count"] == 10
    assert rows.structured["truncated"] == "max_rows"
    wide = call(session, "pg", "SELECT repeat('x', 300) FROM generate_series(1, 9)")
    assert wide.structured is not None and wide.structured["truncated"] == "max_bytes"
    assert 0 < wide.structured["row_count"] < 9
    started = time.monotonic()
    slow = call(session, "pg", "SELECT pg_sleep(30)")
    assert slow.is_error and slow.error is ErrorCode.TIMED_OUT
    assert slow.text.startswith("PostgreSQL refused the statement: canceling statement due to statement timeout")
    assert time.monotonic() - started < 20  # statement_timeout_s = 1


def test_injection_stays_within_one_statement_and_one_transaction(session: Session, postgres: Postgres) -> None:
    attempts = [  # more of them, on SQLite, in tests/unit/test_declared_sql.py
        "SELECT ';'; DELETE FROM items",
        "SELECT $$;$$ /* ; */; DELETE FROM items",
    ]
    for query in attempts:
        result = call(session, "pg_admin", query)
        assert result.is_error, query
        assert result.text == ("PostgreSQL refused the statement: cannot insert multiple commands into a prepared "
                               "statement (42601)"), query
    ended = call(session, "pg_admin", "COMMIT")
    assert ended.is_error and "the statement ended the tool's transaction" in ended.text
    evil = "x'); DELETE FROM items; --"
    stored = call(session, "pg_admin", "INSERT INTO items (name, price) VALUES ($1, $2) RETURNING name", [evil, 1])
    assert not stored.is_error, stored.text
    assert stored.structured is not None and stored.structured["rows"] == [[evil]]
    assert stored.structured["status"] == "INSERT 0 1" and stored.structured["affected"] == 1
    failed = call(session, "pg_admin", "INSERT INTO items (name) SELECT CASE WHEN i < 3 THEN 'ok' END "
                                       "FROM generate_series(1, 5) AS i")
    assert failed.is_error and "violates not-null constraint" in failed.text
    assert postgres.psql("SELECT count(*) FROM items") == "41"  # only the one insert; the failed one left nothing
    assert postgres.psql("SELECT count(*) FROM items WHERE name = 'ok'") == "0"
    assert postgres.psql("DELETE FROM items WHERE id > 40 RETURNING name") == evil


def test_the_password_reaches_neither_results_nor_the_audit(session: Session, root: Path) -> None:
    wrong = call(session, "pg_wrong_password", "SELECT 1")
    assert wrong.is_error and wrong.text.startswith("could not connect to PostgreSQL:")
    assert 'password authentication failed for user "agent"' in wrong.text
    for path in root.iterdir():  # after this module's every call (but the one below) so far
        if path.name.startswith("audit.sqlite3"):
            assert PASSWORD.encode() not in path.read_bytes(), path
            assert b"not-the-password" not in path.read_bytes(), path
    # a result that holds it (here because the model sent it) has it redacted
    echoed = call(session, "pg", "SELECT $1::text AS echoed", [PASSWORD])
    assert echoed.structured is not None and PASSWORD not in json.dumps(echoed.structured)
    assert PASSWORD not in echoed.text
    assert echoed.text.splitlines()[2] == "[redacted: secret:pg.password]"
