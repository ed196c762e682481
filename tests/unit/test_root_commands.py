"""Commands as root: the policy's opt-in (``sandbox.root_commands``), its refusal, the E2B
door's reading of the user, and the agent's root identity and environment."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from harness.core.calls import Action
from harness.core.policy import Policy, load_policy, parse_policy
from harness.core.root_commands import ROOT_COMMANDS_KEY, root_refusal
from harness.doors.e2b.envd_filesystem import check_user
from harness.doors.e2b.envd_process import _as_root
from harness.doors.e2b.errors import E2bError
from sandbox.errors import PERMISSION_DENIED, AgentError
from sandbox.launch import ToolUser
from sandbox.toolstart import ToolStarter


def test_root_commands_are_off_by_default_and_not_a_loosening() -> None:
    assert Policy().sandbox.root_commands is False
    assert not any(ROOT_COMMANDS_KEY in note for note in Policy().loosened())


def test_allowing_root_commands_is_a_logged_loosening(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[sandbox]\nroot_commands = true\n")
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        policy = load_policy(path)
    assert policy.sandbox.root_commands is True
    assert f"loosens a hardened default: {ROOT_COMMANDS_KEY} = true" in caplog.text


def test_a_root_commands_value_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(Exception, match="root_commands"):
        parse_policy('[sandbox]\nroot_commands = "yes please"\n')


def test_the_refusal_is_a_denial_naming_the_key_and_the_fix() -> None:
    decision = root_refusal("user")
    assert decision.action is Action.DENY
    assert decision.rule == f"{ROOT_COMMANDS_KEY} = false"
    assert "[sandbox] root_commands = true" in decision.reason and "leave the user unset" in decision.reason
    assert "unprivileged user 'user', not as 'root'" in decision.reason


@pytest.mark.parametrize("user", [None, "user", "sandbox"])
def test_the_sandbox_user_or_none_is_not_root(user: str | None) -> None:
    assert _as_root(user) is False


def test_root_is_asked_for_and_any_other_user_is_refused_naming_the_key() -> None:
    assert _as_root("root") is True
    with pytest.raises(E2bError, match="'alice' is not available") as caught:
        _as_root("alice")
    assert ROOT_COMMANDS_KEY in str(caught.value)


def test_files_as_root_are_refused_naming_the_key_unless_root_commands_are_allowed() -> None:
    assert check_user(None) is False and check_user("user") is False
    assert check_user("user", root_allowed=True) is False
    with pytest.raises(E2bError, match="served \\(as 'user'\\) only where the policy allows root") as caught:
        check_user("root")
    assert f"{ROOT_COMMANDS_KEY} = false" in str(caught.value) and "root_commands = true" in str(caught.value)
    assert check_user("root", root_allowed=True) is True  # then served as the sandbox's user
    with pytest.raises(E2bError, match="cannot act as 'alice'"):
        check_user("alice", root_allowed=True)


def test_a_root_command_gets_roots_environment_over_the_tool_users() -> None:
    starter = ToolStarter(ToolUser(1000, 1000, "/home/user", "user"))
    assert starter.environment({})["HOME"] == "/home/user"
    env = starter.environment({"HOME": "/srv", "X": "1"}, as_root=True)
    assert (env["USER"], env["LOGNAME"], env["HOME"], env["X"]) == ("root", "root", "/srv", "1")  # the request wins
    assert starter.environment({}, as_root=True)["HOME"] == "/root"


def test_the_root_identity_is_the_agents_own_ids_with_only_the_marker_group() -> None:
    starter = ToolStarter(ToolUser(1000, 1000, "/home/user", "user"))
    if os.geteuid() != 0:
        with pytest.raises(AgentError) as caught:
            starter.root_identity(4242)
        assert caught.value.reason == PERMISSION_DENIED
        return
    identity = starter.root_identity(4242)
    assert (identity.uid, identity.gid, list(identity.groups or ())) == (None, None, [0, 4242])
