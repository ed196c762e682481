"""Fuzzing the CLI's argument parsing and the policy loader (hypothesis): no input gives a traceback.

Every subcommand gets random argv built from its own options (read off the real parser, so a new
option is fuzzed without touching this file) with odd values: huge numbers, nan, negatives, unicode,
empty strings, missing values. ``harness.cli.main.main`` runs in-process with nothing real to reach:
DOCKER_HOST names a unix socket nobody listens on (so reaching for the engine is the one-line 125),
the servers and the agent loop are stubbed at the point where they would start serving or call a
model, and every path callbox could write to lies in a temporary directory. Whatever the argv, the
outcome is an exit status callbox documents and, on failure, one ``callbox: ...`` line.
"""

from __future__ import annotations

import argparse
import io
import signal
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main as cli
from harness.core.errors import EXIT_STATUSES
from harness.core.policy import PolicyError, parse_policy

EXIT_CODES = {status.status for status in EXIT_STATUSES}
"""The exit statuses of the error table: success, an error result, usage, not found, a wrong state, ..."""

FUZZ = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

ODD = [
    "", " ", "0", "-0", "1", "-1", "-5", "0.0", "1.5", "nan", "NaN", "inf", "-inf", "Infinity", "1e9", "1e309",
    "9" * 40, "-" + "9" * 40, "0x10", "1_000", "512m", "-5m", "1e3g", "99999t", "/", ".", "..", "/proc", "/tmp",
    "a:b", "a:b:c", ":", "::", "/tmp:/proc", "/tmp:/data:rx", "=", "K=V", "1BAD=x", "-", "--", "-h", "é", "🙂",
    "\u202e", "\udcff", "a" * 300, "{}", "[]", "null", '{"command": "ls"}', '{"command": 5}', "shell", "bash",
    "none", "open", "allowlist", "openai", "mcp", "unix:", "127.0.0.1:0", "[::1]:99999", "scripted:x", "openai:x",
]
"""Values that have broken parsers before; mixed with random text."""


class _Started(Exception):
    """A stub was reached where a server would start serving or the loop call a model."""


def _stub(*_args: Any, **_kwargs: Any) -> Any:
    raise _Started


def _grpc_stub(addr: str | None, **options: Any) -> Any:
    """The checks serve_grpc makes of what the command line hands it, then no server."""
    from harness.doors.grpc.server import parse_address
    from harness.doors.grpc.sessions import Limits

    parse_address(addr)
    Limits(max_sandboxes_per_client=options["max_sandboxes_per_client"],
           max_sandboxes_total=options["max_sandboxes_total"])
    raise _Started


def _mcp_http_stub(addr: str, **_options: Any) -> Any:
    from harness.doors.mcp.http import parse_addr

    parse_addr(addr)
    raise _Started


@pytest.fixture
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Nothing reachable, nothing written outside ``tmp_path``; signal handlers put back."""
    dead = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(dead))  # a socket file nobody listens on: connect() is refused
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    for name in ("HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path))
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "audit.sqlite3"))
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.toml").write_text('[tools.shell]\ndecision = "ask"\n[budgets]\nmax_tool_calls = 3\n')
    (tmp_path / "transcript.jsonl").write_text('{"text": "done"}\n')
    (tmp_path / "tokens").write_text("ci:" + "t" * 40 + "\n")
    (tmp_path / "tokens").chmod(0o600)
    # Retries of an unreachable engine would sleep 1.5 s per example.
    monkeypatch.setattr(tenacity.nap, "time", types.SimpleNamespace(sleep=lambda _s: None))
    import harness.doors.grpc.server
    import harness.doors.mcp.http
    import harness.doors.mcp.stdio
    import harness.loop.agent_loop

    monkeypatch.setattr(harness.doors.grpc.server, "serve_grpc", _grpc_stub)
    monkeypatch.setattr(harness.doors.mcp.http, "serve_mcp_http", _mcp_http_stub)
    monkeypatch.setattr(harness.doors.mcp.stdio, "run_mcp_stdio", _stub)
    monkeypatch.setattr(harness.loop.agent_loop, "run_agent", _stub)
    monkeypatch.setattr(harness.loop.agent_loop, "resume", _stub)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield tmp_path
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf subcommand path (``("approvals", "deny")``) and its parser."""
    found: dict[tuple[str, ...], Any] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    for name, child in subs[0].choices.items():
        found.update(_subcommands(child, (*path, name)))
    return found


PARSERS = _subcommands(cli.build_parser())


def _safe_path(text: str) -> bool:
    """Random path values stay relative to the temporary working directory."""
    return not text.startswith(("/", "~")) and ".." not in text and "\x00" not in text


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_value = st.one_of(st.sampled_from(ODD), _text, st.integers().map(str), st.floats().map(repr))
_path_value = st.one_of(st.sampled_from(["", ".", "..", "/", "/proc", "/tmp", "a", "a/b", "é", "policy.toml",
                                         "transcript.jsonl", "tokens"]),
                        _text.filter(_safe_path))


