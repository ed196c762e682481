"""`callbox doctor`'s checks, each against hand-written inspect / info / version dicts (no engine)."""

from __future__ import annotations

import json
import re

import pytest

from harness.cli.main import main
from harness.doctor.checks import run_checks
from harness.doctor.container_checks import (
    APPARMOR_ABSENT,
    SELINUX_ABSENT,
    check_apparmor,
    check_capabilities,
    check_cgroup_parent,
    check_cpu,
    check_default_bridge,
    check_devices,
    check_engine_socket,
    check_host_ipc,
    check_host_network,
    check_host_pid,
    check_host_userns,
    check_host_uts,
    check_memory,
    check_mount_propagation,
    check_no_new_privileges,
    check_pids_limit,
    check_privileged,
    check_privileged_ports,
    check_read_only_root,
    check_seccomp,
    check_selinux,
    check_sensitive_mounts,
    check_ulimits,
)
from harness.doctor.daemon_checks import (
    check_cgroup_limits,
    check_daemon_no_new_privileges,
    check_live_restore,
    check_log_size,
    check_oom_counter,
    check_runc,
    check_seccomp_available,
    check_userns_remap,
    runc_version,
)
from harness.doctor.evidence import Evidence, Probe, parse_probe, read_daemon_config, security_opts
from harness.doctor.report import render_text
from tests.support.doctor_report import report_entries

INFO_PLAIN = {"SecurityOptions": ["name=seccomp,profile=default"]}
"""docker info of a host with seccomp and nothing else (this repository's CI engine)."""
INFO_APPARMOR = {"SecurityOptions": ["name=apparmor", "name=seccomp,profile=default"]}
INFO_SELINUX = {"SecurityOptions": ["name=seccomp,profile=default", "name=selinux"]}
INFO_NO_SECCOMP: dict[str, object] = {"SecurityOptions": []}

