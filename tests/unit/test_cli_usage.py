"""Usage errors of the CLI: exit 2 and one `callbox: ...` line, decided before any engine is contacted.

DOCKER_HOST points at a socket that does not exist, so a code path that wrongly reaches for
the engine fails with 125 ("cannot reach the Docker engine") instead of touching a real one,
and stdin is a real /dev/null so `exec` does not trip over pytest's captured stdin.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.core import units


@pytest.fixture(autouse=True)
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and a single `callbox:` line; return that line."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, f"exit {code}, stderr: {captured.err!r}"
    assert "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("callbox: ")
    assert captured.out == ""
    return lines[0]


def test_unknown_top_level_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["--no-such-flag", "ps"])
    assert "--no-such-flag" in line
    assert "--help" in line


def test_unknown_exec_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--frobnicate", "--", "true"])
    assert "--frobnicate" in line


def test_unknown_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["launch-missiles"])
    assert "launch-missiles" in line


def test_no_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, [])
    assert "required" in line


def test_exec_without_a_command_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec"])
    assert "no command given" in line
    assert "callbox exec [OPTIONS] -- CMD" in line


def test_exec_with_only_the_separator_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--json", "--"])
    assert "-- CMD" in line


@pytest.mark.parametrize("timeout", ["0", "-5", "-0", "0.0"])
def test_exec_non_positive_timeout(capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    line = _usage_error(capsys, ["exec", "--timeout", timeout, "--", "true"])
    assert "--timeout" in line
    assert "more than 0 seconds" in line


@pytest.mark.parametrize("timeout", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_exec_timeout_must_be_finite(capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    line = _usage_error(capsys, ["exec", f"--timeout={timeout}", "--", "true"])
    assert "--timeout" in line
    assert "finite number of seconds" in line


@pytest.mark.parametrize("timeout", ["100000", "1e9", "86400.5", "1e308"])
def test_exec_timeout_above_a_day_is_a_usage_error_in_seconds(capsys: pytest.CaptureFixture[str],
                                                               timeout: str) -> None:
    line = _usage_error(capsys, ["exec", "--timeout", timeout, "--", "true"])
    assert "--timeout" in line
    assert "at most 86400 seconds" in line
    assert "timeout_ms" not in line


@pytest.mark.parametrize(("text", "seconds"), [("86400", 86400.0), ("0.001", 0.001), ("2", 2.0), (" 1.5 ", 1.5)])
def test_timeout_type_accepts_seconds_up_to_a_day(text: str, seconds: float) -> None:
    assert units.timeout_seconds(text) == seconds


def test_timeout_limit_is_the_agents() -> None:
    from sandbox import process

    assert units.MAX_TIMEOUT_S * 1000 == process.MAX_TIMEOUT_MS


def test_exec_timeout_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--timeout", "soon", "--", "true"])
    assert "soon" in line


def test_exec_env_without_equals(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--env", "NOEQUALS", "--", "true"])
    assert "NOEQUALS" in line
    assert "K=V" in line


def test_exec_env_with_an_invalid_name(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--env", "1BAD=x", "--", "true"])
    assert "1BAD" in line


def test_exec_bad_memory_names_the_format(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--memory", "lots", "--", "true"])
    assert "'lots' is not a size" in line


def test_exec_bad_output_cap(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--output-cap", "huge", "--", "true"])
    assert "--output-cap" in line


@pytest.mark.parametrize("command", [["exec"], ["sandbox", "exec", "web"]])
@pytest.mark.parametrize("cap", ["0", "0m"])
def test_an_output_cap_of_0_is_refused_saying_there_is_no_uncapped_output(
        capsys: pytest.CaptureFixture[str], command: list[str], cap: str) -> None:
    line = _usage_error(capsys, [*command, "--output-cap", cap, "--", "true"])
    assert line.startswith(f"callbox: --output-cap: {cap} is below the minimum of 1 byte; output is always capped")
    assert line.endswith("to keep more, pass a larger size, e.g. --output-cap 64m")


def test_exec_mount_without_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--mount", "/tmp", "--", "true"])
    assert "HOST:CONTAINER" in line


def test_exec_mount_with_a_bad_mode(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--mount", "/tmp:/data:rx", "--", "true"])
    assert "ro or rw" in line


def test_exec_mount_on_a_reserved_target(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--mount", "/tmp:/proc", "--", "true"])
    assert "/proc" in line


def test_exec_mount_of_a_missing_source_is_refused_before_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _usage_error(capsys, ["exec", "--mount", "/nonexistent-xyz:/data", "--", "true"])
    assert "/nonexistent-xyz" in line
    assert "does not exist" in line


def test_exec_mount_of_a_system_path_is_refused_before_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--mount", "/etc:/data", "--", "true"])
    assert "system path" in line


@pytest.mark.parametrize(("argv", "needle"), [
    (["--allow-host", "example.com:443"], "only apply to network 'allowlist'"),
    (["--network", "open", "--allow-host", "example.com:443"], "only apply to network 'allowlist'"),
    (["--network", "allowlist"], "needs at least one allowed host"),
    (["--network", "allowlist", "--allow-host", "*.*.example.com"], "invalid allowlist entry '*.*.example.com'"),
])
def test_exec_network_flags_are_checked_before_the_engine(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                          needle: str) -> None:
    line = _usage_error(capsys, ["exec", *argv, "--", "true"])
    assert needle in line
    assert "Value error" not in line
    assert "validation error" not in line


def test_exec_unknown_network_choice(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--network", "host", "--", "true"])
    assert "host" in line


def test_exec_pids_out_of_range_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, ["exec", "--pids", "1", "--", "true"])
    assert "pids" in line


@pytest.mark.parametrize(("flags", "line"), [
    (["--memory", "1k"], "callbox: --memory: 1k is below the minimum of 32m"),
    (["--memory", "1500"], "callbox: --memory: 1500 is below the minimum of 32m"),
    (["--pids", "0"], "callbox: --pids: 0 is below the minimum of 8 (allowed: 8 to 65536)"),
    (["--pids", "100000"], "callbox: --pids: 100000 is above the maximum of 65536 (allowed: 8 to 65536)"),
    (["--cpus", "0"], "callbox: --cpus: 0 is below the minimum of 0.01 (the smallest CPU quota Docker accepts)"),
    (["--memory", "64t"], "callbox: --memory: 64t is more than the "),
    (["--workdir", "work"], "callbox: --workdir: workdir 'work' must be an absolute path inside the sandbox"),
    (["--env", "1BAD=x"], "callbox: --env: environment variable name '1BAD' is not valid"),
    (["--mount", "/tmp:/proc"], "callbox: --mount /tmp:/proc: mount target '/proc' would cover /proc, which the "
                                "sandbox needs"),
])
def test_exec_sandbox_flags_out_of_range_name_the_flag_and_what_is_allowed(
        capsys: pytest.CaptureFixture[str], flags: list[str], line: str) -> None:
    got = _usage_error(capsys, ["exec", *flags, "--", "true"])
    assert got.startswith(line), got
    assert "Input should" not in got and "33554432" not in got


def test_run_loop_options_out_of_range_name_the_flag_and_the_minimum(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    line = _usage_error(capsys, ["run", "--model", "openai:m", "--task", "t", "--max-turns", "0",
                                 "--audit-db", str(tmp_path / "a.db")])
    assert line == "callbox: --max-turns: 0 is below the minimum of 1"
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("max_turns = [", "not valid TOML"),
    ("max_turn = 3", "max_turn"),
    ('[[acceptance]]\nworkdir = "/w"', "acceptance"),
    ("max_rejections = -1", "max_rejections"),
])
def test_run_config_file_errors_are_usage_errors_naming_the_file_or_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(text + "\n")
    line = _usage_error(capsys, ["run", "--model", "openai:m", "--task", "t", "--config", str(config),
                                 "--audit-db", str(tmp_path / "a.db")])
    assert expected in line, line
    assert not (tmp_path / "a.db").exists()


def test_run_config_file_that_is_missing_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = _usage_error(capsys, ["run", "--model", "openai:m", "--task", "t", "--config",
                                 str(tmp_path / "nope.toml")])
    assert "nope.toml" in line and "No such file" in line, line


def test_call_names_the_flag_over_a_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("[sandbox]\npids = 64\n")
    line = _usage_error(capsys, ["call", "shell", '{"command": "true"}', "--policy", str(policy),
                                 "--audit-db", str(tmp_path / "a.db"), "--pids", "4"])
    assert line == "callbox: --pids: 4 is below the minimum of 8 (allowed: 8 to 65536)"


def test_call_names_the_policy_key_when_the_policy_set_it(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[sandbox]\nmemory = "1k"\n')
    line = _usage_error(capsys, ["call", "shell", '{"command": "true"}', "--policy", str(policy),
                                 "--audit-db", str(tmp_path / "a.db")])
    assert line.startswith(f"callbox: policy file {policy}: key 'sandbox.memory': 1k is below the minimum of 32m")


def test_unreachable_engine_is_125_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Sanity check of the fixture: a valid exec fails closed on the missing engine."""
    code = cli.main(["exec", "--", "true"])
    captured = capsys.readouterr()
    assert code == 125
    assert captured.err.startswith("callbox: cannot reach the Docker engine")
    assert len(captured.err.splitlines()) == 1
    assert "Traceback" not in captured.err


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: callbox" in out
    assert "exec" in out


