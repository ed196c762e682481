"""``callbox service install``: the unit it writes is one systemd itself accepts, runs the
server with the checked configuration, and refuses a configuration that cannot start."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import unavailable
from tests.integration.helpers import callbox

TOKEN_LINE = "alice:" + "d" * 32 + "\n"


def _config(tmp_path: Path) -> Path:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN_LINE)
    tokens.chmod(0o600)
    config = tmp_path / "callbox.toml"
    config.write_text('[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "tokens"\n')
    return config


def test_the_written_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze is missing (Debian's systemd package)")
    config = _config(tmp_path)
    units = tmp_path / "units"
    result = callbox("service", "install", "--config", str(config), "--unit-dir", str(units))
    assert result.returncode == 0, result.stderr
    assert b"systemctl daemon-reload && systemctl enable --now callbox" in result.stderr
    unit = units / "callbox.service"
    text = unit.read_text()
    assert "Type=notify\n" in text and "ExecReload=/bin/kill -HUP $MAINPID\n" in text
    assert f"serve --config {config}\n" in text
    for hardening in ("NoNewPrivileges=yes", "ProtectSystem=full", "ProtectHome=yes", "ProtectKernelModules=yes"):
        assert f"\n{hardening}\n" in text
    assert oct(unit.stat().st_mode & 0o777) == "0o644"
    # systemd's own parser: an unknown key or a bad value is a warning on stderr (exit 0)
    verified = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    # the ExecStart it names is a real callbox that accepts the configuration
    command = next(line for line in text.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart=")
    program = command.split(" serve --config ")[0]
    checked = subprocess.run(f"{program} config check {config}", shell=True, capture_output=True, timeout=120)
    assert checked.returncode == 0, checked.stderr


def test_a_configuration_that_cannot_start_writes_no_unit(tmp_path: Path) -> None:
    config = _config(tmp_path)
    config.write_text('[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "absent"\n')
    units = tmp_path / "units"
    result = callbox("service", "install", "--config", str(config), "--unit-dir", str(units))
    assert result.returncode == 2
    assert b"[auth] token_file = " in result.stderr and b"is not a file" in result.stderr
    assert not (units / "callbox.service").exists()


def test_print_shows_the_unit_and_writes_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = callbox("service", "install", "--config", str(config), "--unit-dir", str(tmp_path / "u"), "--print")
    assert result.returncode == 0
    assert result.stdout.startswith(b"# Written by `callbox service install`")
    assert not (tmp_path / "u").exists()