TOOL_PROBE = Probe(status={"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"},
                   oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 0")

# What `docker inspect` says about a sandbox callbox started (abridged to the keys the checks read).
CALLBOX_SANDBOX = {
    "AppArmorProfile": "",
    "ProcessLabel": "",
    "Mounts": [{"Type": "bind", "Source": "/run/callbox/660828300d3f", "Destination": "/run/callbox",
                "Mode": "", "RW": True, "Propagation": "rprivate"}],
    "HostConfig": {
        "LogConfig": {"Type": "json-file", "Config": {}},
        "NetworkMode": "none",
        "PortBindings": None,
        "CapAdd": ["SETUID", "SETGID", "KILL"],
        "CapDrop": ["ALL"],
        "IpcMode": "private",
        "PidMode": "",
        "Privileged": False,
        "ReadonlyRootfs": True,
        "SecurityOpt": ["no-new-privileges:true", 'seccomp={"defaultAction":"SCMP_ACT_ERRNO"}'],
        "Tmpfs": {"/tmp": "rw,nosuid,nodev,size=134217728,mode=1777",
                  "/workspace": "rw,nosuid,nodev,size=268435456,mode=0755,uid=1000,gid=1000"},
        "UTSMode": "",
        "UsernsMode": "",
        "CpuShares": 0,
        "Memory": 536870912,
        "NanoCpus": 1000000000,
        "CgroupParent": "",
        "CpuPeriod": 0,
        "CpuQuota": 0,
        "Devices": None,
        "DeviceCgroupRules": None,
        "DeviceRequests": None,
        "MemorySwap": 536870912,
        "PidsLimit": 320,
        "Ulimits": [{"Name": "nofile", "Hard": 1024, "Soft": 1024}, {"Name": "core", "Hard": 0, "Soft": 0}],
    },
    "NetworkSettings": {"Ports": {}, "Networks": {"none": {"NetworkID": "df5d63c0"}}},
}


# ---- SecurityOpt parsing --------------------------------------------------------------------


def test_security_opts_accepts_every_spelling():
    container = {"HostConfig": {"SecurityOpt": [
        "no-new-privileges", "seccomp={\"a\":\"b:c\"}", "label=type:svirt_t", "apparmor:unconfined",
    ]}}
    assert security_opts(container) == {
        "no-new-privileges": "true", "seccomp": '{"a":"b:c"}', "label": "type:svirt_t", "apparmor": "unconfined",
    }
    assert security_opts({"HostConfig": {"SecurityOpt": None}}) == {}


# ---- 5.1 / 5.2: AppArmor and SELinux ----------------------------------------------------------


def test_apparmor_absent_on_the_host_is_a_host_dependent_warning():
    result = check_apparmor({"AppArmorProfile": ""}, INFO_PLAIN)
    assert (result.id, result.status, result.reason, result.scope) == ("5.1", "WARN", APPARMOR_ABSENT, "container")
    assert result.reason == "AppArmor is not available on this host (host-dependent)"


def test_apparmor_profile_applied_passes():
    result = check_apparmor({"AppArmorProfile": "docker-default", "HostConfig": {}}, INFO_APPARMOR)
    assert result.status == "PASS" and "docker-default" in result.reason


def test_apparmor_available_but_unconfined_fails():
    assert check_apparmor({"AppArmorProfile": "", "HostConfig": {}}, INFO_APPARMOR).status == "FAIL"
    unconfined = {"AppArmorProfile": "unconfined", "HostConfig": {"SecurityOpt": ["apparmor=unconfined"]}}
    assert check_apparmor(unconfined, INFO_APPARMOR).status == "FAIL"


def test_selinux_absent_warns_with_the_host_reason():
    result = check_selinux({"ProcessLabel": ""}, INFO_PLAIN)
    assert (result.id, result.status, result.reason) == ("5.2", "WARN", SELINUX_ABSENT)


def test_selinux_label_passes_and_disabled_label_fails():
    labelled = {"ProcessLabel": "system_u:system_r:container_t:s0:c1,c2", "HostConfig": {"SecurityOpt": []}}
    assert check_selinux(labelled, INFO_SELINUX).status == "PASS"
    disabled = {"ProcessLabel": "", "HostConfig": {"SecurityOpt": ["label=disable"]}}
    assert check_selinux(disabled, INFO_SELINUX).status == "FAIL"


# ---- 5.3 / 5.4: capabilities, privileged ------------------------------------------------------


def test_capabilities_of_the_agent_only_pass():
    container = {"HostConfig": {"CapAdd": ["SETUID", "SETGID", "KILL"], "CapDrop": ["ALL"]}}
    result = check_capabilities(container, TOOL_PROBE)
    assert result.status == "PASS"
    assert "SETUID, SETGID, KILL" in result.reason and "tool processes run with none" in result.reason


def test_any_other_added_capability_fails():
    container = {"HostConfig": {"CapAdd": ["SETUID", "cap_net_admin"], "CapDrop": ["ALL"]}}
    result = check_capabilities(container)
    assert result.status == "FAIL" and "NET_ADMIN" in result.reason
    assert check_capabilities({"HostConfig": {"CapAdd": ["ALL"], "CapDrop": ["ALL"]}}).status == "FAIL"


def test_not_dropping_all_capabilities_fails():
    result = check_capabilities({"HostConfig": {"CapAdd": None, "CapDrop": ["NET_RAW"]}})
    assert result.status == "FAIL" and "not all capabilities are dropped" in result.reason


def test_a_tool_process_with_capabilities_fails():
    probe = Probe(status={"CapEff": "00000000000000c0"})
    container = {"HostConfig": {"CapAdd": ["SETUID", "SETGID", "KILL"], "CapDrop": ["ALL"]}}
    result = check_capabilities(container, probe)
    assert result.status == "FAIL" and "00000000000000c0" in result.reason


def test_privileged():
    assert check_privileged({"HostConfig": {"Privileged": False}}).status == "PASS"
    assert check_privileged({"HostConfig": {"Privileged": True}}).status == "FAIL"


# ---- 5.5 / 5.19 / 5.31: mounts ------------------------------------------------------------------


def test_socket_directory_and_project_mounts_are_not_sensitive():
    container = {"Mounts": [
        {"Type": "bind", "Source": "/run/callbox/abc", "Destination": "/run/callbox", "RW": True},
        {"Type": "bind", "Source": "/home/ann/project", "Destination": "/workspace", "RW": True},
        {"Type": "bind", "Source": "/usr/local/share/data", "Destination": "/data", "RW": False},
    ]}
    assert check_sensitive_mounts(container).status == "PASS"


@pytest.mark.parametrize("source", ["/", "/etc", "/etc/shadow", "/proc/sys", "/sys", "/dev/sda", "/usr", "/lib"])
def test_sensitive_host_paths_fail_even_read_only(source):
    container = {"Mounts": [{"Type": "bind", "Source": source, "Destination": "/host", "RW": False}]}
    result = check_sensitive_mounts(container)
    assert result.status == "FAIL" and source in result.reason and "(ro)" in result.reason


def test_volumes_are_not_host_directories():
    container = {"Mounts": [{"Type": "volume", "Source": "/var/lib/docker/volumes/x/_data", "Destination": "/etc"}]}
    assert check_sensitive_mounts(container).status == "PASS"


def test_mount_propagation():
    private = {"Mounts": [{"Destination": "/run/callbox", "Propagation": "rprivate"}]}
    assert check_mount_propagation(private).status == "PASS"
    shared = {"Mounts": [{"Destination": "/data", "Propagation": "rshared"}]}
    result = check_mount_propagation(shared)
    assert result.status == "FAIL" and "/data (rshared)" in result.reason
    assert check_mount_propagation({"Mounts": [{"Destination": "/d", "Propagation": "rslave"}]}).status == "PASS"


def test_docker_socket_mount_fails():
    container = {"Mounts": [{"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/var/run/docker.sock"}]}
    assert check_engine_socket(container).status == "FAIL"
    renamed = {"Mounts": [{"Type": "bind", "Source": "/srv/engine/api", "Destination": "/x"}]}
    assert check_engine_socket(renamed).status == "PASS"
    assert check_engine_socket(renamed, ["/srv/engine/api"]).status == "FAIL"
    containerd = {"Mounts": [{"Source": "/run/containerd/containerd.sock", "Destination": "/c.sock"}]}
    assert check_engine_socket(containerd).status == "FAIL"


def test_agent_socket_directory_is_no_engine_socket():
    assert check_engine_socket(CALLBOX_SANDBOX, ["/var/run/docker.sock"]).status == "PASS"


# ---- 5.7 / 5.9 / 5.29: network ------------------------------------------------------------------


def test_no_published_ports_pass():
    assert check_privileged_ports({"NetworkSettings": {"Ports": {}}, "HostConfig": {"PortBindings": None}}).status \
        == "PASS"


def test_privileged_host_port_fails_and_high_port_passes():
    low = {"NetworkSettings": {"Ports": {"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "80"}]}}}
    result = check_privileged_ports(low)
    assert result.status == "FAIL" and "80/tcp on host port 80" in result.reason
    high = {"HostConfig": {"PortBindings": {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8080"}]}}}
    assert check_privileged_ports(high).status == "PASS"


def test_host_network():
    assert check_host_network({"HostConfig": {"NetworkMode": "host"}}).status == "FAIL"
    assert check_host_network({"HostConfig": {"NetworkMode": "none"}}).status == "PASS"


def test_network_none_is_not_on_the_default_bridge():
    result = check_default_bridge({"HostConfig": {"NetworkMode": "none"},
                                   "NetworkSettings": {"Networks": {"none": {}}}})
    assert result.status == "PASS" and "not on the default bridge" in result.reason


@pytest.mark.parametrize("mode", ["default", "bridge"])
def test_default_bridge_fails(mode):
    container = {"HostConfig": {"NetworkMode": mode}, "NetworkSettings": {"Networks": {"bridge": {}}}}
    assert check_default_bridge(container).status == "FAIL"


def test_user_defined_network_passes():
    container = {"HostConfig": {"NetworkMode": "callbox-egress"},
                 "NetworkSettings": {"Networks": {"callbox-egress": {}}}}
    assert check_default_bridge(container).status == "PASS"


# ---- 5.10 / 5.11 / 5.28 / 5.18 / 5.24: resources ----------------------------------------------


def test_memory_limit_without_swap_passes():
    result = check_memory({"HostConfig": {"Memory": 536870912, "MemorySwap": 536870912}})
    assert result.status == "PASS" and "512 MiB, no swap" in result.reason


def test_no_memory_limit_fails():
    assert check_memory({"HostConfig": {"Memory": 0, "MemorySwap": 0}}).status == "FAIL"


def test_memory_limit_with_swap_warns():
    assert check_memory({"HostConfig": {"Memory": 536870912, "MemorySwap": -1}}).status == "WARN"
    doubled = check_memory({"HostConfig": {"Memory": 536870912, "MemorySwap": 1073741824}})
    assert doubled.status == "WARN" and "512 MiB of swap" in doubled.reason


def test_cpu():
    assert check_cpu({"HostConfig": {"NanoCpus": 1500000000}}).reason == "1.5 CPU(s)"
    assert check_cpu({"HostConfig": {"CpuShares": 512}}).status == "PASS"
    assert check_cpu({"HostConfig": {"CpuQuota": 50000, "CpuPeriod": 100000}}).status == "PASS"
    assert check_cpu({"HostConfig": {"CpuShares": 0, "NanoCpus": 0, "CpuQuota": 0}}).status == "FAIL"


def test_pids_limit():
    assert check_pids_limit({"HostConfig": {"PidsLimit": 320}}).status == "PASS"
    for unlimited in (None, 0, -1):
        assert check_pids_limit({"HostConfig": {"PidsLimit": unlimited}}).status == "FAIL"


def test_ulimits():
    assert check_ulimits({"HostConfig": {"Ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}]}}).reason == "core=0"
    assert check_ulimits({"HostConfig": {"Ulimits": None}}).status == "WARN"


def test_cgroup_parent():
    assert check_cgroup_parent({"HostConfig": {"CgroupParent": ""}}).status == "PASS"
    assert check_cgroup_parent({"HostConfig": {"CgroupParent": "/custom"}}).status == "WARN"


def test_devices():
    assert check_devices({"HostConfig": {"Devices": None, "DeviceRequests": None}}).status == "PASS"
    exposed = {"HostConfig": {"Devices": [{"PathOnHost": "/dev/fuse", "PathInContainer": "/dev/fuse",
                                           "CgroupPermissions": "rwm"}]}}
    result = check_devices(exposed)
    assert result.status == "FAIL" and "/dev/fuse" in result.reason
    gpu = {"HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "Count": -1}]}}
    assert check_devices(gpu).status == "FAIL"


# ---- 5.12 / namespaces ---------------------------------------------------------------------------


def test_read_only_root():
    assert check_read_only_root({"HostConfig": {"ReadonlyRootfs": True, "Tmpfs": {"/tmp": ""}}}).status == "PASS"
    assert check_read_only_root({"HostConfig": {"ReadonlyRootfs": False}}).status == "FAIL"


def test_pid_namespace():
    assert check_host_pid({"HostConfig": {"PidMode": ""}}).status == "PASS"
    assert check_host_pid({"HostConfig": {"PidMode": "host"}}).status == "FAIL"
    assert check_host_pid({"HostConfig": {"PidMode": "container:abc"}}).status == "WARN"


def test_ipc_namespace():
    assert check_host_ipc({"HostConfig": {"IpcMode": "private"}}).status == "PASS"
    assert check_host_ipc({"HostConfig": {"IpcMode": "host"}}).status == "FAIL"
    assert check_host_ipc({"HostConfig": {"IpcMode": "shareable"}}).status == "WARN"


def test_uts_namespace():
    result = check_host_uts({"HostConfig": {"UTSMode": ""}})
    assert (result.id, result.status) == ("5.20", "PASS")
    assert check_host_uts({"HostConfig": {"UTSMode": "host"}}).status == "FAIL"


def test_user_namespace_flag():
    assert check_host_userns({"HostConfig": {"UsernsMode": ""}}).status == "PASS"
    assert check_host_userns({"HostConfig": {"UsernsMode": "host"}}).status == "FAIL"


# ---- 5.21 / 5.25: seccomp and no-new-privileges --------------------------------------------------


def test_callbox_seccomp_profile_is_recognised():
    profile = '{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[]}'
    container = {"HostConfig": {"SecurityOpt": ['seccomp={"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}']}}
    result = check_seccomp(container, INFO_PLAIN, TOOL_PROBE, expected_profile=profile)
    assert result.status == "PASS" and "io_uring" in result.reason and "filter mode observed" in result.reason


def test_seccomp_unconfined_fails():
    container = {"HostConfig": {"SecurityOpt": ["seccomp=unconfined"]}}
    assert check_seccomp(container, INFO_PLAIN).status == "FAIL"
    assert check_seccomp({"HostConfig": {"SecurityOpt": ["seccomp:unconfined"]}}, INFO_PLAIN).status == "FAIL"


def test_seccomp_without_daemon_support_fails():
    assert check_seccomp({"HostConfig": {"SecurityOpt": []}}, INFO_NO_SECCOMP).status == "FAIL"


def test_seccomp_mode_of_a_tool_process_must_be_filter():
    container = {"HostConfig": {"SecurityOpt": ["seccomp={}"]}}
    assert check_seccomp(container, INFO_PLAIN, Probe(status={"Seccomp": "0"})).status == "FAIL"


def test_docker_default_seccomp_profile_warns_about_io_uring():
    result = check_seccomp({"HostConfig": {"SecurityOpt": ["no-new-privileges"]}}, INFO_PLAIN)
    assert result.status == "WARN" and "io_uring" in result.reason


def test_no_new_privileges():
    set_here = {"HostConfig": {"SecurityOpt": ["no-new-privileges:true"]}}
    assert check_no_new_privileges(set_here, TOOL_PROBE).status == "PASS"
    unset: dict[str, object] = {"HostConfig": {"SecurityOpt": []}}
    assert check_no_new_privileges(unset).status == "FAIL"
    assert check_no_new_privileges(unset, daemon_config={"no-new-privileges": True}).status == "PASS"
    assert check_no_new_privileges(set_here, Probe(status={"NoNewPrivs": "0"})).status == "FAIL"
    assert check_no_new_privileges({"HostConfig": {"SecurityOpt": ["no-new-privileges=false"]}}).status == "FAIL"


# ---- daemon -------------------------------------------------------------------------------------


def test_userns_remap():
    assert check_userns_remap({"SecurityOptions": ["name=seccomp,profile=default", "name=userns"]}).status == "PASS"
    assert check_userns_remap({"SecurityOptions": ["name=seccomp,profile=default", "name=rootless"]}).status == "PASS"
    off = check_userns_remap(INFO_PLAIN)
    assert (off.id, off.status, off.scope) == ("daemon.userns", "WARN", "daemon")
    assert "uid 0 on the host" in off.reason


def test_live_restore():
    assert check_live_restore({"LiveRestoreEnabled": True}).status == "PASS"
    assert check_live_restore({"LiveRestoreEnabled": False}).status == "WARN"


def test_daemon_no_new_privileges():
    assert check_daemon_no_new_privileges({"no-new-privileges": True}).status == "PASS"
    absent = check_daemon_no_new_privileges({}, "no /etc/docker/daemon.json: the daemon runs on its defaults")
    assert absent.status == "WARN" and "no /etc/docker/daemon.json" in absent.reason
    assert "callbox sets it on every sandbox anyway" in absent.reason
    other = check_daemon_no_new_privileges({"live-restore": True})
    assert other.status == "WARN" and "does not set" in other.reason
    unreadable = check_daemon_no_new_privileges(None, "/etc/docker/daemon.json not readable: Permission denied")
    assert unreadable.status == "WARN" and "Permission denied" in unreadable.reason


def test_log_size():
    unlimited = {"HostConfig": {"LogConfig": {"Type": "json-file", "Config": {}}}}
    assert check_log_size(unlimited, {"LoggingDriver": "json-file"}, {}).status == "WARN"
    limited = {"HostConfig": {"LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}}}}
    result = check_log_size(limited, {"LoggingDriver": "json-file"}, None)
    assert result.status == "PASS" and "max-size 10m, max-file 3" in result.reason
    from_daemon_json = check_log_size(unlimited, {}, {"log-opts": {"max-size": "20m"}})
    assert from_daemon_json.status == "PASS"
    assert check_log_size({"HostConfig": {"LogConfig": {"Type": "local"}}}, {}, None).status == "PASS"
    assert check_log_size({"HostConfig": {"LogConfig": {"Type": "none"}}}, {}, None).status == "PASS"
    assert check_log_size({"HostConfig": {}}, {"LoggingDriver": "journald"}, None).status == "PASS"


# ---- runc ---------------------------------------------------------------------------------------

DEBIAN_CHANGELOG = """runc (1.1.5+ds1-1+deb12u1) bookworm-security; urgency=high

  * Team upload.
  * CVE-2024-21626: several container breakouts due to internally leaked fds

 -- Shengjing Zhu <zhsj@debian.org>  Fri, 02 Feb 2024 21:53:05 +0800

runc (1.1.5+ds1-1) unstable; urgency=medium

  * New upstream version 1.1.5+ds1
    + CVE-2023-25809: rootless: `/sys/fs/cgroup` is writable when cgroupns isn't unshared
"""


def test_runc_version_from_docker_version_components():
    version = {"Components": [
        {"Name": "Engine", "Version": "20.10.24+dfsg1"},
        {"Name": "runc", "Version": "1.1.5+ds1", "Details": {"GitCommit": "1.1.5+ds1-1+deb12u1"}},
    ]}
    assert runc_version(version, {}) == ("1.1.5+ds1", "1.1.5+ds1-1+deb12u1")


def test_runc_version_from_info_then_cli():
    assert runc_version({"Components": []}, {"RuncCommit": {"ID": "v1.1.12-0-g51d5e94"}}) == (
        "1.1.12-0-g51d5e94", "v1.1.12-0-g51d5e94")
    cli = "runc version 1.2.8\ncommit: v1.2.8-0-g0f9e8a7\nspec: 1.2.1\n"
    assert runc_version({}, {"RuncCommit": {"ID": "N/A"}}, cli) == ("1.2.8", "v1.2.8-0-g0f9e8a7")
    assert runc_version({}, {}) is None


@pytest.mark.parametrize(("version", "status"), [
    ("1.1.11", "FAIL"),
    ("1.0.0-rc93", "FAIL"),
    ("1.1.12", "WARN"),
    ("1.1.15", "WARN"),
    ("1.2.7", "WARN"),
    ("1.2.8", "PASS"),
    ("1.3.2", "WARN"),
    ("1.3.3", "PASS"),
    ("1.4.0-rc.2", "WARN"),
    ("1.4.0-rc.3", "PASS"),
    ("1.4.0", "PASS"),
    ("1.5.1", "PASS"),
])
def test_upstream_runc_versions_against_the_escape_fixes(version, status):
    result = check_runc((version, f"v{version}-0-gabcdef0"))
    assert (result.id, result.status, result.scope) == ("daemon.runc", status, "daemon"), result.reason


def test_leaky_vessels_reason_names_the_cve():
    result = check_runc(("1.1.11", ""))
    assert "CVE-2024-21626" in result.reason and "1.1.12" in result.reason


def test_2025_reason_names_the_cves_and_why_it_is_a_warning():
    result = check_runc(("1.2.7", ""))
    for cve in ("CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"):
        assert cve in result.reason
    assert "1.2.8, 1.3.3, 1.4.0-rc.3" in result.reason and "Upgrade runc" in result.reason


def test_debian_build_with_its_changelog_gets_credit_for_the_backport():
    result = check_runc(("1.1.5+ds1", "1.1.5+ds1-1+deb12u1"), DEBIAN_CHANGELOG)
    assert result.status == "WARN"
    assert "CVE-2024-21626 fixed by the distribution" in result.reason and "CVE-2025-31133" in result.reason


def test_debian_build_whose_changelog_lacks_the_fix_fails():
    unpatched = """runc (1.1.5+ds1-1) unstable; urgency=medium

  * New upstream version 1.1.5+ds1
    + CVE-2023-25809: rootless: `/sys/fs/cgroup` is writable when cgroupns isn't unshared
"""
    result = check_runc(("1.1.5+ds1", "1.1.5+ds1-1"), unpatched)
    assert result.status == "FAIL" and "CVE-2024-21626" in result.reason


def test_distribution_build_without_a_readable_changelog_warns():
    result = check_runc(("1.1.5+ds1", "1.1.5+ds1-1+deb12u1"), None)
    assert result.status == "WARN" and "changelog could not be read" in result.reason


def test_changelog_of_another_build_is_ignored():
    result = check_runc(("1.1.5+ds1", "1.1.5+ds1-1+deb12u2"), DEBIAN_CHANGELOG)
    assert result.status == "WARN" and "could not be read" in result.reason


def test_distribution_changelog_with_every_fix_passes():
    changelog = ("runc (1.1.5+ds1-1+deb12u2) bookworm-security; urgency=high\n\n"
                 "  * CVE-2025-31133, CVE-2025-52565, CVE-2025-52881\n\n" + DEBIAN_CHANGELOG)
    assert check_runc(("1.1.5+ds1", "1.1.5+ds1-1+deb12u2"), changelog).status == "PASS"


def test_unknown_runc_version_warns():
    assert check_runc(None).status == "WARN"
    assert check_runc(("unknown", "")).status == "WARN"


# ---- host ---------------------------------------------------------------------------------------


def test_seccomp_available():
    assert check_seccomp_available(INFO_PLAIN).status == "PASS"
    assert check_seccomp_available(INFO_NO_SECCOMP).status == "FAIL"


def test_cgroup_limits():
    info = {"CgroupVersion": "1", "CgroupDriver": "cgroupfs", "MemoryLimit": True, "SwapLimit": True,
            "PidsLimit": True, "CpuCfsQuota": True}
    assert check_cgroup_limits(info).status == "PASS"
    no_swap = {"CgroupVersion": "2", "CgroupDriver": "systemd", "MemoryLimit": True, "SwapLimit": False,
               "PidsLimit": True, "CpuCfsQuota": True}
    result = check_cgroup_limits(no_swap)
    assert result.status == "FAIL" and "swap" in result.reason


def test_oom_counter_v1_v2_and_missing():
    assert check_oom_counter({"CgroupVersion": "1"}, TOOL_PROBE).status == "PASS"
    v2 = Probe(memory_events="low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert check_oom_counter({"CgroupVersion": "2"}, v2).status == "PASS"
    old_kernel = Probe(oom_control="oom_kill_disable 0\nunder_oom 0")
    assert check_oom_counter({"CgroupVersion": "1"}, old_kernel).status == "WARN"
    assert check_oom_counter({"CgroupVersion": "1"}, None).status == "WARN"


def test_parse_probe():
    text = ("CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
            "--- memory.oom_control\noom_kill_disable 0\nunder_oom 0\noom_kill 4\n--- memory.events\n")
    probe = parse_probe(text)
    assert probe.status == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
    assert probe.oom_control == "oom_kill_disable 0\nunder_oom 0\noom_kill 4"
    assert probe.memory_events is None


# ---- the whole report ---------------------------------------------------------------------------


def _callbox_evidence() -> Evidence:
    return Evidence(
        container=CALLBOX_SANDBOX,
        info={**INFO_PLAIN, "LiveRestoreEnabled": False, "LoggingDriver": "json-file", "CgroupVersion": "1",
              "CgroupDriver": "cgroupfs", "MemoryLimit": True, "SwapLimit": True, "PidsLimit": True,
              "CpuCfsQuota": True},
        version={"Components": [{"Name": "runc", "Version": "1.3.3", "Details": {"GitCommit": "v1.3.3-0-gd842d771"}}]},
        daemon_config={}, daemon_config_note="no /etc/docker/daemon.json: the daemon runs on its defaults",
        probe=TOOL_PROBE, expected_seccomp='{"defaultAction":"SCMP_ACT_ERRNO"}',
        engine_sockets=("/var/run/docker.sock",),
    )


def test_callbox_sandbox_passes_every_container_item_but_the_host_dependent_ones():
    results = run_checks(_callbox_evidence())
    container = [r for r in results if r.scope == "container"]
    assert [r.id for r in container] == [
        "5.1", "5.2", "5.3", "5.4", "5.5", "5.7", "5.9", "5.10", "5.11", "5.12", "5.15", "5.16", "5.17", "5.18",
        "5.19", "5.20", "5.21", "5.24", "5.25", "5.28", "5.29", "5.30", "5.31",
    ]
    assert {r.id: r.status for r in container if r.status != "PASS"} == {"5.1": "WARN", "5.2": "WARN"}
    by_id = {r.id: r for r in results}
    assert by_id["daemon.runc"].status == "PASS"
    assert by_id["5.21"].reason.startswith("callbox's profile")
    assert [r.scope for r in results[-3:]] == ["host", "host", "host"]



def test_text_and_json_rendering():
    results = run_checks(_callbox_evidence())
    entries = report_entries(render_text(results, width=80))
    assert len(entries) == len(results) + 1
    apparmor = entries[[r.id for r in results].index("5.1")]
    assert apparmor.startswith("WARN  5.1  ") and apparmor.endswith(": " + APPARMOR_ABSENT)
    assert entries[-1].startswith(f"callbox doctor: {len(results)} checks, ")
    assert re.search(r" 0 fail\b", entries[-1]) and "CIS Docker Benchmark v1.2.0" in entries[-1]
    payload = json.loads(json.dumps([r.to_json() for r in results]))
    assert set(payload[0]) == {"id", "title", "status", "reason", "scope"}


# ---- evidence gathering that needs no engine ----------------------------------------------------


def test_read_daemon_config(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    missing, note = read_daemon_config(tmp_path / "daemon.json")
    assert missing == {} and "daemon runs on its defaults" in note
    (tmp_path / "daemon.json").write_text('{"live-restore": true, "no-new-privileges": true}')
    assert read_daemon_config(tmp_path / "daemon.json") == ({"live-restore": True, "no-new-privileges": True}, "")
    (tmp_path / "daemon.json").write_text("{not json")
    broken, note = read_daemon_config(tmp_path / "daemon.json")
    assert broken is None and "not valid JSON" in note
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2376")
    remote, note = read_daemon_config(tmp_path / "daemon.json")
    assert remote is None and "remote" in note


def test_doctor_usage_errors_exit_2(capsys):
    assert main(["doctor", "--verbose-please"]) == 2
    assert "callbox: unrecognized arguments" in capsys.readouterr().err


def test_packet_filter_check() -> None:
    from harness.doctor.daemon_checks import check_packet_filter

    assert check_packet_filter(None, False).status == "PASS"
    refused = check_packet_filter("this harness runs as uid 1000", False)
    assert refused.status == "WARN" and "will be refused: this harness runs as uid 1000" in refused.reason
    remote = check_packet_filter(None, True)
    assert remote.status == "WARN" and "another host" in remote.reason
