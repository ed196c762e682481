"""``callbox serve``'s doors, started from its settings (the flags over the configuration file).

Order and sharing:

* the gRPC door first; the E2B door then shares its executor (one set of tokens, limits,
  quotas, profiles, audit store and kept sandboxes for both), or makes its own;
* one :class:`~harness.doors.quota_ledger.QuotaKeeper` for every door, so a client's use is
  counted once whichever door it comes through, and one resolver of the profiles' policies;
* the MCP door asks for a bearer token whenever the server has tokens: those of the gRPC or
  E2B door, or the token file's; with none of them it stays open on loopback, as before;
* the HTTP endpoint (``/metrics``, ``/healthz``, the console) last, on the doors' executor
  when there is one. It is stopped first, since the servers stop in reverse order;
* every token set the doors use is kept in ``args.token_sets``: a start whose tokens name no
  operator says so, and SIGHUP reads them again (:func:`reload_tokens`).

One engine for every door and profile (:func:`door_engine`): ``--engine`` and ``--ray-*``
over the file's ``engine`` and ``[ray]``, else over the served policy's; every served policy
(the profiles' too) carries it, and the doors' sessions connect to it. A Ray cluster is
checked before any door listens, so a server that cannot reach it fails at once.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.doors.grpc.tokens import TokenError, TokenSet, operator_note

if TYPE_CHECKING:
    from harness.cli.server_check import Checked
    from harness.core.policy import Policy
    from harness.core.registry import ToolRegistry
    from harness.engine.select import EngineChoice

__all__ = ["reload_tokens", "start_servers"]

log = logging.getLogger("callbox.serve")


def start_servers(args: argparse.Namespace, servers: list[Any]) -> None:
    """Start the doors ``args`` ask for, appending each to ``servers`` as it starts. ``args``
    went through :func:`~harness.cli.server_config.apply_config` (judged good: ``args.checked``);
    what could not be judged then (a Ray cluster answering, the tools of a policy's ``mcp``
    servers) is checked here, before the audit store is opened."""
    from harness.audit.store import AuditStore
    from harness.cli.serve_quotas import door_quotas, hard_per_client, profile_policies

    config = args.server_config
    keep = config is not None and config.service.keep_sandboxes
    per_client = hard_per_client(args)
    quotas = door_quotas(config, per_client)
    policy, args.engine_choice = door_engine(args)
    registry = _registry(args.checked)
    policies = profile_policies(config, args.engine_choice)
    executor = None
    token_sets: list[TokenSet] = []
    if args.grpc is not None:
        from harness.doors.grpc.server import serve_grpc

        grpc_server = serve_grpc(
            args.grpc or None, token_file=args.token_file, insecure=args.insecure,
            tls_cert=args.tls_cert, tls_key=args.tls_key, policy=policy, registry=registry,
            audit=AuditStore(args.audit_db), max_sandboxes_per_client=per_client,
            max_sandboxes_total=args.max_sandboxes, keep_sandboxes=keep, quotas=quotas, policies=policies,
        )
        servers.append(grpc_server)
        executor = grpc_server.service
        token_sets.append(executor.tokens)
        log.info("gRPC executor listening on %s", grpc_server.target)
    if args.e2b is not None:
        from harness.doors.e2b.server import serve_e2b

        if executor is not None:  # one executor for both doors: one set of limits, keys, policy, audit
            e2b_server = serve_e2b(args.e2b, executor=executor, insecure=args.insecure,
                                   tls_cert=args.tls_cert, tls_key=args.tls_key, domain=args.e2b_domain)
        else:
            e2b_server = serve_e2b(
                args.e2b, token_file=args.token_file, insecure=args.insecure, tls_cert=args.tls_cert,
                tls_key=args.tls_key, policy=policy, registry=registry, audit=AuditStore(args.audit_db),
                max_sandboxes_per_client=per_client, max_sandboxes_total=args.max_sandboxes,
                keep_sandboxes=keep, quotas=quotas, policies=policies, domain=args.e2b_domain,
            )
            executor = e2b_server.executor
            token_sets.append(executor.tokens)
        servers.append(e2b_server)
        log.info("E2B API on %s", e2b_server.url)
    if args.mcp_http is not None:
        from harness.doors.mcp.http import serve_mcp_http

        tokens = executor.tokens if executor is not None else None
        if tokens is None and args.token_file is not None:
            from harness.doors.grpc.tokens import load_token_file

            tokens = load_token_file(args.token_file)
        from harness.doors.mcp.service import McpToolService

        audit = AuditStore(args.audit_db)
        try:
            service = McpToolService(registry, policy, audit, owns_audit=True, quotas=quotas, policies=policies)
        except BaseException:
            audit.close()
            raise
        try:
            mcp_server = serve_mcp_http(args.mcp_http, service=service, insecure=args.insecure, tokens=tokens)
        except BaseException:
            service.close()
            raise
        servers.append(mcp_server)
        log.info("MCP server (streamable HTTP) on %s%s", mcp_server.url,
                 "" if tokens is not None else " (no token: loopback only)")
        if tokens is not None:
            token_sets.append(tokens)
    if args.http is not None:
        servers.append(_serve_http(args, executor, token_sets))
    args.token_sets = list({id(tokens): tokens for tokens in token_sets}.values())
    for tokens in args.token_sets:
        note = operator_note(tokens)
        if note is not None:
            log.warning("%s", note)


def reload_tokens(token_sets: Iterable[TokenSet]) -> list[str]:
    """SIGHUP: every token set the doors use read again from its file, one line each (a file
    with a problem keeps the running tokens)."""
    notes: list[str] = []
    for tokens in token_sets:
        try:
            notes.append(tokens.reload())
        except TokenError as error:
            notes.append(f"tokens not reloaded, the running ones stay: {error.message}")
    return notes


def door_engine(args: argparse.Namespace) -> tuple[Policy, EngineChoice]:
    """The served policy and the server's engine as the judge found them (the flags over the
    file's ``engine`` and ``[ray]``, else over the policy's own); a Ray cluster checked now
    (CallboxError saying why)."""
    checked: Checked = args.checked
    choice = checked.engine
    if choice.ray is not None:
        from harness.engine.ray.preflight import preflight

        preflight(choice.ray.anchored(Path.cwd()))
        log.info("sandboxes run on %s", choice.describe())
    return checked.policy, choice


def _registry(checked: Checked) -> ToolRegistry:
    """The doors' tools: the judge's, or, for a policy that declares ``mcp`` servers, listed
    now (each in a sandbox) and the policies' ``[tools.*]`` tables checked against them."""
    if checked.registry is not None:
        return checked.registry
    from harness.cli.server_check import check_tools
    from harness.tools import registry_for

    registry = registry_for(checked.policy)
    check_tools(checked, registry)
    return registry


def _serve_http(args: argparse.Namespace, executor: Any, token_sets: list[TokenSet]) -> Any:
    from harness.doors.http import serve_http

    if executor is not None:  # the doors' tokens, audit store and live sandboxes
        server = serve_http(args.http, tokens=executor.tokens, executor=executor, audit=executor.audit,
                            insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key)
        token_sets.append(executor.tokens)
    else:  # metrics, health, and the runs, approvals and egress of the audit store
        from harness.audit.store import AuditStore
        from harness.doors.grpc.server import announce_token
        from harness.doors.grpc.tokens import server_tokens
        from harness.telemetry import metrics

        audit = AuditStore(args.audit_db)
        metrics.watch_approvals(str(audit.path), audit)
        tokens = server_tokens(args.token_file, announce=announce_token)
        server = serve_http(args.http, tokens=tokens, executor=None, audit=audit, close_audit=True,
                            insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key)
        token_sets.append(tokens)
    log.info("HTTP endpoint (/metrics, /healthz, console) on %s", server.url)
    return server
