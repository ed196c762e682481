"""SIGHUP's reload, as pure logic: what applies live (the limits, to each executor once),
what waits for a restart, and a refused file changing nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli.main import build_parser
from harness.cli.serve_reload import executors, reload
from harness.cli.server_config import ConfigError, apply_config
from harness.doors.grpc.sessions import Limits


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "callbox.toml"
    path.write_text(text)
    return path


def _started(*argv: str) -> tuple[argparse.Namespace, argparse.Namespace]:
    command_line = build_parser().parse_args(["serve", *argv])
    running = argparse.Namespace(**vars(command_line))
    apply_config(running)
    return command_line, running


def test_executors_are_found_behind_each_door_once() -> None:
    shared = SimpleNamespace(limits=Limits())
    own = SimpleNamespace(limits=Limits())
    servers = [SimpleNamespace(service=shared), SimpleNamespace(executor=shared), SimpleNamespace(executor=own),
               SimpleNamespace(url="http://mcp")]
    assert executors(servers) == [shared, own]


def test_limits_apply_live_and_other_changes_wait_for_a_restart(tmp_path: Path) -> None:
    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[limits]\nmax_per_client = 2\n')
    command_line, running = _started("--config", str(config))
    executor = SimpleNamespace(limits=Limits(max_sandboxes_per_client=2))
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:9999"\n[limits]\nmax_per_client = 5\n'
                      'max_sandboxes = 7\n')
    notes = reload(command_line, running, [SimpleNamespace(service=executor)])
    assert "limits.max_per_client: 2 -> 5, applied" in notes
    assert "limits.max_sandboxes: 64 -> 7, applied" in notes
    assert any(n.startswith("doors.mcp_http.listen: '127.0.0.1:8765' -> '127.0.0.1:9999' takes effect when the "
                            "server restarts") for n in notes), notes
    assert executor.limits == Limits(max_sandboxes_per_client=5, max_sandboxes_total=7)
    assert running.mcp_http == "127.0.0.1:8765"  # not applied: a later reload reports it again
    assert reload(command_line, running, [])[0].startswith("doors.mcp_http.listen:")


def test_a_flag_still_wins_over_the_reloaded_file(tmp_path: Path) -> None:
    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[limits]\nmax_per_client = 2\n')
    command_line, running = _started("--config", str(config), "--max-per-client", "3")
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[limits]\nmax_per_client = 9\n')
    assert reload(command_line, running, []) == ["SIGHUP: the configuration file is unchanged"]
    assert running.max_per_client == 3


def test_a_bad_file_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n')
    command_line, running = _started("--config", str(config))
    executor = SimpleNamespace(limits=Limits())
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[limits]\nmax_per_client = 0\n')
    with pytest.raises(ConfigError, match=r"limits\.max_per_client"):
        reload(command_line, running, [SimpleNamespace(service=executor)])
    assert executor.limits == Limits() and running.max_per_client == 16


def test_without_a_config_file_there_is_nothing_to_reload() -> None:
    command_line, running = _started("--grpc")
    assert reload(command_line, running, []) == [
        "SIGHUP: this server was started without --config, so there is nothing to reload"]


def test_log_applies_live_and_service_tables_wait_for_a_restart(tmp_path: Path) -> None:
    import logging

    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n')
    command_line, running = _started("--config", str(config))
    root = logging.getLogger()
    handlers, level = list(root.handlers), logging.getLogger("callbox").level
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[log]\nlevel = "error"\n'
                      '[http]\nlisten = "127.0.0.1:9464"\n[pool]\nsize = 1\n')
    try:
        notes = reload(command_line, running, [])
        assert logging.getLogger("callbox").level == logging.ERROR
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        logging.getLogger("callbox").setLevel(level)
    assert notes == ["http.listen: None -> '127.0.0.1:9464' takes effect when the server restarts; "
                     "the running doors keep None",
                     "[log]: changed, applied", "[pool]: changed; takes effect when the server restarts"]
    assert running.server_config.log.level == "error" and running.server_config.pool is None
    assert reload(command_line, running, [])[1] == "[pool]: changed; takes effect when the server restarts"


def test_quotas_apply_live_to_the_doors_keeper_when_they_or_the_per_client_limit_change(tmp_path: Path) -> None:
    from harness.cli.serve_quotas import door_quotas

    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[quotas]\ncalls_per_minute = 5\n'
                               '[limits]\nmax_per_client = 2\n')
    command_line, running = _started("--config", str(config))
    keeper = door_quotas(running.server_config, running.max_per_client)
    servers = [SimpleNamespace(service=SimpleNamespace(limits=Limits(), quotas=keeper))]
    assert (keeper.limits("alice").calls_per_minute, keeper.limits("alice").live_sandboxes) == (5, 2)
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[quotas]\ncalls_per_minute = 7\n'
                      '[limits]\nmax_per_client = 2\n')
    assert reload(command_line, running, servers) == ["[quotas]: changed, applied"]
    assert keeper.limits("alice").calls_per_minute == 7
    config.write_text('[doors.mcp_http]\nlisten = "127.0.0.1:8765"\n[quotas]\ncalls_per_minute = 7\n'
                      '[limits]\nmax_per_client = 3\n')
    assert reload(command_line, running, servers) == ["limits.max_per_client: 2 -> 3, applied"]
    assert keeper.limits("alice").live_sandboxes == 3  # the fallback moved with the limit
