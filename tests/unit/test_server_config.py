"""The server configuration file: validation with key paths, anchored paths, the files it
names, the effective configuration, and flags winning over the file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.cli.server_config import ConfigError, apply_config, load_config, parse_config, render_toml

TOKEN_LINE = "alice:" + "a" * 32 + "\n"


def write_config(tmp_path: Path, text: str) -> Path:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN_LINE)
    tokens.chmod(0o600)
    path = tmp_path / "callbox.toml"
    path.write_text(text)
    return path


def test_unknown_and_bad_keys_are_named_by_their_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config('[doors.grpc]\nlisne = "x"\n[limits]\nmax_sandboxes = 0\n[metrics]\non = true\n',
                     source="config file c.toml", base=tmp_path)
    message = raised.value.message
    assert message.startswith("config file c.toml has 4 problems: ")
    for part in ("missing required key 'doors.grpc.listen'", "unexpected key 'doors.grpc.lisne' (allowed: listen)",
                 "key 'limits.max_sandboxes': 0 is below the minimum of 1", "unexpected key 'metrics'"):
        assert part in message, message
    assert raised.value.exit_code == 2


def test_toml_syntax_errors_give_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not valid TOML: .*line 2"):
        parse_config('[doors.grpc]\nlisten = \n', source="c", base=tmp_path)


def test_relative_paths_are_taken_against_the_files_directory(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "tokens"\n'
                                  '[audit]\ndb = "state/audit.db"\n')
    config = load_config(path)
    assert config.auth.token_file == tmp_path / "tokens"
    assert config.audit.db == tmp_path / "state" / "audit.db"
    effective = config.effective()
    assert effective["limits"] == {"max_sandboxes": 64, "max_per_client": 16}
    assert effective["doors"] == {"grpc": {"listen": ""}, "mcp_http": None, "e2b": None}
    assert effective["policy"] == {"file": None}


@pytest.mark.parametrize(("text", "problem"), [
    ('[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "missing"\n',
     r"\[auth\] token_file = '.*/missing' is not a file; fix the path"),
    ('[doors.grpc]\nlisten = ""\n[tls]\ncert = "tokens"\n',
     r"\[tls\] cert = '.*/tokens' without \[tls\] key: TLS needs the certificate and its private key; add "
     r"\[tls\] key \(PEM\), or remove \[tls\] cert"),
    ('[tls]\ninsecure = true\n', "no door to serve"),
    ('[doors.e2b]\nlisten = "127.0.0.1:0"\n[policy]\nfile = "nope.toml"\n',
     r"\[policy\] file = '.*/nope.toml' is not a file; fix the path, or remove the key to serve the packaged "
     r"default policy"),
])
def test_the_files_it_names_are_checked(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(write_config(tmp_path, text))


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "tokens"\n')
    (tmp_path / "tokens").chmod(0o644)
    with pytest.raises(ConfigError, match=r"\[auth\] token_file: .*chmod 600"):
        load_config(path)


def test_a_bad_policy_is_reported_through_the_config(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text("[sandbox]\nmemroy = 1\n")
    path = write_config(tmp_path, '[doors.grpc]\nlisten = ""\n[policy]\nfile = "policy.toml"\n')
    with pytest.raises(ConfigError, match=r"\[policy\] file: policy file .*unexpected key 'sandbox\.memroy'"):
        load_config(path)


def test_render_toml_round_trips_and_explains_what_is_unset(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[doors.grpc]\nlisten = "127.0.0.1:0"\n[auth]\ntoken_file = "tokens"\n'
                                  '[tls]\ninsecure = true\n')
    effective = load_config(path).effective()
    text = render_toml(effective)
    assert "# [doors.e2b]: not served" in text
    assert "# file: not set (the packaged default policy)" in text
    again = parse_config(text, source="rendered", base=tmp_path).effective()
    assert again == effective


def _serve_args(*extra: str) -> argparse.Namespace:
    from harness.cli.main import build_parser

    return build_parser().parse_args(["serve", *extra])


def test_flags_win_over_the_file_and_defaults_fill_the_rest(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[doors.grpc]\nlisten = "127.0.0.1:7443"\n[tls]\ninsecure = true\n'
                                  '[limits]\nmax_per_client = 4\n')
    args = _serve_args("--config", str(path), "--grpc", "unix:/tmp/x.sock", "--max-sandboxes", "9")
    apply_config(args)
    assert args.grpc == "unix:/tmp/x.sock"  # the flag
    assert (args.max_per_client, args.max_sandboxes) == (4, 9)  # the file, the flag
    assert args.insecure is True and args.mcp_http is None and args.e2b is None
    plain = _serve_args("--grpc")
    apply_config(plain)
    assert (plain.max_per_client, plain.max_sandboxes) == (16, 64)


def test_config_check_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n')
    assert main(["config", "check", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["doors"]["mcp_http"] == {"listen": "127.0.0.1:8765"}
    bad = tmp_path / "bad.toml"
    bad.write_text('[doors.mcp_http]\nport = 1\n')
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "callbox: config file" in err and "'doors.mcp_http.port'" in err
    assert main(["config", "check", str(tmp_path / "absent.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
