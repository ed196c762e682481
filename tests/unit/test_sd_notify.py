"""systemd's readiness messages, sent to a real datagram socket (a path and an abstract name)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from harness.cli.sd_notify import notify, reloading


def test_without_notify_socket_nothing_is_sent() -> None:
    assert notify("READY=1", environ={}) is False


def test_a_path_socket_gets_the_fields_one_per_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(tmp_path / "notify"))
        server.settimeout(5)
        assert notify("READY=1", "STATUS=serving", environ={"NOTIFY_SOCKET": str(tmp_path / "notify")})
        assert server.recv(4096) == b"READY=1\nSTATUS=serving"


def test_an_abstract_socket_is_named_with_an_at_sign() -> None:
    name = f"callbox-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(5)
        assert notify(*reloading(), environ={"NOTIFY_SOCKET": "@" + name})
        fields = server.recv(4096).decode().split("\n")
        assert fields[0] == "RELOADING=1" and fields[1].startswith("MONOTONIC_USEC=")
        assert int(fields[1].split("=")[1]) > 0


def test_a_socket_that_is_gone_is_not_an_error(tmp_path: Path) -> None:
    assert notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "absent")}) is False
