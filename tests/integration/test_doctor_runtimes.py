"""`callbox doctor`'s runtime items on the real engine: the runtimes docker info lists, and
one sandbox started under runsc through the engine, judged and removed again."""

from __future__ import annotations

import pytest

from harness.doctor.checks import run_checks
from harness.doctor.runtimes import (
    RuntimeProbe,
    check_runsc,
    check_runtimes,
    judge_probe_output,
    probe_runsc,
    runtime_checks,
)
from harness.engine.docker import labels
from tests.conftest import unavailable

GVISOR_OUTPUT = ("--- proc_version\nLinux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"
                 "--- uname_v\n#1 SMP Sun Jan 10 15:06:54 PST 2016\n--- dmesg\n")
HOST_OUTPUT = ("--- proc_version\nLinux version 6.1.0-13-amd64 (debian-kernel@lists.debian.org) #1 SMP "
               "PREEMPT_DYNAMIC Debian 6.1.55-1\n--- uname_v\n#1 SMP PREEMPT_DYNAMIC Debian 6.1.55-1\n--- dmesg\n")


def test_runsc_absent_is_a_warning_naming_the_fix() -> None:
    info = {"Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc"}
    listed, runsc, network = runtime_checks(info)
    assert (listed.status, runsc.status, network.status) == ("PASS", "WARN", "SKIP")
    assert "runc (default runc)" in listed.reason
    assert "make runsc" in runsc.reason


def test_runsc_without_oci_seccomp_fails_before_any_probe() -> None:
    info = {"Runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=create", "--network=none"]}}}
    result = check_runsc(info, RuntimeProbe(True, "a sandbox started"))
    assert result.status == "FAIL" and "without --oci-seccomp" in result.reason and "make runsc" in result.reason


def test_runsc_configured_is_judged_by_its_probe() -> None:
    info = {"Runtimes": {"runc": {"path": "runc"},
                         "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=create", "--oci-seccomp"]}}}
    assert check_runsc(info, None).status == "WARN"
    healthy = check_runsc(info, RuntimeProbe(True, "a sandbox started in 0.9 s and the tools run on gVisor's kernel"))
    assert healthy.status == "PASS" and "--host-uds=create" in healthy.reason
    sick = check_runsc(info, RuntimeProbe(False, "the sandbox did not start: boom"))
    assert sick.status == "FAIL" and sick.reason.endswith("unhealthy: the sandbox did not start: boom")
    assert check_runtimes({}).status == "WARN"


def test_probe_output_must_show_gvisor() -> None:
    assert judge_probe_output(GVISOR_OUTPUT, "runsc") == (
        True, "the tools run on gVisor's kernel: uname -v '#1 SMP Sun Jan 10 15:06:54 PST 2016' inside the sandbox "
              "is gVisor's own; Docker records runtime runsc")
    healthy, shown = judge_probe_output(HOST_OUTPUT, "runsc", "#1 SMP PREEMPT_DYNAMIC Debian 6.1.55-1")
    assert not healthy and "this host's kernel" in shown and "Debian 6.1.55-1" in shown


@pytest.mark.docker
def test_doctor_lists_the_daemons_runtimes_and_probes_runsc(engine) -> None:  # type: ignore[no-untyped-def]
    info = engine.client.info()
    listed = check_runtimes(info)
    assert listed.status == "PASS" and "runc" in listed.reason
    if "runsc" not in (info.get("Runtimes") or {}):
        unavailable("the Docker engine has no runsc runtime (run `make runsc`)")
    mine = {"label": f"{labels.OWNER}={engine.owner.label()}"}  # this process's sandboxes only
    listed_before = {c["Id"] for c in engine.client.api.containers(all=True, filters=mine)}
    probe = probe_runsc(engine, info)
    assert probe is not None
    result = check_runsc(info, probe)
    # A runsc registered with --oci-seccomp (as `make runsc` does) works here: its command saw
    # gVisor's kernel, told by the version gVisor reports (dmesg is refused under --oci-seccomp).
    if "--oci-seccomp" in (info["Runtimes"]["runsc"].get("runtimeArgs") or []):
        assert result.status == "PASS", result
        assert "gVisor's kernel" in result.reason and "Docker records runtime runsc" in result.reason
        assert probe.start_s is not None
    else:
        assert result.status == "FAIL" and "--oci-seccomp" in result.reason
    assert result.id in {r.id for r in run_checks_with(info, probe)}
    # The probe's sandbox is gone again (its container is removed in the background).
    assert engine.drain(60.0)
    listed_after = {c["Id"] for c in engine.client.api.containers(all=True, filters=mine)}
    assert listed_after <= listed_before


def run_checks_with(info: dict[str, object], probe: RuntimeProbe) -> list[object]:
    """The runtime items as ``run_checks`` registers them (beside the others)."""
    from harness.doctor.evidence import Evidence

    return list(run_checks(Evidence(container={}, info=info, version={}, daemon_config={}), probe))
