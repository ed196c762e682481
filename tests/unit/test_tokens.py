"""Bearer tokens of the gRPC executor (harness.doors.grpc.tokens) and address parsing: no server, no container."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.doors.grpc.server import ServeError, parse_address
from harness.doors.grpc.tokens import (
    TokenError,
    TokenSet,
    bearer_token,
    client_token,
    default_token_file,
    load_token_file,
    operator_note,
    parse_tokens,
    server_tokens,
)

A = "a" * 24
B = "b" * 24


def _file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_token_file_lines_names_and_comments(tmp_path):
    tokens = load_token_file(_file(tmp_path, f"# clients\n\nalice:{A}\n  bob : {B}  \n"))
    assert tokens.names == ["alice", "bob"]
    assert tokens.lookup(A) == "alice" and tokens.lookup(B) == "bob"
    assert tokens.lookup("a" * 23) is None and tokens.lookup("") is None and tokens.lookup(None) is None
    assert A not in repr(tokens)


def test_a_bare_token_line_is_the_default_client():
    assert parse_tokens(A, source="x").names == ["default"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"alice:{A}\nalice:{B}\n", "listed twice"),
        (f"alice:{A}\nbob:{A}\n", "another client's"),
        ("alice:short\n", "too short"),
        (f"al ice:{A}\n", "not valid"),
        ("# nothing\n", "holds no token"),
        (f"alice:{'x' * 10} {'y' * 10}\n", "without spaces"),
        (f"alice:{A} operater\n", "only its role, 'operator' or 'client'"),
        (f"alice:{A} operator extra\n", "without spaces"),
    ],
)
def test_bad_token_files_name_the_line(text, words):
    with pytest.raises(TokenError, match=words) as info:
        parse_tokens(text, source="f")
    if "no token" not in words:
        assert "f:" in info.value.message


def test_a_token_file_others_can_read_is_refused(tmp_path):
    with pytest.raises(TokenError, match="chmod 600"):
        load_token_file(_file(tmp_path, f"alice:{A}\n", mode=0o644))
    with pytest.raises(TokenError, match="does not exist"):
        load_token_file(tmp_path / "missing")


def test_a_directory_or_an_empty_path_is_not_a_token_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in (tmp_path, Path("")):  # an empty --token-file is the working directory
        with pytest.raises(TokenError, match="is not a regular file; give the path of a file"):
            load_token_file(given)


def test_bearer_metadata():
    assert bearer_token([("authorization", f"Bearer {A}")]) == A
    assert bearer_token([("x", "y"), ("Authorization", f"bearer   {A} ")]) == A
    assert bearer_token([("authorization", f"Basic {A}")]) is None
    assert bearer_token([]) is None and bearer_token(None) is None


def test_first_start_writes_a_client_and_an_operator_token_and_prints_neither(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    env: dict[str, str] = {}
    said: list[str] = []
    first = server_tokens(env=env, announce=said.append)
    path = default_token_file()
    assert path == tmp_path / "state" / "callbox" / "grpc-tokens"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert first.names == ["default", "operator"] and first.operators == ["operator"]
    assert first.role("default") == "client"
    token = first.token("default")
    assert len(said) == 1 and str(path) in said[0]
    assert token not in said[0] and first.token("operator") not in said[0]  # no log holds a token
    again = server_tokens(env=env, announce=said.append)
    assert again.token("default") == token and len(said) == 1
    assert client_token(env=env) == token  # a client on this machine takes the client's line, not the operator's


def test_roles_an_older_file_is_all_clients_and_the_env_token_is_a_client(tmp_path):
    older = load_token_file(_file(tmp_path, f"alice:{A}\nbob:{B}\n"))
    assert older.operators == [] and older.role("alice") == "client"
    assert operator_note(older) is not None and "NAME:TOKEN operator" in str(operator_note(older))
    roles = parse_tokens(f"alice:{A} client\n bob : {B}   operator\n", source="x")
    assert roles.names == ["alice", "bob"] and roles.operators == ["bob"] and roles.lookup(B) == "bob"
    assert operator_note(roles) is None
    assert roles.role("nobody") == "client" and roles.role(None) == "client"
    assert server_tokens(env={"CALLBOX_TOKEN": "c" * 20}).operators == []


def test_reload_takes_a_new_file_whole_or_keeps_the_running_tokens(tmp_path):
    path = _file(tmp_path, f"alice:{A}\nbob:{B} operator\n")
    tokens = load_token_file(path)
    path.write_text(f"alice:{A} operator\ncarol:{'c' * 24}\n")
    said = tokens.reload()
    assert "removed: bob" in said and "added: carol" in said and "alice is now operator" in said
    assert A not in said and "c" * 24 not in said
    assert tokens.lookup(B) is None and tokens.lookup("c" * 24) == "carol"
    assert tokens.operators == ["alice"] and not tokens.is_operator("bob")
    path.write_text("alice:short\n")
    with pytest.raises(TokenError, match="too short"):
        tokens.reload()
    assert tokens.lookup(A) == "alice"  # the running tokens stay
    with pytest.raises(TokenError, match="cannot be reloaded"):
        TokenSet({"x": A}, source="$CALLBOX_TOKEN").reload()


def test_token_sources_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    listed = _file(tmp_path, f"alice:{A}\nbob:{B}\n")
    env = {"CALLBOX_TOKEN": "c" * 20, "CALLBOX_TOKEN_FILE": str(listed)}
    assert server_tokens(listed, env=env).names == ["alice", "bob"]  # an explicit file first
    assert server_tokens(env=env).names == ["default"]  # then CALLBOX_TOKEN
    assert server_tokens(env={"CALLBOX_TOKEN_FILE": str(listed)}).names == ["alice", "bob"]
    assert not default_token_file().exists()  # nothing was generated
    assert client_token(env=env) == "c" * 20
    assert client_token(env={"CALLBOX_TOKEN_FILE": str(listed)}) == A
    with pytest.raises(TokenError, match="too short"):
        server_tokens(env={"CALLBOX_TOKEN": "short"})


def test_token_set_needs_a_client():
    with pytest.raises(TokenError):
        TokenSet({}, source="empty")


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("unix:/run/x.sock", "unix", "/run/x.sock"),
        ("unix:///run/x.sock", "unix", "/run/x.sock"),
        ("/tmp/e.sock", "unix", "/tmp/e.sock"),
        ("127.0.0.1:50051", "tcp", "127.0.0.1:50051"),
        ("[::1]:0", "tcp", "[::1]:0"),
        (":7000", "tcp", "0.0.0.0:7000"),
        ("localhost:1", "tcp", "localhost:1"),
    ],
)
def test_addresses(text, kind, value):
    address = parse_address(text)
    assert (address.kind, address.value) == (kind, value)


def test_default_address_is_a_unix_socket():
    address = parse_address(None)
    assert address.kind == "unix" and address.value.endswith("/executor.sock")


@pytest.mark.parametrize("text", ["localhost", "host:port", "1.2.3.4:70000", "[::1:5", "unix:"])
def test_bad_addresses(text):
    with pytest.raises(ServeError):
        parse_address(text)


def test_a_client_without_a_token_is_told_how_to_give_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CALLBOX_TOKEN", raising=False)
    monkeypatch.delenv("CALLBOX_TOKEN_FILE", raising=False)
    how = ("no token for the callbox server: pass token=... to the client, or set CALLBOX_TOKEN to a token of the "
           "server's token file (a first `callbox serve` writes one and says where), or CALLBOX_TOKEN_FILE to a file "
           "of NAME:TOKEN lines holding it; ")
    with pytest.raises(TokenError) as default:
        client_token(env={})
    assert default.value.message == (
        f"{how}the token file a server on this machine writes, {tmp_path}/state/callbox/grpc-tokens, does not exist")
    with pytest.raises(TokenError) as named:
        client_token(env={"CALLBOX_TOKEN_FILE": str(tmp_path / "nope")})
    assert named.value.message == f"{how}CALLBOX_TOKEN_FILE names {tmp_path}/nope, which does not exist"
    assert not (tmp_path / "state").exists()  # a client never makes the server's file

    from harness.client import ExecutorClient

    with pytest.raises(TokenError, match=r"^no token for the callbox server: pass token=\.\.\. to the client"):
        ExecutorClient("127.0.0.1:9")
    with ExecutorClient("127.0.0.1:9", "t" * 20) as client:  # a token given is used as it is
        assert client.target == "127.0.0.1:9"
