"""Tar uploads with ``..``, absolute, symlink, hardlink or special members are refused (part of the attack suite).

Every case uploads, through ``AgentClient.upload_tar`` into a real sandbox, an archive whose
first members are harmless (a file, a directory with a file) and whose last member is the attack,
so the refusal also has to undo what the upload had already staged. Each test asserts the
structured error (reason, gRPC code, the agent's sentence) and that nothing was written anywhere:
the state of every place the sandbox user can write (the roots /workspace, /tmp, /home/sandbox,
and /dev/shm outside them) is the same before and after, /etc/passwd is unchanged, and the
would-be escape targets do not exist.

The archives are built in memory with ``tarfile``; link, device and FIFO members are plain
``TarInfo`` headers of those types.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from harness.core.errors import AgentCallError
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

DEST = "/workspace/up"
WRITABLE = "/workspace /tmp /home/sandbox /dev/shm"
# Where the attacks in this file would land if they worked.
ESCAPE_TARGETS = ["/workspace/escape", "/escape", "/etc/evil", "/workspace/up/evil", "/workspace/up/passwd",
                  "/workspace/up/parent", "/workspace/up/null", "/workspace/up/fifo", "/dev/shm/evil",
                  "/tmp/evil", "/workspace/evil"]
ONLY_FILES_AND_DIRS = "uploads may contain only regular files and directories"


def _sh(box: Any, script: str) -> str:
    result = run(box, script)
    assert result.exit_code == 0, result.stderr.data()
    return result.stdout.data().decode()


def existing(box: Any, paths: list[str]) -> str:
    """The paths among ``paths`` that exist (as anything, dangling symlinks included), checked by a tool process."""
    quoted = " ".join(f"'{p}'" for p in paths)
    return _sh(box, f"for p in {quoted}; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then echo \"$p\"; fi; done")


def state(box: Any) -> str:
    """Every entry the sandbox user could have written (name, type, size, mode), and /etc/passwd's digest."""
    return _sh(box, f"find {WRITABLE} -xdev -printf '%p %y %s %m %l\\n' 2>/dev/null | sort; md5sum /etc/passwd")


def member(name: str, kind: bytes = tarfile.REGTYPE, *, linkname: str = "", data: bytes = b"") -> Any:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o644
    return info, data if kind == tarfile.REGTYPE else None


def archive(attack: Any) -> bytes:
    """Harmless members first, then the attack; the names are checked to survive the round trip."""
    members = [member("good/one.txt", data=b"one\n"), member("good/sub", tarfile.DIRTYPE),
               member("good/sub/two.txt", data=b"two\n"), member("top.txt", data=b"top\n"), attack]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert tar.getnames()[-1] == attack[0].name  # tarfile wrote the hostile name as given
    return buf.getvalue()


@pytest.fixture(scope="module")
def box(engine) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


