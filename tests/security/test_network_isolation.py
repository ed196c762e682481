"""No sandbox reaches the host, another sandbox or a metadata service, in any network mode.

Each test has a control that shows the target is really there (the host reaches it, or
an open sandbox reaches the test destination), so a refusal is callbox's doing and not
a dead target. Destinations are the test session's own network namespace
(``tests/netdest.py``) and listeners this test opens; the only other address used is
169.254.169.254, to show no packet towards it leaves the sandbox.
``network = "none"`` is covered by ``test_attacks.test_metadata_address_is_unreachable``
(no interface but loopback at all).

Under gVisor (``CALLBOX_TEST_RUNTIME=runsc``) the same attacks come from a sandbox whose
TCP/IP is gVisor's own network stack. The suite's slowest run is that one, so each probe
tries all its targets at once in one command, and the test of the host's packet filter
alone (no sandbox traffic in it) runs under runc only.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.netfilter import FORWARD_CHAIN, INPUT_CHAIN
from harness.engine.docker.networks import network_name
from harness.engine.docker.runsc_dns import host_nameservers
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME
from tests.integration.helpers import run
from tests.netdest import HOST_ADDRESS, HTTP_PORT, connect_from, connect_many
from tests.security.engines import NETWORKED, not_on_ray

pytestmark = [
    pytest.mark.docker,
    not_on_ray(NETWORKED),
]

ALLOW = ("dest.callbox.test:8080",)


@pytest.fixture(scope="module")
def boxes(net_engine: DockerEngine) -> Iterator[dict[str, Any]]:
    """One open and one allowlist sandbox for the module (the attacks only read or fail)."""
    made: dict[str, Any] = {}
    try:
        made["open"] = net_engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, network="open"))
        made["allowlist"] = net_engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, network="allowlist",
                                                          allow_hosts=ALLOW))
        yield made
    finally:
        for box in made.values():
            box.destroy()


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on every host address; yields its port."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def _gateway(box: Any) -> str:
    config = box.engine.client.api.inspect_network(network_name(box.id))["IPAM"]["Config"][0]
    return str(config["Gateway"])


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses outside loopback (its LAN address, docker0, ...)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in found if not a.startswith("127.")]


@pytest.mark.parametrize("mode", ["open", "allowlist"])
def test_the_host_is_unreachable(boxes, mode, host_listener):
    box = boxes[mode]
    targets = sorted({_gateway(box), HOST_ADDRESS, *_host_addresses()})
    for address in targets:  # control: the listener answers on each of them from the host
        socket.create_connection((address, host_listener), timeout=2).close()
    outcomes = dict(zip(targets, connect_many(box, [(a, host_listener) for a in targets], timeout=1.5),
                        strict=True))
    assert all(outcome != "connected" for outcome in outcomes.values()), outcomes


@pytest.mark.parametrize("mode", ["open", "allowlist"])
def test_the_metadata_address_is_unreachable(boxes, mode, destination):
    box = boxes[mode]
    # control: the link-local stand-in answers the host, like a cloud metadata service
    with urllib.request.urlopen(f"http://{destination.metadata_standin}:{HTTP_PORT}/", timeout=5) as reply:
        assert reply.status == 200
    outcomes = connect_many(box, [(destination.metadata_standin, HTTP_PORT), ("169.254.169.254", 80)])
    assert "connected" not in outcomes, outcomes
    if mode == "allowlist":  # and the proxy will not go there for it
        for url in (f"http://{destination.metadata_standin}:{HTTP_PORT}/", "http://169.254.169.254/"):
            proxied = run(box, ["curl", "-sS", "-m", "10", "-w", "%{http_code}", "-o", "/dev/null", url],
                          env=box.spec.env, timeout_ms=30_000)
            assert proxied.stdout.data().decode() == "403", url


def test_open_mode_is_a_real_network(boxes, destination):
    """The control for the tests above: an open sandbox does reach the outside, and the
    allowlist sandbox its allowed host through its proxy."""
    assert connect_from(boxes["open"], destination.address, HTTP_PORT) == "connected"
    box = boxes["allowlist"]
    allowed = run(box, ["curl", "-sS", "-m", "10", "-w", "%{http_code}", "-o", "/dev/null",
                        f"http://{ALLOW[0]}/"], env=box.spec.env, timeout_ms=30_000)
    assert allowed.stdout.data().decode() == "200", allowed.stderr.data()
    if RUNTIME == "runsc":
        # gVisor's network stack cannot reach Docker's DNS server at 127.0.0.11: the sandbox
        # names the host's resolvers instead (read, not asked: no lookup leaves this test)
        resolv = run(boxes["open"], ["cat", "/etc/resolv.conf"]).stdout.data().decode()
        assert resolv == "".join(f"nameserver {server}\n" for server in host_nameservers()), resolv


@pytest.fixture(scope="module")
def listener(net_engine: DockerEngine) -> Iterator[tuple[Any, str]]:
    """An open sandbox listening on port 9000 of its own address, for the module; yields it
    and that address."""
    box = net_engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, network="open"))
    result: list[Any] = []
    server: threading.Thread | None = None
    address = box.container.attrs["NetworkSettings"]["Networks"][network_name(box.id)]["IPAddress"]
    try:
        serve = ("import socket\ns = socket.create_server(('0.0.0.0', 9000))\n"
                 "while s.accept()[0].recv(10) != b'bye':\n    pass\n")
        server = threading.Thread(target=lambda: result.append(run(box, ["python3", "-c", serve],
                                                                    timeout_ms=300_000)))
        server.start()
        # control: the listener is up (it answers on its own address)
        deadline = 50
        while connect_from(box, address, 9000, timeout=1) != "connected" and deadline:
            deadline -= 1
        assert deadline, "the listening sandbox never came up"
        yield box, address
        bye = f"import socket; socket.create_connection(('{address}', 9000)).send(b'bye')"
        run(box, ["python3", "-c", bye])
        server.join(timeout=60)
        assert result and result[0].exit_code == 0  # it stopped on our "bye", not on an error
    finally:
        box.destroy()
        if server is not None:
            server.join(timeout=60)


@pytest.mark.parametrize("mode", ["open", "allowlist"])
def test_sandboxes_do_not_reach_each_other(boxes, listener, mode):
    listening, address = listener
    assert connect_from(listening, address, 9000, timeout=5) == "connected"  # control: still up
    assert connect_from(boxes[mode], address, 9000) != "connected"


def test_packet_filter_is_in_place_while_networked_sandboxes_exist(boxes):
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    assert f"-A INPUT -i cbx+ -j {INPUT_CHAIN}" in rules
    assert f"-A {INPUT_CHAIN} -j DROP" in rules
    assert f"-A DOCKER-USER -i cbx+ -j {FORWARD_CHAIN}" in rules
    assert f"-A {FORWARD_CHAIN} -d 169.254.0.0/16 -j DROP" in rules
    # our jump comes first in INPUT, before anything that could accept the packet
    assert rules.split("\n-A INPUT ")[1].startswith(f"-i cbx+ -j {INPUT_CHAIN}")


@pytest.mark.skipif(RUNTIME == "runsc", reason="the host's packet filter alone, the same for either runtime: "
                    "the runc run covers it")
def test_a_rule_put_before_the_jump_does_not_shadow_it(net_engine):
    """Another tool (ufw, an admin) inserting an ACCEPT at the top of INPUT must not let
    sandbox traffic skip the drop: the next networked sandbox puts the jump back first."""
    decoy = ["INPUT", "-i", "cbxdecoy", "-j", "RETURN"]  # matches no interface: harmless
    subprocess.run(["iptables", "-w", "-I", *decoy[:1], "1", *decoy[1:]], check=True)
    try:
        box = net_engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME, network="open"))
        box.destroy()
        rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
        assert rules.splitlines()[1] == f"-A INPUT -i cbx+ -j {INPUT_CHAIN}", rules
        assert "-A INPUT -i cbxdecoy -j RETURN" in rules  # moved below, not removed
    finally:
        subprocess.run(["iptables", "-w", "-D", *decoy], check=False)
