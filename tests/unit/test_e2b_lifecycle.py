"""The E2B door's lifecycle: what a create asks for, what a run meta keeps, what a policy allows."""

from __future__ import annotations

from typing import Any

import pytest

from harness.core.policy import Policy
from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.lifecycle import KILL, Lifecycle, check_allowed, lifecycle_of_meta, parse_lifecycle


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
