"""The foreign test images are what they claim, and a second build is a no-op."""

from __future__ import annotations

import time

import pytest

from tests.support import foreign_images

pytestmark = pytest.mark.docker


def run(engine, image: str, script: str) -> str:
    out = engine.client.containers.run(image, ["/bin/sh", "-c", script], remove=True, network_mode="none")
    return out.decode()


def test_busybox_has_no_libc_python_or_uid_1000(engine, busybox_image) -> None:
    assert run(engine, busybox_image, "echo hello | wc -c") .strip() == "6"
    assert run(engine, busybox_image, "ls /lib* /lib64 2>/dev/null; ls /usr 2>/dev/null; echo end").strip() == "end"
    assert run(engine, busybox_image, "command -v python3 python || echo none").strip() == "none"
    passwd = run(engine, busybox_image, "cat /etc/passwd")
    assert [line.split(":")[2] for line in passwd.splitlines()] == ["0"]
    assert run(engine, busybox_image, "ls -A /tmp; echo end").strip() == "end"


def test_bookworm_nopython(engine, bookworm_nopython_image) -> None:
    assert run(engine, bookworm_nopython_image, "command -v python3 || echo none").strip() == "none"
    assert run(engine, bookworm_nopython_image, "ls -d /usr/lib/python3* 2>/dev/null; echo end").strip() == "end"
    assert run(engine, bookworm_nopython_image, "bash -c 'echo $BASH_VERSION'").startswith("5.")
    assert run(engine, bookworm_nopython_image, "getent passwd 1000").strip().split(":")[:6] == [
        "builder", "x", "1000", "1000", "", "/home/builder"]
    assert len(engine.client.images.get(bookworm_nopython_image).history()) == 1


def test_musl_program_runs(engine, musl_image) -> None:
    assert run(engine, musl_image, "/bin/hello-musl").strip() == "libc=musl"
    assert run(engine, musl_image, "ls /lib").split() == ["ld-musl-x86_64.so.1"]
    assert run(engine, musl_image, "command -v python3 || echo none").strip() == "none"


@pytest.mark.parametrize("name", ["busybox_image", "bookworm_nopython_image", "musl_image"])
def test_second_build_is_a_fast_no_op(engine, name, request) -> None:
    first = request.getfixturevalue(name)
    started = time.monotonic()
    again = getattr(foreign_images, name)(engine.client)
    assert again == first
    assert time.monotonic() - started < 1.0
