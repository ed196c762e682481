"""Whether a failed exec's command may have started: only provable cases say it did not."""

from __future__ import annotations

import pytest

from harness.core.errors import AgentCallError
from harness.engine.agent_errors import SANDBOX_GONE
from harness.tools.shell import agent_failure, command_may_have_started


def error(message: str, *, reason: str = "UNSPECIFIED", code: str = "UNAVAILABLE") -> AgentCallError:
    return AgentCallError(message, reason=reason, grpc_code=code, retryable=True)


@pytest.mark.parametrize(("failure", "started"), [
    (error(f"{SANDBOX_GONE} (failed to connect to all addresses; last error: Connection refused)"), False),
    (error("working directory /x does not exist", reason="SPAWN_FAILED", code="FAILED_PRECONDITION"), False),
    (error("the sandbox's process limit is reached", reason="BUSY", code="RESOURCE_EXHAUSTED"), False),
    (error(f"{SANDBOX_GONE} (Socket closed)"), None),  # the request was out: the agent may have run it
    (error("Deadline Exceeded", code="DEADLINE_EXCEEDED"), None),
    (error("Cancelled", code="CANCELLED"), None),
])
def test_only_a_refusal_or_a_connection_never_made_proves_nothing_started(failure, started):
    assert command_may_have_started(failure) is started


def test_an_unknown_start_is_said_and_recorded_as_unknown():
    output = agent_failure(error(f"{SANDBOX_GONE} (Socket closed)"), started=None)
    assert output.structured is not None and output.structured["command_started"] is None
    assert "not known whether the command started" in output.text
    assert "The command did not start" in agent_failure(error("failed to connect to all addresses"),
                                                        started=False).text


@pytest.mark.parametrize(("started", "outcome"), [(None, "unknown"), (True, "unknown"), (False, "not_run")])
def test_a_lost_sandbox_records_the_outcome(started, outcome):
    output = agent_failure(error(f"{SANDBOX_GONE} (Socket closed) (sandbox lost with its node w1)"), started=started)
    assert output.structured is not None and output.structured["outcome"] == outcome


def test_a_refusal_has_no_outcome_key():
    refused = agent_failure(error("no such dir", reason="SPAWN_FAILED", code="FAILED_PRECONDITION"), started=False)
    assert refused.structured is not None and "outcome" not in refused.structured