@pytest.fixture
def dest(box) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An empty destination; the test fails unless nothing anywhere changed during it."""
    _sh(box, f"rm -rf {DEST} && mkdir {DEST}")
    before = state(box)
    yield DEST
    assert state(box) == before, "the refused upload changed the sandbox"
    assert existing(box, ESCAPE_TARGETS) == ""
    assert _sh(box, f"ls -A {DEST}") == ""


def refuse(box: Any, dest: str, attack: Any, *, reason: str, code: str, words: str) -> None:
    with pytest.raises(AgentCallError) as caught:
        box.agent.upload_tar(dest, archive(attack), chunk_size=512)
    error = caught.value
    assert (error.reason, error.grpc_code) == (reason, code), error
    assert words in str(error), str(error)
    assert str(error).endswith("The upload wrote nothing."), str(error)
    assert not error.retryable


def test_dotdot_member_is_refused(box, dest):
    refuse(box, dest, member("../escape", data=b"PWNED\n"), reason="PATH_ESCAPE", code="PERMISSION_DENIED",
           words="member '../escape' has a '..' component")


def test_nested_dotdot_member_is_refused(box, dest):
    refuse(box, dest, member("a/../../escape", data=b"PWNED\n"), reason="PATH_ESCAPE", code="PERMISSION_DENIED",
           words="member 'a/../../escape' has a '..' component")


def test_absolute_member_is_refused(box, dest):
    refuse(box, dest, member("/etc/evil", data=b"PWNED\n"), reason="PATH_ESCAPE", code="PERMISSION_DENIED",
           words="member '/etc/evil' is an absolute path")


def test_symlink_member_to_etc_passwd_is_refused(box, dest):
    refuse(box, dest, member("passwd", tarfile.SYMTYPE, linkname="/etc/passwd"), reason="INVALID_ARGUMENT",
           code="INVALID_ARGUMENT",
           words=f"member 'passwd' is a symbolic link (to '/etc/passwd'); {ONLY_FILES_AND_DIRS}")


def test_symlink_member_to_dotdot_is_refused(box, dest):
    refuse(box, dest, member("parent", tarfile.SYMTYPE, linkname=".."), reason="INVALID_ARGUMENT",
           code="INVALID_ARGUMENT", words="member 'parent' is a symbolic link (to '..')")


def test_hardlink_member_to_etc_passwd_is_refused(box, dest):
    refuse(box, dest, member("passwd", tarfile.LNKTYPE, linkname="/etc/passwd"), reason="INVALID_ARGUMENT",
           code="INVALID_ARGUMENT", words=f"member 'passwd' is a hard link (to '/etc/passwd'); {ONLY_FILES_AND_DIRS}")


def test_hardlink_member_to_an_earlier_member_is_refused(box, dest):
    refuse(box, dest, member("evil", tarfile.LNKTYPE, linkname="good/one.txt"), reason="INVALID_ARGUMENT",
           code="INVALID_ARGUMENT", words="member 'evil' is a hard link (to 'good/one.txt')")


def test_device_member_is_refused(box, dest):
    device, _ = member("null", tarfile.CHRTYPE)
    device.devmajor, device.devminor = 1, 3
    refuse(box, dest, (device, None), reason="INVALID_ARGUMENT", code="INVALID_ARGUMENT",
           words=f"member 'null' is a device; {ONLY_FILES_AND_DIRS}")


def test_fifo_member_is_refused(box, dest):
    refuse(box, dest, member("fifo", tarfile.FIFOTYPE), reason="INVALID_ARGUMENT", code="INVALID_ARGUMENT",
           words=f"member 'fifo' is a FIFO; {ONLY_FILES_AND_DIRS}")


@pytest.mark.parametrize("target", ["/etc", "/dev/shm", "/", "..", "/tmp"])
def test_member_through_an_existing_symlink_in_the_destination_is_refused(box, target):
    """A symlink planted in the destination (outside the roots, or to another root) is never followed."""
    _sh(box, f"rm -rf {DEST} && mkdir {DEST} && ln -s {target} {DEST}/link")
    before = state(box)
    refuse(box, DEST, member("link/evil", data=b"PWNED\n"), reason="PATH_ESCAPE", code="PERMISSION_DENIED",
           words="'link' in /workspace/up is a symbolic link already in the destination")
    assert state(box) == before
    assert existing(box, [*ESCAPE_TARGETS, "/evil"]) == ""
    assert _sh(box, f"ls -A {DEST}") == "link\n"


def test_a_truncated_archive_writes_nothing(box, dest):
    data = archive(member("last.txt", data=b"x" * 5000))
    with pytest.raises(AgentCallError) as caught:
        box.agent.upload_tar(dest, data[: len(data) - 3000], chunk_size=1000)
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert "not a complete tar archive" in str(caught.value) and str(caught.value).endswith("wrote nothing.")


@pytest.mark.parametrize("path", ["../escape", "a/../../escape", "/etc/evil", "/workspace/../escape",
                                  "/dev/shm/evil", "up/../../escape"])
@pytest.mark.parametrize("make_parents", [False, True])
def test_a_single_file_write_outside_the_roots_is_refused(box, dest, path, make_parents):
    """The plain Write RPC (no tar) with a ``..`` or absolute path that leaves the roots."""
    with pytest.raises(AgentCallError) as caught:
        box.agent.write_file(path, b"PWNED\n", make_parents=make_parents)
    assert (caught.value.reason, caught.value.grpc_code) == ("PATH_ESCAPE", "PERMISSION_DENIED"), path
    assert "is outside the allowed roots" in str(caught.value)
