"""`callbox doctor` tells gVisor from evidence that works under runsc with --oci-seccomp (the kernel
version gVisor reports, the runtime Docker recorded), and judges the checks that do not apply under
gVisor as such instead of failing them (no engine: hand-written evidence)."""

from __future__ import annotations

from dataclasses import replace

from harness.doctor.checks import run_checks
from harness.doctor.evidence import Evidence, gvisor_verdict, parse_probe, under_gvisor
from harness.doctor.gvisor import GVISOR_UNAME_VERSION, KernelSeen, judge
from harness.doctor.runtimes import RuntimeProbe, check_runsc, judge_probe_output, probe_from_evidence
from tests.unit.test_doctor import CALLBOX_SANDBOX, _callbox_evidence

HOST_VERSION = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.55-1 (2023-09-29)"
GVISOR_PROC = f"Linux version 4.4.0 {GVISOR_UNAME_VERSION}"
HOST_PROC = f"Linux version 6.1.0-13-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14)) {HOST_VERSION}"

# What the probe prints under runsc with --oci-seccomp: dmesg is refused (syslog is filtered), so its
# section is empty. This is the output the old check judged as "did not see gVisor's kernel".
UNDER_OCI_SECCOMP = f"--- proc_version\n{GVISOR_PROC}\n--- uname_v\n{GVISOR_UNAME_VERSION}\n--- dmesg\n"
UNDER_RUNC = f"--- proc_version\n{HOST_PROC}\n--- uname_v\n{HOST_VERSION}\n--- dmesg\n"
OLD_RUNSC_WITH_DMESG = "--- dmesg\n[    0.000000] Starting gVisor...\n[    0.1] Waiting for children...\n"
RUNSC_INFO = {"Runtimes": {"runc": {"path": "runc"},
                           "runsc": {"path": "/usr/bin/runsc",
                                     "runtimeArgs": ["--host-uds=create", "--network=none", "--oci-seccomp"]}}}
TOOL_STATUS = "CapEff:\t0000000000000000\nSeccomp:\t2\n"
"""gVisor's /proc/self/status of a tool process: no NoNewPrivs line."""


def test_gvisor_under_oci_seccomp_is_told_by_its_kernel_version() -> None:
    seen = parse_probe(UNDER_OCI_SECCOMP).kernel
    assert seen == KernelSeen(proc_version=GVISOR_PROC, uname_version=GVISOR_UNAME_VERSION, dmesg=None)
    verdict = judge(replace(seen, docker_runtime="runsc", host_version=HOST_VERSION))
    assert verdict.gvisor
    assert "uname -v '#1 SMP Sun Jan 10 15:06:54 PST 2016' inside the sandbox is gVisor's own" in verdict.reason
    assert f"not this host's {HOST_VERSION!r}" in verdict.reason and "Docker records runtime runsc" in verdict.reason


def test_proc_version_alone_is_enough() -> None:
    assert judge(KernelSeen(proc_version=GVISOR_PROC)).gvisor


def test_the_hosts_kernel_is_not_gvisor() -> None:
    seen = replace(parse_probe(UNDER_RUNC).kernel or KernelSeen(), docker_runtime="runsc", host_version=HOST_VERSION)
    verdict = judge(seen)
    assert not verdict.gvisor
    assert verdict.reason.startswith("the sandbox's tools saw this host's kernel") and "runtime runsc" in verdict.reason


def test_another_kernel_is_named_with_what_gvisor_would_say() -> None:
    verdict = judge(KernelSeen(uname_version="#2 SMP other", docker_runtime="runsc"))
    assert not verdict.gvisor and GVISOR_UNAME_VERSION in verdict.reason and "'#2 SMP other'" in verdict.reason


def test_dmesg_still_counts_when_it_is_readable() -> None:
    healthy, shown = judge_probe_output(OLD_RUNSC_WITH_DMESG, "runsc")
    assert healthy and "dmesg in the sandbox shows gVisor's boot log" in shown


def test_a_host_that_is_gvisor_itself_relies_on_dockers_record() -> None:
    inside = KernelSeen(uname_version=GVISOR_UNAME_VERSION, host_version=GVISOR_UNAME_VERSION)
    assert judge(replace(inside, docker_runtime="runsc")).gvisor
    verdict = judge(replace(inside, docker_runtime="runc"))
    assert not verdict.gvisor and "tells nothing" in verdict.reason


def test_no_kernel_section_is_no_verdict() -> None:
    assert parse_probe("CapEff:\t0\n").kernel is None
    assert judge_probe_output("") == (False, "the sandbox's command printed nothing of its kernel")


def test_the_users_report_a_working_gvisor_passes() -> None:
    """runsc with --oci-seccomp, its probe's dmesg refused: the runsc item passes (it failed)."""
    healthy, shown = judge_probe_output(UNDER_OCI_SECCOMP, "runsc", HOST_VERSION)
    result = check_runsc(RUNSC_INFO, RuntimeProbe(healthy, shown, 0.8))
    assert result.status == "PASS", result
    assert "--oci-seccomp" in result.reason and "gVisor's kernel" in result.reason


def _gvisor_evidence() -> Evidence:
    """The checked sandbox itself ran under runsc (``--runtime runsc``, or a policy's runtime)."""
    base = _callbox_evidence()
    container = {**CALLBOX_SANDBOX, "HostConfig": {**CALLBOX_SANDBOX["HostConfig"], "Runtime": "runsc"}}
    probe = parse_probe(TOOL_STATUS + "--- memory.oom_control\n--- memory.events\n" + UNDER_OCI_SECCOMP)
    return replace(base, container=container, probe=probe, info={**base.info, **RUNSC_INFO},
                   host_kernel=HOST_VERSION, start_s=0.9)


def test_checks_that_do_not_apply_under_gvisor_say_so_and_nothing_fails() -> None:
    ev = _gvisor_evidence()
    assert under_gvisor(ev)
    results = run_checks(ev, probe_from_evidence(ev))
    by_id = {r.id: r for r in results}
    for check_id in ("5.1", "5.2", "host.oom-counter"):
        assert by_id[check_id].status == "SKIP", by_id[check_id]
        assert by_id[check_id].reason.startswith("not applicable under gVisor: "), by_id[check_id]
    assert "stops the sandbox" in by_id["host.oom-counter"].reason
    assert by_id["5.25"].status == "PASS" and "gVisor's /proc does not show NoNewPrivs" in by_id["5.25"].reason
    assert by_id["5.21"].status == "PASS" and "filter mode observed" in by_id["5.21"].reason
    assert by_id["daemon.runsc"].status == "PASS", by_id["daemon.runsc"]
    assert by_id["daemon.runsc"].reason.startswith("a sandbox started in 0.9 s and the tools run on gVisor's kernel")
    assert [r for r in results if r.status == "FAIL"] == []


def test_a_runc_sandbox_is_judged_as_before() -> None:
    ev = replace(_callbox_evidence(), probe=parse_probe(TOOL_STATUS + "NoNewPrivs:\t1\n--- memory.oom_control\n"
                                                        "oom_kill 0\n" + UNDER_RUNC), host_kernel=HOST_VERSION)
    verdict = gvisor_verdict(ev)
    assert verdict is not None and not verdict.gvisor
    by_id = {r.id: r for r in run_checks(ev)}
    assert by_id["host.oom-counter"].status == "PASS"
    assert by_id["5.1"].status == "WARN"  # AppArmor absent on the host, as before
    assert probe_from_evidence(ev) is None  # not a runsc sandbox: the runsc item starts its own
