"""The tools a policy declares (``[[tool]]``, modelled in :mod:`harness.core.declared`) as
registered tools: ``command`` (:mod:`.command`), ``python`` (:mod:`.python`) and ``http``
(:mod:`.http`)."""

from __future__ import annotations

from harness.core.declared import DeclaredTool
from harness.core.declared_http import split_url
from harness.core.policy import Policy, PolicyError
from harness.core.registry import Tool
from harness.tools.declared.command import command_tool
from harness.tools.declared.http import http_tool
from harness.tools.declared.python import python_tool
from sandbox.egress_policy import Allowlist

__all__ = ["declared_tool", "declared_tools"]


def declared_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``[[tool]]`` table."""
    if declared.kind == "python":
        return python_tool(declared)
    if declared.kind == "http":
        return http_tool(declared)
    return command_tool(declared)


def _check_reachable(policy: Policy) -> None:
    """An http tool's request goes through the egress proxy: the sandbox must be in
    ``allowlist`` mode and its ``allow_hosts`` must permit the tool's host and port."""
    network, hosts = policy.sandbox.network, policy.sandbox.allow_hosts
    for index, declared in enumerate(policy.tool):
        if declared.kind != "http" or declared.url is None:
            continue
        parts = split_url(declared.url)
        target = f"[{parts.host}]:{parts.port}" if ":" in parts.host else f"{parts.host}:{parts.port}"
        if network != "allowlist":
            raise PolicyError(
                f"policy: key 'tool[{index}].url': the http tool {declared.name!r} sends its request through the "
                f'sandbox\'s egress proxy, which needs sandbox.network = "allowlist" (it is "{network}"); set '
                f'network = "allowlist" and allow_hosts = ["{target}"] in [sandbox]')
        refusal = Allowlist.parse(hosts).permits(parts.host, parts.port)
        if refusal is not None:
            raise PolicyError(
                f"policy: key 'sandbox.allow_hosts': the http tool {declared.name!r} (tool[{index}]) calls "
                f'{target}, which the allowlist does not permit ({refusal}); add "{target}" to sandbox.allow_hosts')


def declared_tools(policy: Policy) -> list[Tool]:
    """The tools ``policy`` declares, in the order of its ``[[tool]]`` tables; a PolicyError
    when an http tool's host is not reachable through the sandbox's allowlist."""
    _check_reachable(policy)
    return [declared_tool(declared) for declared in policy.tool]