_VALID = {
    "tool": ["shell", "bash", "read_file", "apply_patch", "nosuchtool"],
    "arguments": ['{"command": "echo hi"}', '{"path": "/"}', '{"command": 5}', "{", '{"a": NaN}', "*** Begin Patch"],
    "transcript": ["transcript.jsonl", "", "/proc", "."],
    "id": ["ap_1", ""],
}
"""Plausible values for positional arguments, so more examples get past parsing."""


@st.composite
def _argv(draw: st.DrawFn, path: tuple[str, ...]) -> list[str]:
    """``path``, its positional arguments (sometimes one missing), random options of that
    subcommand with odd values (sometimes one missing its value), and now and then a global
    flag, an unknown option or a stray word."""
    parser = PARSERS[path]
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    positionals = [a for a in parser._actions if not a.option_strings and a.nargs != argparse.REMAINDER]
    words: list[str] = []
    if draw(st.integers(0, 9)) == 0:
        words.append(draw(st.sampled_from(["-v", "--no-such-flag", "--version", "-h"])))
    words += list(path)
    for action in positionals:
        if draw(st.integers(0, 9)) == 0:
            continue  # a required positional missing
        plausible = st.sampled_from(_VALID.get(action.dest, ["x"]))
        words.append(draw(plausible if draw(st.integers(0, 3)) > 0 else _value))
    for _ in range(draw(st.integers(0, 5 if options else 0))):
        action = draw(st.sampled_from(options))
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            words.append(flag)
            continue
        if action.choices is not None and draw(st.integers(0, 3)) > 0:
            value = draw(st.sampled_from(sorted(map(str, action.choices))))
        elif action.type is Path:
            value = draw(_path_value)
        elif action.type is int or getattr(action.type, "__name__", "") == "positive_int":
            value = draw(st.integers(-3, 100).map(str) if draw(st.integers(0, 2)) > 0 else _value)
        else:
            value = draw(_value)
        words += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    if draw(st.integers(0, 9)) == 0:
        words.append(draw(_value))  # a stray word
    if path == ("serve",) and draw(st.integers(0, 3)) > 0:
        words += draw(st.sampled_from([["--grpc"], ["--grpc", "unix:x.sock"], ["--mcp-http", "127.0.0.1:0"]]))
    if path == ("exec",) and draw(st.integers(0, 5)) > 0:
        words += ["--", draw(st.sampled_from(["true", "nosuchcmd", "", "--", "-x"]))]
    elif options and draw(st.integers(0, 9)) == 0:
        words.append(draw(st.sampled_from(options)).option_strings[0])  # an option missing its value
    return words


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    stdin = io.TextIOWrapper(io.BytesIO(b""))
    saved = sys.stdin
    sys.stdin = stdin
    try:
        code: object = cli.main(argv)
    except SystemExit as exc:  # --help, --version
        code = exc.code
    except _Started:
        code = 0
    finally:
        sys.stdin = saved
    captured = capsys.readouterr()
    assert isinstance(code, int), (argv, code)
    return code, captured.err


