"""`callbox doctor` on the real engine: the sandbox callbox starts passes every CIS section 5
item except those that depend only on the host, the output is valid JSON or one line per
check, the sandbox the doctor started is gone when it exits, the address-pool count
sees a network the engine allocates, and a sandbox under gVisor (`--runtime runsc`) passes,
with the checks that do not apply under gVisor said to be so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import docker.errors
import pytest

from harness.doctor.address_pools import (
    check_address_pools,
    configured_pools,
    host_networks,
    network_subnets,
    usage,
)
from harness.doctor.container_checks import APPARMOR_ABSENT, HOST_DEPENDENT_IDS, SELINUX_ABSENT
from harness.doctor.evidence import Evidence, read_daemon_config, read_host_networks
from harness.engine.docker.networks import POOLS_EXHAUSTED
from tests.conftest import unavailable
from tests.support.doctor_report import report_entries

pytestmark = pytest.mark.docker

HOST_REASONS = {"5.1": APPARMOR_ABSENT, "5.2": SELINUX_ABSENT}
LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (\S+) +(.+?): (.+)$")
POOLS_REASON = re.compile(r"^(\d+ more can start \(\d+ of \d+ address pools in use[;,] .*source: .+\)|unknown: .+)")


def _doctor(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the real CLI in a child process (``env`` over this one's; "" unsets a variable);
    return its result and pid (the sandbox owner)."""
    environ = {key: value for key, value in {**os.environ, **(env or {})}.items() if value != ""}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "doctor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def _owned_by(engine, pid: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [c["Id"] for c in engine.client.api.containers(all=True, filters={"label": "callbox.managed=1"})
            if f"/{pid}/" in c["Labels"].get("callbox.owner", "")]


def test_doctor_json_container_items_pass_and_the_sandbox_is_gone(engine):
    done, pid = _doctor("--json")
    assert done.returncode in (0, 1), done.stderr
    results = json.loads(done.stdout)
    assert isinstance(results, list) and results
    for item in results:
        assert set(item) == {"id", "title", "status", "reason", "scope"}, item
        assert item["status"] in ("PASS", "WARN", "FAIL", "SKIP")
        assert item["scope"] in ("engine", "container", "daemon", "host")
        assert item["reason"] and item["title"]
    container = [r for r in results if r["scope"] == "container"]
    assert {r["id"] for r in container} >= {
        "5.1", "5.2", "5.3", "5.4", "5.5", "5.7", "5.9", "5.10", "5.11", "5.12", "5.15", "5.16", "5.17", "5.19",
        "5.20", "5.21", "5.25", "5.28", "5.29", "5.30", "5.31",
    }
    for item in container:
        if item["id"] in HOST_DEPENDENT_IDS and item["status"] != "PASS":
            assert (item["status"], item["reason"]) == ("WARN", HOST_REASONS[item["id"]]), item
        else:
            assert item["status"] == "PASS", item
    pools = [r for r in results if r["id"] == "daemon.address-pools"]
    assert len(pools) == 1 and pools[0]["status"] in ("PASS", "WARN"), pools
    assert POOLS_REASON.match(pools[0]["reason"]), pools
    # Exit status: 1 exactly when some check fails (daemon and host items may, on other hosts).
    assert done.returncode == (1 if any(r["status"] == "FAIL" for r in results) else 0)
    assert _owned_by(engine, pid) == []



def test_doctor_text_prints_one_entry_per_check_and_a_summary_wrapped_to_80_columns(engine):
    """Not a terminal (a pipe): 80 columns; continuations indented under the check's text."""
    done, pid = _doctor(env={"COLUMNS": ""})
    assert done.returncode in (0, 1), done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 or " " not in line.strip() for line in lines), [ln for ln in lines if len(ln) > 80]
    indent = {len(line) - len(line.lstrip(" ")) for line in lines[:-2] if line.startswith(" ")}
    head = re.match(r"^(PASS|WARN|FAIL|SKIP)  \S+ +", lines[0])
    assert head and len(indent) == 1 and indent.pop() == head.end()
    entries = report_entries(done.stdout)
    checks, summary = entries[:-1], entries[-1]
    assert len(checks) >= 21
    parsed = [LINE.match(line) for line in checks]
    assert all(parsed), [line for line, m in zip(checks, parsed, strict=True) if not m]
    ids = [m.group(2) for m in parsed if m]
    assert len(ids) == len(set(ids))
    fails = sum(m.group(1) == "FAIL" for m in parsed if m)
    assert re.fullmatch(rf"callbox doctor: {len(checks)} checks, \d+ pass, \d+ warn, {fails} fail \(.+\)", summary)
    assert done.returncode == (1 if fails else 0)
    assert _owned_by(engine, pid) == []