def test_exec_help_exits_zero_and_lists_the_sandbox_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["exec", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--memory", "--cpus", "--pids", "--timeout", "--network", "--mount", "--env", "--json"):
        assert flag in out


@contextlib.contextmanager
def closed_stdout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """stdout is a pipe whose reader has gone, as in `callbox tools | head -c 10`. Entered in
    the test itself: capsys installs its own stdout when the test starts, after fixtures."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        yield


@pytest.mark.parametrize("argv", [["tools"], ["tools", "--format", "mcp"], ["audit"], ["audit", "--json"],
                                  ["approvals", "list"]])
def test_a_closed_stdout_ends_quietly_with_141(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    from harness.audit.store import AuditStore

    AuditStore(tmp_path / "audit.sqlite3").close()  # audit and approvals read an existing store
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "audit.sqlite3"))
    with closed_stdout(monkeypatch):
        code = cli.main(argv)
    assert code == 141
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_is_a_callbox_failure(capfd: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr still have their readers: the broken pipe is callbox's own failure."""

    def broken(_args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_dispatch", broken)
    assert cli.main(["ps"]) == 125
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("callbox: ") and "Broken pipe" in lines[0]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    captured = capsys.readouterr()
    assert captured.out == f"callbox {importlib.metadata.version('callbox')}\n"
    assert captured.err == ""


@pytest.mark.parametrize("argv", [["mcp", "\r"], ["exec", "--memory", "1\n2\x1b[31m", "--", "true"],
                                  ["tools", "--policy", "a\u202eb\u2028c"]])
def test_control_characters_echoed_back_are_escaped_on_the_one_line(capsys: pytest.CaptureFixture[str],
                                                                    argv: list[str]) -> None:
    line = _usage_error(capsys, argv)
    assert not any(c in line for c in "\r\n\x1b\u202e\u2028")
    assert any(escaped in line for escaped in ("\\r", "\\n", "\\x1b", "\\u202e", "\\u2028"))


@pytest.mark.parametrize("argv", [["--max-per-client", "0"], ["--max-sandboxes=-1"], ["--max-sandboxes", "x"]])
def test_serve_limits_must_be_positive_integers(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    line = _usage_error(capsys, ["serve", "--grpc", *argv])
    assert argv[0].split("=")[0] in line
    assert "a whole number of at least 1" in line


@pytest.mark.parametrize(("argv", "expected"), [
    (["--accept-workdir", "/w"], "callbox: --accept-workdir is the directory of the --accept checks: give --accept "
                                 "CMD too"),
    (["--accept", "make", "--accept-workdir", "w"], "callbox: --accept-workdir: workdir 'w' must be an absolute path "
                                                    "in the sandbox, e.g. /workspace/w"),
    (["--accept", ""], "callbox: --accept must have at least 1 character"),
    (["--max-rejections", "-1"], "callbox: --max-rejections: -1 is below the minimum of 0"),
])
def test_run_acceptance_flags_errors_name_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   argv: list[str], expected: str) -> None:
    line = _usage_error(capsys, ["run", "--model", "openai:m", "--task", "t", *argv,
                                 "--audit-db", str(tmp_path / "a.db")])
    assert line.startswith(expected), line
    assert not (tmp_path / "a.db").exists()


def test_run_exit_status_of_the_acceptance_ends() -> None:
    from harness.cli.run import _exit_status

    assert (_exit_status("final:accepted"), _exit_status("final"), _exit_status("rejected:acceptance")) == (0, 0, 1)
