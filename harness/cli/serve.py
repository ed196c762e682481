"""``callbox serve`` and ``callbox mcp``: callbox as the executor of another harness.

``serve --grpc [ADDR]`` runs the ``harness.v1.Executor`` gRPC service (a unix socket by
default; TCP needs TLS or an explicit ``--insecure``); ``serve --mcp-http ADDR`` runs the
MCP server over streamable HTTP; ``serve --e2b HOST:PORT`` runs the E2B API, for programs
written against the e2b SDK (``E2B_API_URL`` and ``E2B_SANDBOX_URL`` set to the URL it
prints; a non-loopback host needs TLS or ``--insecure``). Any of them can run in one process;
``--token-file``, ``--policy``, ``--audit-db`` and the limits apply to each, and with both
``--grpc`` and ``--e2b`` the two share one executor, so the limits count the sandboxes of
both. ``callbox mcp`` is the MCP server over stdio, for MCP clients that start their servers
as subprocesses.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from harness.cli.options import engine_options
from harness.cli.sd_notify import notify
from harness.cli.serve_doors import start_servers

COMMANDS = ("serve", "mcp", "config")

log = logging.getLogger("callbox.serve")


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve callbox to other harnesses (gRPC, MCP over HTTP, the E2B API)")
    serve.add_argument("--grpc", nargs="?", const="", metavar="ADDR",
                       help="gRPC executor on ADDR (unix:PATH, PATH or HOST:PORT; default: a unix socket)")
    serve.add_argument("--mcp-http", metavar="ADDR", help="MCP server over streamable HTTP on HOST:PORT")
    serve.add_argument("--e2b", metavar="HOST:PORT",
                       help="the E2B API (control plane and envd) for the e2b SDK on HOST:PORT (port 0: a free one)")
    serve.add_argument("--e2b-domain", metavar="DOMAIN",
                       help="the E2B API's sandbox domain: every PORT-SANDBOXID.DOMAIN leads to this server "
                            "(wildcard DNS and TLS); get_host(port) names it")
    serve.add_argument("--http", metavar="HOST:PORT",
                       help="/metrics, /healthz and the web console on HOST:PORT (port 0: a free one)")
    serve.add_argument("--token-file", type=Path,
                       help="client tokens, one NAME:TOKEN per line (mode 0600): gRPC bearer tokens and E2B API keys")
    serve.add_argument("--insecure", action="store_true",
                       help="allow gRPC over TCP without TLS, and MCP over HTTP or the E2B API on a non-loopback "
                            "address without TLS")
    serve.add_argument("--tls-cert", type=Path, help="TLS certificate (PEM) for gRPC over TCP and the E2B API")
    serve.add_argument("--tls-key", type=Path, help="TLS private key (PEM) for gRPC over TCP and the E2B API")
    serve.add_argument("--max-per-client", type=positive_int,
                       help="live sandboxes per client, a hard limit (default: a share of 16 that a "
                            "client may pass while no other client waits to start one)")
    serve.add_argument("--max-sandboxes", type=positive_int,
                       help="live sandboxes in total (default 64)")
    serve.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    serve.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")
    serve.add_argument("--config", type=Path, metavar="FILE",
                       help="server configuration (TOML); a flag given here wins over the file's setting")
    engine_options(serve)

    config = sub.add_parser("config", help="check a server configuration file")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=type(config))
    check = config_sub.add_parser("check", help="validate a server configuration and print the effective one")
    check.add_argument("file", type=Path, metavar="FILE")
    check.add_argument("--json", action="store_true", help="print the effective configuration as one JSON object")

    mcp = sub.add_parser("mcp", help="MCP server over stdio (one sandbox per session)")
    mcp.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    mcp.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    if args.command == "config":
        return _config_check(args)
    if args.command == "mcp":
        from harness.doors.mcp.stdio import run_mcp_stdio

        run_mcp_stdio(policy_path=args.policy, audit_path=args.audit_db)
        return 0
    return _serve(args)


def _config_check(args: argparse.Namespace) -> int:
    """Judge the file as ``callbox serve --config FILE`` would (the same judge), then print it."""
    import json

    from harness.cli.server_config import check_file, engine_notes, render_toml

    checked = check_file(args.file)
    config = checked.config
    assert config is not None
    effective = config.effective()
    if args.json:
        print(json.dumps(effective, indent=2))
        return 0
    notes = [*engine_notes(config), *checked.notes]
    print("".join(f"# note: {note}\n" for note in notes) + render_toml(effective), end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import copy

    from harness.cli.server_config import apply_config

    command_line = copy.copy(args)  # what a reload starts from: the flags win over the file again
    apply_config(args)  # judged whole before anything is started or written (log file, audit store, tokens)
    if args.server_config is not None:
        from harness.cli.serve_logging import configure_logging

        configure_logging(args.server_config.log)
    else:
        log.setLevel(logging.INFO)  # the server's own lines, as "callbox: ..." on stderr
        logging.getLogger("callbox.audit.chain").setLevel(logging.INFO)  # the chain's head, to anchor it
    telemetry = args.server_config.telemetry if args.server_config is not None else None
    if telemetry is not None and telemetry.otlp_endpoint:
        from harness.telemetry import tracing

        tracing.configure(telemetry.otlp_endpoint, service_name=telemetry.service_name)
    stop = threading.Event()
    wake = threading.Event()
    reload_asked = threading.Event()
    servers: list[Any] = []

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()
        wake.set()

    def on_hangup(_signum: int, _frame: object) -> None:
        reload_asked.set()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    # The servers' threads inherit the signal mask of the thread that starts them: started
    # with the stop signals blocked, they leave those to this thread alone, and a SIGTERM
    # then wakes its wait below. (A signal the kernel hands to another thread runs the
    # handler only when this thread next runs Python code, which a plain wait never does.)
    stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        try:
            start_servers(args, servers)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)  # one sent meanwhile arrives now
        notify("READY=1", "STATUS=serving")
        _log_chain_heads("at start")
        while not stop.is_set():
            wake.wait()
            wake.clear()
            if reload_asked.is_set() and not stop.is_set():
                reload_asked.clear()
                _reload(command_line, args, servers)
        notify("STOPPING=1")
        if args.server_config is not None and args.server_config.service.keep_sandboxes:
            log.info("stopping; the live gRPC and E2B sandboxes stay for the next start to adopt "
                     "(MCP sandboxes are destroyed)")
        else:
            log.info("stopping; destroying the sandboxes this server owns")
    finally:
        _log_chain_heads("at stop")
        for server in reversed(servers):
            server.stop()
        from harness.telemetry import tracing

        tracing.shutdown()  # the spans of the last calls are sent before the process ends
    return 0


def _log_chain_heads(when: str) -> None:
    """Log the audit chain's head of each store the servers write, to anchor it elsewhere."""
    from harness.telemetry.metrics import audit_chain_heads

    for path, (seq, digest) in audit_chain_heads().items():
        log.info("audit chain head %s: %d:%s (%s)", when, seq, digest, path)


def _reload(command_line: argparse.Namespace, running: argparse.Namespace, servers: list[Any]) -> None:
    """SIGHUP: re-read the configuration file (see :mod:`harness.cli.serve_reload`)."""
    from harness.cli.sd_notify import reloading
    from harness.cli.serve_doors import reload_tokens
    from harness.cli.serve_reload import reload
    from harness.core.errors import CallboxError

    notify(*reloading())
    for note in reload_tokens(getattr(running, "token_sets", ())):
        log.info("%s", note)
    try:
        notes = reload(command_line, running, servers)
    except CallboxError as exc:
        notes = [f"reload refused, the running configuration stays: {exc.message}"]
    for note in notes:
        log.info("%s", note)
    notify("READY=1", "STATUS=serving")
