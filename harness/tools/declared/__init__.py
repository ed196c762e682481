"""The tools a policy declares (``[[tool]]``, modelled in :mod:`harness.core.declared`) as
registered tools: ``command`` (:mod:`.command`), ``python`` (:mod:`.python`), ``http``
(:mod:`.http`), ``sql`` (:mod:`.sql`) and ``mcp`` (:mod:`.mcp`: one table, the tools its
server lists)."""

from __future__ import annotations

from collections.abc import Callable

from harness.core.declared import DeclaredTool
from harness.core.declared_http import split_url
from harness.core.policy import Policy, PolicyError
from harness.core.registry import Tool
from harness.engine.base import Engine
from harness.tools.declared.command import command_tool
from harness.tools.declared.http import http_tool
from harness.tools.declared.mcp import DISCOVERY_TIMEOUT_S, McpDiscoveryError, discover, mcp_tools
from harness.tools.declared.python import python_tool
from harness.tools.declared.sql import sql_tool
from sandbox.egress_policy import Allowlist

__all__ = ["declared_tool", "declared_tools"]


def declared_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``[[tool]]`` table."""
    if declared.kind == "python":
        return python_tool(declared)
    if declared.kind == "http":
        return http_tool(declared)
    if declared.kind == "sql":
        return sql_tool(declared)
    if declared.kind == "mcp":
        raise ValueError(f"{declared.name!r} is an mcp tool: its tools come from declared_tools(policy)")
    return command_tool(declared)


def _check_reachable(policy: Policy) -> None:
    """An http tool's request goes through the egress proxy: the sandbox must be in
    ``allowlist`` mode and its ``allow_hosts`` must permit the tool's host and port."""
    network, hosts = policy.sandbox.network, policy.sandbox.allow_hosts
    for index, declared in enumerate(policy.tool):
        if declared.kind == "sql":
            _check_sql_reachable(index, declared, network, hosts)
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


def _check_sql_reachable(index: int, declared: DeclaredTool, network: str, hosts: tuple[str, ...]) -> None:
    """A PostgreSQL server is reached through the egress proxy (``allowlist``, which must
    permit its host and port) or directly (``open``); never from a ``none`` sandbox."""
    database = declared.sql_database
    if database.engine != "postgresql" or network == "open":
        return
    target = database.target
    if network != "allowlist":
        raise PolicyError(
            f"policy: key 'tool[{index}].database': the sql tool {declared.name!r} connects to {target} from the "
            f'sandbox, whose network is "{network}"; set network = "allowlist" and allow_hosts = ["{target}"] in '
            "[sandbox]")
    refusal = Allowlist.parse(hosts).permits(database.host, database.port)
    if refusal is not None:
        raise PolicyError(
            f"policy: key 'sandbox.allow_hosts': the sql tool {declared.name!r} (tool[{index}]) connects to "
            f'{target}, which the allowlist does not permit ({refusal}); add "{target}" to sandbox.allow_hosts')


def declared_tools(policy: Policy, engine_for: Callable[[], Engine] | None = None) -> list[Tool]:
    """The tools ``policy`` declares, in the order of its ``[[tool]]`` tables; a PolicyError
    when an http tool's host is not reachable through the sandbox's allowlist, or when an
    mcp tool's server cannot list its tools (listing it needs a sandbox: ``engine_for``
    gives the engine, by default the one the policy names, Docker's unless it names another,
    connected only then)."""
    from harness.engine.select import choice_of, engine_connector

    _check_reachable(policy)
    tools: list[Tool] = []
    for index, declared in enumerate(policy.tool):
        if declared.kind != "mcp":
            tools.append(declared_tool(declared))
            continue
        timeout_s = max(DISCOVERY_TIMEOUT_S, declared.timeout_s or 0.0)
        try:
            engine = engine_for or engine_connector(choice_of(policy.engine, policy.ray))
            listed = discover(declared, policy.sandbox_spec(), engine, timeout_s)
        except McpDiscoveryError as exc:
            raise PolicyError(f"policy: key 'tool[{index}]': {exc}") from None
        tools.extend(mcp_tools(declared, listed))
    return tools
