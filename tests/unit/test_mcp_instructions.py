"""The MCP server tells the client the truth about the sandbox's network."""

from __future__ import annotations

from harness.doors.mcp.protocol import instructions
from harness.engine.spec import SandboxSpec


def test_instructions_name_the_network_mode() -> None:
    assert "(a Docker container without network)" in instructions(SandboxSpec())
    allow = instructions(SandboxSpec(network="allowlist", allow_hosts=("pypi.org:443", "*.github.com")))
    assert "only network access is HTTP(S) through a proxy to: pypi.org:443, *.github.com" in allow
    assert "without network" not in allow
    assert "outside network access" in instructions(SandboxSpec(network="open"))
