"""`callbox doctor`'s engine items and its report when no engine answers or no sandbox starts
(hand-written evidence and real sockets in a temporary directory; no engine)."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

from harness.doctor import catalog
from harness.doctor.checks import NEEDS_SANDBOX, run_checks
from harness.doctor.engine_checks import check_reachable, check_sandbox, unreachable_cause, unreachable_report
from tests.unit.test_doctor import _callbox_evidence

ERROR = "Error while fetching server API version: ('Connection aborted.', FileNotFoundError(2))"


def test_a_missing_socket_is_named_with_its_path(tmp_path: Path) -> None:
    cause = unreachable_cause(f"unix://{tmp_path}/docker.sock", ERROR)
    assert cause == f"there is no socket at {tmp_path}/docker.sock: dockerd is not running, or DOCKER_HOST names " \
                    "the wrong path"


def test_a_file_that_is_no_socket(tmp_path: Path) -> None:
    (tmp_path / "docker.sock").write_text("")
    assert unreachable_cause(f"unix://{tmp_path}/docker.sock", ERROR).endswith("is not a socket: DOCKER_HOST names "
                                                                               "the wrong path")


def test_a_stale_socket_nobody_listens_on(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays; nothing listens
    cause = unreachable_cause(f"unix://{path}", "Connection refused")
    assert cause == f"nothing answers on {path} (Connection refused): dockerd stopped, or is still starting"


def test_a_tcp_engine_says_what_the_client_said() -> None:
    assert unreachable_cause("tcp://10.0.0.5:2376", "timed out") == "no answer from tcp://10.0.0.5:2376 (timed out)"


def test_the_engine_item_names_the_cause_the_fix_and_docker_host(tmp_path: Path) -> None:
    result = check_reachable(None, ERROR, {})
    assert result.status == "FAIL" and result.id == "engine.reachable" and result.scope == "engine"
    assert "/var/run/docker.sock" in result.reason
    assert "`sudo systemctl start docker`, or `make engine`" in result.reason
    assert "DOCKER_HOST is not set, so the default unix:///var/run/docker.sock" in result.reason
    host = f"unix://{tmp_path}/x.sock"
    assert f"(DOCKER_HOST={host})" in check_reachable(None, ERROR, {"DOCKER_HOST": host}).reason
    answered = check_reachable({"Version": "20.10.24", "ApiVersion": "1.41"}, None, {})
    assert (answered.status, answered.reason) == ("PASS", "Docker 20.10.24 (API 1.41) at unix:///var/run/docker.sock")


def test_the_sandbox_item() -> None:
    container = {"Config": {"Image": "callbox-sandbox:latest"}, "HostConfig": {"Runtime": "runsc"}}
    started = check_sandbox(container, 0.42)
    assert (started.status, started.reason) == ("PASS", "image callbox-sandbox:latest, runtime runsc, its agent "
                                                        "answered in 0.4 s")
    failed = check_sandbox({}, None, "image callbox-sandbox:latest not found; run `callbox image build`")
    assert failed.status == "FAIL" and "callbox image build" in failed.reason


def test_unreachable_report_lists_every_check_in_order_and_skips_those_that_need_the_engine() -> None:
    results = unreachable_report(ERROR, {"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert [r.id for r in results] == catalog.docker_ids()
    by_id = {r.id: r for r in results}
    assert by_id["engine.reachable"].status == "FAIL"
    for item in catalog.CHECKS:
        if item.id not in by_id or item.id == "engine.reachable":
            continue
        skipped = by_id[item.id].status == "SKIP"
        assert skipped == (item.needs in ("engine", "sandbox")), (item, by_id[item.id])


def test_no_sandbox_skips_the_checks_of_a_sandbox_and_judges_the_rest() -> None:
    ev = replace(_callbox_evidence(), container={}, probe=None, start_s=None,
                 sandbox_problem="image callbox-sandbox:latest not found; run `callbox image build`")
    results = run_checks(ev)
    by_id = {r.id: r for r in results}
    assert by_id["engine.sandbox"].status == "FAIL"
    for item in catalog.CHECKS:
        if item.needs == "sandbox" and item.id != "engine.sandbox":
            assert (by_id[item.id].status, by_id[item.id].reason) == ("SKIP", f"skipped: {NEEDS_SANDBOX}")
    assert by_id["daemon.runc"].status == "PASS" and by_id["host.seccomp"].status == "PASS"


def test_the_catalog_is_what_the_checks_report() -> None:
    results = run_checks(_callbox_evidence())
    assert [r.id for r in results] == catalog.docker_ids()
    for result in results:
        entry = catalog.info(result.id)
        assert (result.title, result.scope) == (entry.title, entry.scope)
    assert len({i.id for i in catalog.CHECKS}) == len(catalog.CHECKS)
    assert all(i.checks and i.fix for i in catalog.CHECKS)
    table = catalog.markdown().splitlines()
    assert len(table) == len(catalog.CHECKS) + 2 and table[2].startswith("| `engine.reachable` ")
