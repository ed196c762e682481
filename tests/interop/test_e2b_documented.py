"""Behaviours E2B documents for calls the door already serves, through the unmodified ``e2b`` SDK:
signed file URLs used by a plain HTTP client, the default user named ``user``, watch events of
every kind, and an upload over the sandbox's space limit. One server and one sandbox for the
module; every test works in a directory of its own.
"""

from __future__ import annotations

import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import FilesystemEventType, NotEnoughSpaceException, Sandbox, SandboxException

from tests.interop.e2b_server import E2bServer, e2b_server_fixture, sdk_environment  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.interop]

SANDBOX_TIMEOUT_S = 600
EVENT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def sandbox(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with sdk_environment(e2b_server):
        box = Sandbox.create(timeout=SANDBOX_TIMEOUT_S)
        try:
            yield box
        finally:
            box.kill()


@pytest.fixture
def scratch(sandbox: Sandbox) -> str:
    path = f"/tmp/documented-{uuid.uuid4().hex[:10]}"
    sandbox.files.make_dir(path)
    return path


def _with_query(url: str, **changes: str) -> str:
    """``url`` with query parameters replaced (a tampered URL)."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    query.update(changes)
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


# ---- the default user ----------------------------------------------------------------------------


def test_the_default_user_is_named_user(sandbox: Sandbox, scratch: str) -> None:
    ran = sandbox.commands.run("whoami; id -u; echo ~; pwd")
    assert ran.stdout.split() == ["user", "1000", "/home/user", "/home/user"], ran.stdout
    written = sandbox.files.write(f"{scratch}/mine.txt", "x")
    info = sandbox.files.get_info(written.path)
    assert (info.owner, info.group) == ("user", "user")
    assert {(e.owner, e.group) for e in sandbox.files.list(scratch)} == {("user", "user")}
    home = sandbox.files.write("~/home-file.txt", "h", user="user")
    assert home.path == "/home/user/home-file.txt" and sandbox.commands.run("cat ~/home-file.txt").stdout == "h"
    # The old name still means the same user; any other account is refused, naming the one there is.
    assert sandbox.commands.run("whoami", user="sandbox").stdout == "user\n"
    with pytest.raises(SandboxException, match="unprivileged user 'user'"):
        sandbox.commands.run("whoami", user="root")


# ---- signed upload and download URLs -------------------------------------------------------------


def test_signed_urls_work_without_the_access_token_and_refuse_tampering(sandbox: Sandbox, scratch: str) -> None:
    path = f"{scratch}/signed.txt"
    upload = sandbox.upload_url(path)
    download = sandbox.download_url(path)
    assert "signature=v1_" in upload and "signature=v1_" in download
    # A plain client: no X-Access-Token, no E2b-Sandbox-Id (the URL is the server's own).
    with httpx.Client(timeout=30) as plain:
        answer = plain.post(upload, files={"file": ("signed.txt", b"sent by a plain client")})
        assert answer.status_code == 200, answer.text
        assert answer.json()[0]["path"] == path
        assert sandbox.files.read(path) == "sent by a plain client"
        fetched = plain.get(download)
        assert fetched.status_code == 200 and fetched.content == b"sent by a plain client", fetched.text

        # The read URL does not write, another path is not signed, and neither is a missing signature.
        for url, words in ((_with_query(upload, path=f"{scratch}/other.txt"), "invalid signature"),
                           (_with_query(download, signature="v1_" + "A" * 43), "invalid signature")):
            refused = plain.get(url)
            assert refused.status_code == 401, refused.text
            assert refused.json()["code"] == 401 and refused.json()["message"].startswith(words), refused.text
        as_write = plain.post(download, files={"file": ("signed.txt", b"overwritten")})
        assert as_write.status_code == 401, as_write.text
        assert sandbox.files.read(path) == "sent by a plain client"
        unsigned = plain.get(download.split("&signature=")[0], headers={"E2b-Sandbox-Id": sandbox.sandbox_id})
        assert unsigned.status_code == 401
        assert unsigned.json()["message"].startswith("missing signature query parameter"), unsigned.text


def test_an_expired_signed_url_is_refused(sandbox: Sandbox, scratch: str) -> None:
    path = f"{scratch}/expiring.txt"
    sandbox.files.write(path, "soon gone")
    fresh = sandbox.download_url(path, use_signature_expiration=60)
    assert "signature_expiration=" in fresh
    with httpx.Client(timeout=30) as plain:
        assert plain.get(fresh).content == b"soon gone"
        # Signed correctly, but for a time already past (what the SDK makes for an expiration of -1 s).
        expired = sandbox.download_url(path, use_signature_expiration=-1)
        refused = plain.get(expired)
        assert refused.status_code == 401, refused.text
        assert refused.json()["message"].startswith("signature is already expired"), refused.text
        # Moving the expiration later breaks the signature instead.
        later = _with_query(expired, signature_expiration=str(int(time.time()) + 3600))
        assert plain.get(later).json()["message"].startswith("invalid signature")


# ---- watch events --------------------------------------------------------------------------------


def _events_until(watcher: Any, wanted: set[tuple[str, FilesystemEventType]]) -> list[tuple[str, FilesystemEventType]]:
    """What the (polled) watcher reports until every (name, type) of ``wanted`` came, in order."""
    seen: list[tuple[str, FilesystemEventType]] = []
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not wanted <= set(seen):
        assert time.monotonic() < deadline, f"events {wanted - set(seen)} within {EVENT_TIMEOUT_S:g} s; saw {seen}"
        seen += [(e.name, e.type) for e in watcher.get_new_events()]
        time.sleep(0.05)
    return seen


def test_watch_reports_chmod_rename_halves_and_files_in_new_subdirectories(sandbox: Sandbox, scratch: str) -> None:
    sandbox.files.write(f"{scratch}/f.txt", "x")
    watcher = sandbox.files.watch_dir(scratch, recursive=True)
    try:
        sandbox.commands.run(f"chmod 600 {scratch}/f.txt")
        seen = _events_until(watcher, {("f.txt", FilesystemEventType.CHMOD)})
        assert ("f.txt", FilesystemEventType.WRITE) not in seen, seen  # a chmod is not a write
        sandbox.commands.run(f"mv {scratch}/f.txt {scratch}/g.txt")  # envd: RENAME of the old name, CREATE of the new
        _events_until(watcher, {("f.txt", FilesystemEventType.RENAME), ("g.txt", FilesystemEventType.CREATE)})
        sandbox.commands.run(f"mkdir -p {scratch}/a/b && echo y > {scratch}/a/b/h.txt")
        _events_until(watcher, {("a", FilesystemEventType.CREATE), ("a/b", FilesystemEventType.CREATE),
                                ("a/b/h.txt", FilesystemEventType.CREATE)})
        sandbox.commands.run(f"rm -r {scratch}/a {scratch}/g.txt")
        _events_until(watcher, {("a/b/h.txt", FilesystemEventType.REMOVE), ("g.txt", FilesystemEventType.REMOVE)})
    finally:
        watcher.stop()


# ---- an upload over the space limit --------------------------------------------------------------


def test_an_upload_over_the_space_limit_names_the_target_and_the_limit(sandbox: Sandbox, scratch: str) -> None:
    size = int(sandbox.commands.run("df -B1 --output=size /tmp | tail -1").stdout.strip())
    target = f"{scratch}/too-big.bin"
    with pytest.raises(NotEnoughSpaceException) as refused:  # envd's 507
        sandbox.files.write(target, b"\0" * (size + (1 << 20)))
    message = str(refused.value)
    assert target in message and ".callbox" not in message, message
    assert "/tmp is a tmpfs of" in message and "tmp_size" in message, message
    assert not sandbox.files.exists(target)
    assert sandbox.commands.run(f"ls -A {scratch}").stdout == ""  # no temporary file left behind