def test_address_pools_count_the_network_the_engine_allocates(engine):
    """A bridge network created with no subnet gets one from the pools the check reads, and
    the count of pools in use includes it: exactly one more than without it."""
    client = engine.client
    config, note = read_daemon_config()
    try:
        created = client.api.create_network(f"callbox-test-pools-{os.getpid()}", driver="bridge",
                                            labels={"callbox.test": "doctor-address-pools"})
    except docker.errors.APIError as exc:
        if any(marker in str(exc) for marker in POOLS_EXHAUSTED):
            unavailable(f"the shared engine has no free address pool right now: {exc}")
        raise
    try:
        listing = tuple(client.api.networks())
        ev = Evidence(container={}, info=client.info(), version={}, daemon_config=config, daemon_config_note=note,
                      networks=listing, host_networks=read_host_networks())
        pools, source = configured_pools(ev)
        if pools is None:
            unavailable(f"this engine's address pools cannot be read: {source}")
        mine = network_subnets([n for n in listing if n["Id"] == created["Id"]])
        assert len(mine) == 1 and any(mine[0].subnet_of(p.base) for p in pools), (mine, pools, source)
        # Networks only: the bridge's own route on this host would block its subnet anyway.
        others = [n for n in listing if n["Id"] != created["Id"]]
        assert usage(pools, network_subnets(listing)).used == usage(pools, network_subnets(others)).used + 1
        with_it = usage(pools, network_subnets(listing), host_networks(ev.host_networks or ()))
        result = check_address_pools(ev)
        assert result.status in ("PASS", "WARN") and result.id == "daemon.address-pools"
        assert result.reason.startswith(f"{with_it.free} more can start ({with_it.used} of {with_it.total} address "
                                        "pools in use"), result.reason
    finally:
        client.api.remove_network(created["Id"])


def test_doctor_passes_a_working_gvisor_with_its_sandbox_under_runsc(engine):
    """The checked sandbox runs under runsc (registered with --oci-seccomp, so dmesg is refused in
    it): the runsc item passes on the kernel version gVisor reports, AppArmor, SELinux and the
    OOM counter are not applicable under gVisor, every other container item passes."""
    info = engine.client.info()
    if "runsc" not in (info.get("Runtimes") or {}):
        unavailable("the Docker engine has no runsc runtime (run `make runsc`)")
    done, pid = _doctor("--runtime", "runsc", "--json")
    assert done.returncode in (0, 1), done.stderr
    results = {r["id"]: r for r in json.loads(done.stdout)}
    assert results["engine.sandbox"]["status"] == "PASS" and "runtime runsc" in results["engine.sandbox"]["reason"]
    runsc = results["daemon.runsc"]
    assert runsc["status"] == "PASS", runsc
    assert "the tools run on gVisor's kernel" in runsc["reason"] and "Docker records runtime runsc" in runsc["reason"]
    assert results["daemon.runsc_network"]["status"] == "PASS", results["daemon.runsc_network"]  # make runsc's
    for check_id in ("5.1", "5.2", "host.oom-counter"):
        assert results[check_id]["status"] == "SKIP", results[check_id]
        assert results[check_id]["reason"].startswith("not applicable under gVisor: "), results[check_id]
    container = [r for r in results.values() if r["scope"] == "container" and r["id"] not in ("5.1", "5.2")]
    assert container and all(r["status"] == "PASS" for r in container), container
    assert done.returncode == (1 if any(r["status"] == "FAIL" for r in results.values()) else 0)
    assert _owned_by(engine, pid) == []