def _check(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, (argv, err)
    assert code in EXIT_CODES, (argv, code, err)
    # A loosened default is always announced (one line each) before anything else happens.
    lines = [line for line in err.splitlines() if not line.startswith("callbox: this policy loosens a hardened")]
    if code in (2, 4, 5, 6, 7, 125):
        assert lines, (argv, code)
        assert all(line.startswith("callbox: ") for line in lines), (argv, err)
        if "-v" not in argv:
            assert len(lines) == 1, (argv, err)
    elif code == 1:
        assert len(lines) <= 1, (argv, err)


DEEP = {("exec",), ("call",), ("run",), ("serve",)}
"""The subcommands with the most options get more examples."""


@pytest.mark.parametrize("path", sorted(PARSERS), ids=lambda p: " ".join(p) or "callbox")
def test_no_argv_gives_a_traceback(path: tuple[str, ...], no_engine: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    @settings(FUZZ, max_examples=120 if path in DEEP else 40)
    @given(argv=_argv(path))
    def fuzz(argv: list[str]) -> None:
        code, err = _run(argv, capsys)
        _check(argv, code, err)

    fuzz()


@FUZZ
@given(argv=st.lists(_value, max_size=6))
def test_no_random_words_give_a_traceback(argv: list[str], no_engine: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(argv, capsys)
    _check(argv, code, err)


# ---- the policy loader ------------------------------------------------------------------------

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD), _text,
)
_toml_value = st.recursive(
    _scalar, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)

KNOWN_KEYS: dict[str, list[str]] = {
    "": ["allowed_tools", "default_decision"],
    "sandbox": ["image", "memory", "cpus", "pids", "network", "allow_hosts", "mounts", "allowed_mount_roots",
                "workdir", "env", "tmp_size", "workspace_size", "nofile", "fsize", "ttl_seconds", "noexec"],
    "budgets": ["max_tool_calls", "max_wall_time_s", "call_timeout_ceiling_s", "default_call_timeout_s",
                "max_output_bytes"],
    "tools.shell": ["decision", "rules"],
}


_NUMBERS = [0, -1, 1, 8, 256, 2**63 - 1, 0.5, 1e9, float("nan"), float("inf"), "512m", "1g", "-1", "1e400m"]
PLAUSIBLE: dict[str, list[Any]] = {
    "allowed_tools": [["shell"], ["shell", "bash"], ["nosuchtool"], [""], []],
    "default_decision": ["allow", "ask", "deny", "maybe"],
    "decision": ["allow", "ask", "deny", "maybe"],
    "image": ["callbox-sandbox:latest", "", "UPPER:case", "a" * 300],
    "network": ["none", "allowlist", "open", "host"],
    "allow_hosts": [["example.com"], ["*.example.com:443"], ["*.*.x"], ["[::1]:99999"], []],
    "workdir": ["/workspace", "/", "relative", "/proc", "/workspace/../etc"],
    "env": [{"A": "b"}, {"1BAD": "x"}, {"PATH": "/x"}, {"": ""}],
    "mounts": [[{"source": "/tmp", "target": "/data"}], [{"source": "rel", "target": "/w", "mode": "rw"}]],
    "allowed_mount_roots": [["/tmp"], ["rel"], [], ["~"]],
    "noexec": [True, False, "yes"],
    "rules": [[{"action": "deny", "command": "*rm*"}], [{"action": "ask", "path": "/etc/**"}],
              [{"action": "deny", "command": "regex:("}], [{"action": "deny", "path": "../x"}]],
}
"""Values near the valid ones per key (the rest is random), so documents get past the first check."""


def _toml(value: Any) -> str:
    """A TOML inline value (null has no TOML form: an empty table stands in)."""
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"


@st.composite
def _policy_document(draw: st.DrawFn) -> str:
    """TOML built from the known tables and keys with random values, sometimes an unknown key,
    a rule, a mount, or plain garbage."""
    lines = []
    for table, keys in KNOWN_KEYS.items():
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=4))
        if not chosen:
            continue
        if table:
            lines.append(f"[{table}]")
        for key in chosen:
            near = st.sampled_from(PLAUSIBLE.get(key, _NUMBERS))
            lines.append(f"{key} = {_toml(draw(near if draw(st.integers(0, 2)) > 0 else _toml_value))}")
    if draw(st.booleans()):
        rule = {k: draw(st.one_of(st.sampled_from(["allow", "ask", "deny", "*rm*", "regex:(", "**", "../x", ""]),
                                  _toml_value))
                for k in draw(st.lists(st.sampled_from(["action", "command", "path", "reason", "other"]),
                                       unique=True, max_size=4))}
        lines += ["[[tools.bash.rules]]", *(f"{k} = {_toml(v)}" for k, v in rule.items())]
    if draw(st.booleans()):
        mount = {k: draw(st.one_of(st.sampled_from(["/tmp", "/etc", "rel", "~", "/workspace", "ro", "rw", "rx"]),
                                   _toml_value))
                 for k in draw(st.lists(st.sampled_from(["source", "target", "mode"]), unique=True, max_size=3))}
        lines += ["[[sandbox.mounts]]", *(f"{k} = {_toml(v)}" for k, v in mount.items())]
    if draw(st.integers(0, 4)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(_text))
    return "\n".join(lines) + "\n"


def _load(document: str | bytes, base_dir: Path | None) -> None:
    try:
        parse_policy(document, source="fuzz.toml", base_dir=base_dir)
    except PolicyError as error:
        assert error.message.startswith("fuzz.toml"), error.message
        assert "\n" not in error.message.strip(), error.message


@FUZZ
@given(document=_policy_document(), anchored=st.booleans())
def test_random_policies_load_or_give_a_policy_error(document: str, anchored: bool, tmp_path: Path) -> None:
    _load(document, tmp_path if anchored else None)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), _text.map(str.encode)))
def test_random_bytes_load_or_give_a_policy_error(data: bytes) -> None:
    _load(data, None)


def test_policy_fuzz_keys_are_the_loaders() -> None:
    """The keys fuzzed above are the policy's own (a renamed key would be fuzzed as unknown only)."""
    from harness.core.policy import Budgets, Policy, SandboxSettings, ToolPolicy

    models = {"": Policy, "sandbox": SandboxSettings, "budgets": Budgets, "tools.shell": ToolPolicy}
    for table, keys in KNOWN_KEYS.items():
        assert set(keys) <= set(models[table].model_fields), table
