"""Our own reconnaissance probe (``probes/recon.py``) finds no route out of a sandbox.

The probe runs inside a fresh sandbox as the tool user, with the sandbox's python3, and
looks around the way container-escape tools do (mounted sockets, writable host paths,
capabilities, gateways and metadata addresses, kernel interfaces, cgroups, processes,
devices). Its report lists every finding that would matter; the test asserts there is
none, and also that the probe really looked (so an empty list is not a probe that saw
nothing).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import RUNTIME
from tests.integration.helpers import run
from tests.security.engines import NETWORKED, not_on_ray

pytestmark = pytest.mark.docker

PROBE = Path(__file__).with_name("probes") / "recon.py"
GVISOR = RUNTIME == "runsc"
GVISOR_FINDINGS = re.compile(
    r"/sys/fs/cgroup/\w+ \(cgroup\) is mounted read-write"  # its own cgroupfs; root's 0644 files
    r"|/dev/(fuse|net/tun) \(tmpfs\) opens for writing"  # its own emulated devices, see below
    r"|/dev holds more than the minimal set: \['fuse', 'net'\]"
    r"|/proc/[123]/(environ|maps) is readable|/proc/[123]/fd is listable"  # the agent's processes
)
"""What the probe reports under gVisor and not under runc, each explained in the README's
runtime section: gVisor's own cgroupfs is mounted read-write (its files are root's, so a
tool writes none, as test_attacks checks); its FUSE and TUN devices open, but mounting needs
``mount`` and a TUN interface CAP_NET_ADMIN, both refused; and its /proc lets a tool read the
environment and memory map of, and list the descriptors of, docker-init, the agent and its
spawner (pids 1-3), where runc's kernel refuses. Their memory stays refused, and so does
opening their descriptors beyond what the file's own permissions allow."""


def test_recon_probe_finds_no_route_out(sandbox):
    result = run(sandbox, ["python3", "-"], stdin=PROBE.read_bytes(), timeout_ms=60_000)
    assert result.exit_code == 0, result.stderr.data().decode(errors="replace")
    report = json.loads(result.stdout.data())
    facts = report["facts"]

    # the probe looked: as the tool user, across the tree, the mounts and the kernel
    assert facts["identity"]["uid"].split()[0] == "1000"
    assert facts["tree"]["entries"] > 1000 and not facts["tree"]["truncated"]
    assert len(facts["mounts"]) > 5
    # gVisor's kernel has a far smaller /sys and /proc/sys than a Linux host
    assert facts["kernel"]["/sys"]["entries"] > (50 if GVISOR else 1000)
    assert facts["kernel"]["/proc/sys"]["entries"] > (50 if GVISOR else 100)
    assert facts["processes"][0]["pid"] == 1

    # what it saw
    assert facts["network"]["interfaces"] == ["lo"]
    assert facts["network"]["routes"] == []
    # gVisor's network stack with only lo answers EHOSTUNREACH where the host's kernel says ENETUNREACH
    assert facts["network"]["probes"]["169.254.169.254:80"]["tcp"].startswith(
        "EHOSTUNREACH" if GVISOR else "ENETUNREACH")
    assert facts["network"]["vsock"] in ("EPERM", "EAFNOSUPPORT", "AF_VSOCK unknown to this python")
    assert facts["tree"]["socket_files"] == {}
    assert set(facts["unix_sockets"].values()) <= {"refused: EACCES", "refused: ECONNREFUSED", "refused: ENOENT"}
    assert facts["tree"]["writable_dirs"] == []
    assert set(facts["tree"]["writable_files"]) <= ({"/dev/fuse", "/dev/net/tun"} if GVISOR else set())
    assert set(facts["tree"]["private_writable"]) <= {"/dev/shm", "/dev/mqueue"}
    assert facts["user_namespace"] == "EPERM"
    caps = facts["identity"]["capabilities"]
    assert caps["CapPrm"] == caps["CapEff"] == "0000000000000000"
    # gVisor's status has no CapAmb line
    assert {caps[k] for k in ("CapInh", "CapAmb") if caps[k] or not GVISOR} == {"0000000000000000"}
    assert facts["identity"]["no_new_privs"] == "1"

    # and the verdict: nothing that would matter (under gVisor, only what GVISOR_FINDINGS explains)
    findings = report["findings"]
    if GVISOR:
        findings = [f for f in findings if not GVISOR_FINDINGS.fullmatch(f["detail"])]
    assert findings == [], json.dumps(findings, indent=1)


@not_on_ray(NETWORKED)
def test_recon_probe_in_an_allowlist_sandbox_finds_only_its_proxy(net_engine):
    """With ``network = "allowlist"`` the sandbox has an interface and routes by design
    (Docker gives even an internal network a default route to its gateway); the probe must
    still connect to nothing (Docker's resolver in its own namespace aside, which resolves
    no outside name): every packet it sends off its subnet is dropped on this host, and the
    gateway is the host, which drops everything from a callbox bridge."""
    from harness.engine.spec import SandboxSpec
    from tests.conftest import IMAGE, RUNTIME

    box = net_engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, network="allowlist",
                                        allow_hosts=("dest.callbox.test:8080",)))
    try:
        result = run(box, ["python3", "-"], stdin=PROBE.read_bytes(), timeout_ms=180_000)
    finally:
        box.destroy()
    assert result.exit_code == 0, result.stderr.data().decode(errors="replace")
    report = json.loads(result.stdout.data())
    network = report["facts"]["network"]
    assert network["interfaces"] == ["eth0", "lo"]
    assert network["routes"] and all(route[0] == "eth0" for route in network["routes"]), network["routes"]
    assert network["nameservers"] == ["127.0.0.11"]
    connected = sorted(target for target, outcome in network["probes"].items() if outcome["tcp"] == "connected")
    assert connected in ([], ["127.0.0.11:53"]), network["probes"]
    expected = {"interface", "route", "reachable"}  # reachable: dropped (timeouts) or datagrams that left the socket
    findings = report["findings"]
    if GVISOR:  # as in network none (test_recon_probe_finds_no_route_out)
        findings = [f for f in findings if not GVISOR_FINDINGS.fullmatch(f["detail"])]
    assert {f["check"] for f in findings} <= expected, json.dumps(findings, indent=1)
