"""Both ends of the agent channel agree on the wire facts, though the agent keeps its own copy."""

import sandbox.errors
import sandbox.server
from harness import wire


def test_the_agent_and_the_harness_use_the_same_error_detail_key():
    assert sandbox.errors.DETAIL_METADATA_KEY == wire.DETAIL_METADATA_KEY == "callbox-error-bin"


def test_the_agent_and_the_harness_accept_the_same_largest_message():
    assert sandbox.server.MAX_MESSAGE_BYTES == wire.MAX_MESSAGE_BYTES
