"""Sandboxes of images without Python: the agent runs from its bundle, and every hardening default holds.

The images are built offline by ``tests.support.foreign_images``: a BusyBox-only root
(no libc, no Python, no user 1000) and Debian bookworm without python3 (uid 1000 is
``builder``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import Policy
from harness.core.session import Session
from harness.engine.image.bundle import BUNDLE_DIR
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from tests.integration.helpers import callbox, run

pytestmark = pytest.mark.docker

COUNT_SLEEPS = ("n=0; for d in /proc/[0-9]*; do read -r c < $d/comm 2>/dev/null && [ \"$c\" = sleep ] "
                "&& n=$((n+1)); done; echo $n")


def _status(box: object, field: str) -> str:
    text = run(box, ["cat", "/proc/self/status"]).stdout.data().decode()
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(field + ":"))


def test_cli_exec_in_a_busybox_image_just_works(busybox_image: str) -> None:
    result = callbox("exec", "--image", busybox_image, "--", "sh", "-c", "echo hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hi\n"


def test_busybox_sandbox_keeps_every_hardening_default(make_sandbox, busybox_image: str) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(image=busybox_image)
    assert run(box, ["id", "-u"]).stdout.data() == b"1000\n"
    # uid 1000 is not in this image's user database: the tool user is "sandbox" in the scratch home.
    env = run(box, ["env"]).stdout.data().decode().splitlines()
    assert "USER=sandbox" in env and "HOME=/home/sandbox" in env
    assert "PATH=/bin:/home/sandbox/.local/bin" in env, env  # the image's PATH, not callbox's default
    assert _status(box, "CapEff") == "0000000000000000"
    assert _status(box, "NoNewPrivs") == "1"
    assert _status(box, "Seccomp") == "2"
    for path in ("/x", f"{BUNDLE_DIR}/x", "/bin/x"):
        denied = run(box, ["sh", "-c", f": > {path}"])
        assert denied.exit_code != 0, f"{path} is writable"
        assert b"Read-only file system" in denied.stderr.data() or b"Permission denied" in denied.stderr.data()
    for place in ("/tmp", "/workspace", "/home/sandbox"):
        assert run(box, ["sh", "-c", f"echo ok > {place}/f && cat {place}/f"]).stdout.data() == b"ok\n", place
    # The image's /tmp directory is not 1777, but the scratch /tmp over it is.
    assert run(box, ["ls", "-ld", "/tmp"]).stdout.data().startswith(b"drwxrwxrwt")
    # No libc and no Python of the image's own: the agent brought its own.
    assert run(box, ["sh", "-c", "ls /lib* /usr/lib 2>/dev/null | wc -l"]).stdout.data().strip() == b"0"


def test_busybox_timeout_kills_the_whole_tree(make_sandbox, busybox_image: str) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(image=busybox_image)
    started = time.monotonic()
    result = run(box, "trap '' TERM; (trap '' TERM; exec sleep 1000) & (sleep 1001 &) ; sleep 1002", timeout_ms=1000)
    assert result.timed_out
    assert time.monotonic() - started < 5
    assert run(box, COUNT_SLEEPS).stdout.data().strip() == b"0"


def test_busybox_memory_hog_is_reported_oom_killed(make_sandbox, busybox_image: str) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(image=busybox_image, memory="128m")
    result = run(box, "x=a; while :; do x=$x$x; done", timeout_ms=30_000)
    assert result.oom_killed, result.to_json()
    assert run(box, ["true"]).exit_code == 0  # the agent survived


def test_busybox_tools_work_or_say_what_the_image_lacks(engine: object, busybox_image: str, tmp_path: Path) -> None:
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        builtin_registry(), Policy(), audit, spec=SandboxSpec(image=busybox_image), engine_factory=lambda: engine
    ) as session:  # every tool's call in one sandbox of the image, as a run's would be
        calls: list[str] = []

        def call(tool: str, arguments: dict[str, object]) -> str:
            calls.append(tool)
            return session.call(ToolCall(tool, json.dumps(arguments), f"c-{len(calls)}")).text

        assert "hi\nthere" in call("shell", {"command": "echo hi && echo there"})
        bash = call("bash", {"command": "echo hi"})
        assert "image has no bash" in bash and "shell tool" in bash
        assert "needs ripgrep (rg)" in call("search", {"pattern": "hi"})
        patch = call("apply_patch", {"patch": "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n"})
        assert "a.txt" in patch and "rror" not in patch, patch
        assert "hello" in call("shell", {"command": "cat a.txt"})


def test_bookworm_without_python_uses_the_images_user_database(make_sandbox,  # type: ignore[no-untyped-def]
                                                                bookworm_nopython_image: str) -> None:
    box = make_sandbox(image=bookworm_nopython_image)
    assert run(box, "command -v python3 || echo none").stdout.data() == b"none\n"
    assert run(box, ["id", "-un"]).stdout.data() == b"builder\n"
    env = run(box, ["env"]).stdout.data().decode().splitlines()
    assert "USER=builder" in env and "HOME=/home/sandbox" in env
    assert run(box, "echo $BASH_VERSION").stdout.data().strip() != b""  # string commands use the image's bash
    # The agent's libraries are not the tools': the image's own ld.so cache and libc serve them.
    maps = run(box, ["cat", "/proc/self/maps"]).stdout.data().decode()
    assert BUNDLE_DIR not in maps
    assert "/lib/x86_64-linux-gnu/libc.so.6" in maps or "libc.so.6" in maps


def test_musl_image_tools_use_the_images_libc(make_sandbox, musl_image: str) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(image=musl_image)
    # The image's musl loader runs as a tool's program; the agent (glibc, from its bundle) is unaffected.
    banner = run(box, "/lib/ld-musl-x86_64.so.1 2>&1 | head -n 1").stdout.data()
    assert banner.startswith(b"musl libc (x86_64)"), banner
    assert run(box, ["sh", "-c", "echo hi"]).stdout.data() == b"hi\n"
