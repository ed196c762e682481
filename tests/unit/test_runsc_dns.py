"""The resolv.conf of a runsc sandbox with network open: the resolvers Docker's embedded
DNS server would forward to, picked as Docker picks them."""

from __future__ import annotations

from pathlib import Path

from harness.engine.docker.runsc_dns import DOCKER_DEFAULT_NAMESERVERS, host_nameservers, nameservers, write_resolv_conf


def test_loopback_and_malformed_nameservers_are_left_out() -> None:
    text = ("# comment\nnameserver 127.0.0.53\nnameserver 10.1.2.3\nsearch corp.example\nnameserver ::1\n"
            "nameserver fe80::1%eth0\nnameserver not-an-address\nnameserver\noptions edns0\n")
    assert nameservers(text) == ["10.1.2.3", "fe80::1%eth0"]


def test_systemd_resolveds_upstreams_stand_in_for_its_stub(tmp_path: Path) -> None:
    host, systemd = tmp_path / "host", tmp_path / "systemd"
    host.write_text("nameserver 127.0.0.53\noptions edns0 trust-ad\n")
    systemd.write_text("nameserver 192.0.2.53\n")
    assert host_nameservers(host, systemd) == ["192.0.2.53"]
    host.write_text("nameserver 198.51.100.1\n")
    assert host_nameservers(host, systemd) == ["198.51.100.1"]


def test_dockers_defaults_when_the_host_names_no_reachable_resolver(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.write_text("nameserver 127.0.0.1\n")
    assert host_nameservers(host, tmp_path / "absent") == list(DOCKER_DEFAULT_NAMESERVERS)


def test_a_remote_engine_gets_dockers_defaults(tmp_path: Path) -> None:
    path = write_resolv_conf(tmp_path, engine_is_local=False)
    assert path.read_text() == "".join(f"nameserver {s}\n" for s in DOCKER_DEFAULT_NAMESERVERS)
    assert path.stat().st_mode & 0o777 == 0o644
