"""Who tool processes run as and what environment they get, in callbox's image and in any other."""

from __future__ import annotations

import pwd

import pytest

from sandbox.__main__ import _parser, _tool_user
from sandbox.launch import BASE_ENV, ToolUser


def _unused_uid() -> int:
    uid = 61000
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_callbox_image_environment_is_the_fixed_defaults() -> None:
    env = ToolUser(1000, 1000, "/home/sandbox").environment()
    assert env["PATH"] == BASE_ENV["PATH"] + ":/home/sandbox/.local/bin"
    assert env["HOME"] == "/home/sandbox" and env["USER"] == "sandbox" and env["LANG"] == "C.UTF-8"


def test_an_images_environment_replaces_the_defaults_but_not_the_users_identity() -> None:
    image_env = {"PATH": "/usr/local/go/bin:/usr/bin:/bin", "GOPATH": "/go", "HOME": "/root", "USER": "root",
                 "LANG": "en_US.UTF-8"}
    env = ToolUser(1000, 1000, "/home/sandbox", "builder", image_env).environment()
    assert env["PATH"] == "/usr/local/go/bin:/usr/bin:/bin:/home/sandbox/.local/bin"
    assert env["GOPATH"] == "/go" and env["LANG"] == "en_US.UTF-8"
    # The image's root is read-only and its HOME may be root's: the tool user keeps its own.
    assert env["HOME"] == "/home/sandbox" and env["USER"] == "builder" and env["LOGNAME"] == "builder"
    assert env["TERM"] == BASE_ENV["TERM"]


def test_an_image_without_path_gets_the_default_path() -> None:
    env = ToolUser(1000, 1000, "/home/sandbox", image_env={"FOO": "1"}).environment()
    assert env["PATH"].startswith(BASE_ENV["PATH"]) and env["FOO"] == "1"


def test_a_uid_the_user_database_lacks_is_sandbox_in_the_scratch_home() -> None:
    uid = _unused_uid()
    user = _tool_user(uid, None)
    assert (user.uid, user.gid, user.name, user.home) == (uid, uid, "sandbox", "/home/sandbox")
    assert user.image_env is None


def test_home_and_tool_env_flags_reach_the_tool_user() -> None:
    args = _parser().parse_args(["--uid", "1000", "--home", "/home/sandbox", "--tool-env", "PATH=/bin",
                                 "--tool-env", "EMPTY=", "--tool-env", "EQ=a=b"])
    user = _tool_user(args.uid, args.gid, args.home, args.tool_env)
    assert user.home == "/home/sandbox"
    assert user.image_env == {"PATH": "/bin", "EMPTY": "", "EQ": "a=b"}
    assert user.environment()["PATH"] == "/bin:/home/sandbox/.local/bin"


def test_a_known_uid_takes_its_name_from_the_user_database() -> None:
    entry = pwd.getpwuid(0)
    with pytest.raises(SystemExit, match="never run as uid 0"):
        _tool_user(0, None)
    others = [e for e in pwd.getpwall() if e.pw_uid not in (0,) and e.pw_uid < 60000]
    if not others:
        pytest.skip(f"this host's user database has no user but {entry.pw_name}")
    other = others[0]
    user = _tool_user(other.pw_uid, None, "/home/sandbox")
    assert (user.name, user.gid, user.home) == (other.pw_name, other.pw_gid, "/home/sandbox")
