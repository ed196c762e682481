"""The E2B door's lifecycle: what a create asks for, what a run meta keeps, what a policy allows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.core.policy import Policy
from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.lifecycle import (
    KILL,
    Lifecycle,
    check_allowed,
    lifecycle_of_meta,
    parse_lifecycle,
    pauses_to_disk,
)
from harness.engine.docker.sandbox import Sandbox
from harness.engine.spec import SandboxSpec


@pytest.mark.parametrize(("body", "expected"), [
    ({}, KILL),
    ({"autoPause": False}, KILL),
    ({"autoPause": True}, Lifecycle("pause", False)),
    ({"autoPause": True, "autoPauseMemory": True, "autoResume": {"enabled": True}}, Lifecycle("pause", True)),
    ({"autoPause": True, "autoResume": {"enabled": False}}, Lifecycle("pause", False)),
])
def test_what_a_create_asks_for(body: dict[str, Any], expected: Lifecycle) -> None:
    assert parse_lifecycle(body) == expected


@pytest.mark.parametrize(("body", "code"), [
    ({"autoResume": {"enabled": True}}, "invalid_request"),
    ({"autoPause": "yes"}, "invalid_request"),
    ({"autoPause": True, "autoResume": True}, "invalid_request"),
    ({"autoPause": True, "autoPauseMemory": False}, "not_supported"),
])
def test_what_a_create_cannot_ask_for(body: dict[str, Any], code: str) -> None:
    with pytest.raises(E2bError) as raised:
        parse_lifecycle(body)
    assert raised.value.error == code


def test_the_run_meta_keeps_it() -> None:
    for lifecycle in (KILL, Lifecycle("pause", False), Lifecycle("pause", True)):
        assert lifecycle_of_meta({"lifecycle": lifecycle.meta()}) == lifecycle
    assert lifecycle_of_meta({}) == KILL


def test_a_policy_that_does_not_allow_pausing_refuses_pause_on_timeout() -> None:
    check_allowed(Lifecycle("pause", True), Policy())
    asking = Policy.model_validate({"actions": {"pause": {"decision": "ask"}}})
    check_allowed(KILL, asking)
    with pytest.raises(E2bError, match=r"actions\.pause") as raised:
        check_allowed(Lifecycle("pause", False), asking)
    assert raised.value.error == "permission_denied"


def _box(**spec: Any) -> Sandbox:
    return Sandbox(None, "abcdef012345", "c" * 64, Path("/nonexistent"), SandboxSpec(**spec),  # type: ignore[arg-type]
                   1000, 1000)


def test_the_door_pauses_to_disk_only_a_gvisor_sandbox_without_network() -> None:
    assert pauses_to_disk(_box(runtime="runsc", network="none")) == (os.geteuid() == 0)
    assert not pauses_to_disk(_box(runtime="runc", network="none"))  # frozen in memory, as before
    assert not pauses_to_disk(_box(runtime="runsc", network="allowlist", allow_hosts=("example.com",)))
    assert not pauses_to_disk(object())
