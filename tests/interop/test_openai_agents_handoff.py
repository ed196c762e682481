"""callbox's handoff tools are the OpenAI Agents SDK's (``openai-agents``, pinned in pyproject's
dev extras): the same tool name, description, argument schema and transfer message for the
same agent, so a model trained on the SDK's handoffs meets the ones it knows."""

from __future__ import annotations

import json

import pytest
from agents import Agent, handoff

from harness.loop.agents import AgentConfig
from harness.loop.handoff import transfer_message, transfer_tool

pytestmark = pytest.mark.interop


@pytest.mark.parametrize(("name", "description"), [
    ("billing", ""),
    ("Billing Agent", "Invoices and refunds."),
    ("refunds-2.0", "Money back."),
])
def test_transfer_tools_match_the_sdks(name: str, description: str) -> None:
    sdk_agent: Agent[None] = Agent(name=name, instructions="x", handoff_description=description or None)
    sdk = handoff(sdk_agent)
    ours = transfer_tool(AgentConfig(name=name, instructions="x", handoff_description=description))
    assert ours.name == sdk.tool_name
    assert ours.description == sdk.tool_description.strip()
    assert ours.input_schema() == sdk.input_json_schema
    assert json.loads(transfer_message(name)) == json.loads(sdk.get_transfer_message(sdk_agent))
    assert transfer_message(name) == sdk.get_transfer_message(sdk_agent)
