"""The one verdict on what ``callbox serve`` is asked to serve: its flags over its
configuration file, judged before anything is started or written.

One judge, three callers: ``callbox serve`` at start (before its log file, audit store,
token file or socket exists), ``callbox serve`` on SIGHUP for the new file (a file it
refuses is refused whole and the running configuration stays), and ``callbox config check
FILE``, which judges ``callbox serve --config FILE`` without flags. So the check and the
server never disagree.

:func:`check_settings` raises :class:`ConfigError` (exit code 2): one line naming where the
value came from (a key of the file, ``[doors.grpc] listen``, after ``config file PATH:``; a
flag, ``--grpc``; or an environment variable) and saying the fix. It checks that

* a door is served, and each door's address parses; a gRPC unix socket's path fits in 107
  bytes, is not another kind of file, and its directory can be made;
* the E2B API's sandbox domain is a DNS name with an optional ``:PORT``;
* gRPC over TCP, and the E2B API or the HTTP endpoint off loopback, have TLS or
  ``insecure``; MCP over HTTP off loopback has ``insecure`` (that door has no TLS);
* ``[tls] cert`` and ``key`` go together, are files, and load as a certificate and its key;
* the tokens the doors will use can be read (the token file, ``$CALLBOX_TOKEN``,
  ``$CALLBOX_TOKEN_FILE``, or the default file once it exists), and each ``[clients.NAME]``
  is a client of the token file;
* the log file and the audit store can be written where they are named (nothing is made);
* the policy and each profile's policy load, served on the server's engine (flags, then the
  file, then the policy) with the file's ``[pool]`` and ``[runtime] default``, and their
  ``[tools.*]`` tables name tools the doors serve;
* the warm pool fits in the total limit of sandboxes when the gRPC or E2B door counts it there.

Left to the start, because they depend on the moment rather than on the file: whether a
port is free, whether another server answers on the socket, whether the Ray cluster answers
(``callbox doctor --config`` asks that), and the tools of a policy's ``mcp`` servers (listing
them starts a sandbox; the start checks them with :func:`check_tools` before it opens the
audit store).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

from harness.cli.server_schema import ConfigError
from harness.core.errors import CallboxError

if TYPE_CHECKING:
    from harness.cli.server_schema import ServerConfig
    from harness.core.policy import Policy
    from harness.core.registry import ToolRegistry
    from harness.engine.select import EngineChoice

__all__ = ["Checked", "Origin", "check_settings", "check_tools", "served_policy"]

SUN_PATH_MAX = 107
"""The longest unix socket path, in bytes."""


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from, as an error names it."""

    label: str
    """``[tls] cert`` (a key of the configuration file), ``--tls-cert`` (a flag),
    ``CALLBOX_AUDIT_DB`` (a variable), or words (``the packaged default policy``)."""
    kind: Literal["key", "flag", "env", "default"] = "flag"

    @property
    def in_file(self) -> bool:
        return self.kind == "key"

    def show(self, value: object) -> str:
        """The setting with its value as the user wrote it: ``[tls] cert = '/x'``, ``--tls-cert /x``."""
        if value is None or (self.kind == "flag" and value in ("", True)):
            return self.label
        if self.kind == "key":
            return f"{self.label} = {_toml(value)}"
        if self.kind == "env":
            return f"{self.label}={value}"
        if self.kind == "flag":
            return f"{self.label} {value}"
        return f"{self.label} ({value})"

    def fix_tls(self) -> str:
        """How to give TLS, or accept its absence, where this setting was given."""
        if self.in_file:
            return "set [tls] cert and [tls] key, or [tls] insecure = true to accept that"
        return "pass --tls-cert and --tls-key, or --insecure to accept that"

    def fix_insecure(self) -> str:
        return "set [tls] insecure = true" if self.in_file else "pass --insecure"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return repr(str(value))


@dataclass(frozen=True)
class Checked:
    """What the judge found good, for the start to use as it is."""

    config: ServerConfig | None
    """The configuration file (None: flags only)."""
    policy: Policy
    """The doors' policy, on the server's engine."""
    engine: EngineChoice
    """The server's engine: the flags over the file over the policy."""
    profiles: dict[str, Policy]
    """Each ``[profiles.NAME]`` policy (by name), on the server's engine."""
    registry: ToolRegistry | None
    """The doors' tools; None when the policy declares ``mcp`` servers (listed at start)."""
    policy_origin: Origin
    source: str | None
    """``config file PATH``, or None without one."""
    notes: tuple[str, ...] = ()
    """What the judge could not check, for ``callbox config check`` to say."""


class _Judge:
    """Refusals, each prefixed by the file's name when a setting of the file is involved."""

    def __init__(self, source: str | None, origins: Mapping[str, Origin]) -> None:
        self.source = source
        self.origins = origins

    def origin(self, name: str) -> Origin:
        return self.origins.get(name, Origin("--" + name.replace("_", "-")))

    def refuse(self, text: str, *involved: Origin) -> NoReturn:
        in_file = not involved or any(origin.in_file for origin in involved)
        raise ConfigError(f"{self.source}: {text}" if self.source is not None and in_file else text)


def check_settings(args: argparse.Namespace, origins: Mapping[str, Origin], *, source: str | None) -> Checked:
    """Judge the serve settings of ``args``: the flags over the file as
    :func:`~harness.cli.server_config.apply_config` leaves them (``args.server_config`` is the
    file, or None), each named by ``origins``; ``source`` names the file. Raises ConfigError,
    or the UsageError of an engine flag or variable that does not fit, when ``callbox serve``
    would refuse them; reads, never writes."""
    judge = _Judge(source, origins)
    _doors(args, judge)
    tls = _tls(args, judge)
    _addresses(args, judge, tls=tls)
    _tokens(args, judge)
    _writable(args, judge)
    policy, engine, profiles, policy_origin = _policies(args, judge)
    _pool(args, policy, policy_origin, judge)
    checked = Checked(config=args.server_config, policy=policy, engine=engine, profiles=profiles, registry=None,
                      policy_origin=policy_origin, source=source)
    if any(tool.kind == "mcp" for tool in policy.tool):
        note = (f"the tools of the mcp servers {policy_origin.show(args.policy)} declares are listed when the "
                "server starts (in a sandbox), and the [tools.*] tables naming them are checked then")
        return dataclasses.replace(checked, notes=(note,))
    from harness.tools import registry_for

    try:
        registry = registry_for(policy)
    except CallboxError as exc:
        judge.refuse(_within(policy_origin, args.policy, exc.message), policy_origin)
    check_tools(checked, registry)
    return dataclasses.replace(checked, registry=registry)


def check_tools(checked: Checked, registry: ToolRegistry) -> None:
    """The ``[tools.*]`` tables of the doors' policy and of each profile's name tools of
    ``registry`` (the doors'); ConfigError naming the policy's key otherwise."""
    judge = _Judge(checked.source, {})
    policies = [(checked.policy_origin, checked.policy, _path_of(checked.config, None))]
    policies += [(Origin(f"[profiles.{name}] policy", "key"), policy, _path_of(checked.config, name))
                 for name, policy in checked.profiles.items()]
    for origin, policy, path in policies:
        try:
            policy.check_tools(t.definition for t in registry.tools())
        except CallboxError as exc:
            judge.refuse(_within(origin, path, exc.message), origin)


def _path_of(config: ServerConfig | None, profile: str | None) -> Path | None:
    if config is None:
        return None
    return config.policy.file if profile is None else config.profiles[profile].policy


def _within(origin: Origin, path: object, message: str) -> str:
    """``message`` of the policy ``origin`` names, said under its setting."""
    if message.startswith(("policy file ", "default policy ")):
        return f"{origin.label}: {message}"  # the message names the file already
    return f"{origin.show(path)}: {message.removeprefix('policy: ')}"


# --- doors and addresses -----------------------------------------------------------------------------


def _doors(args: argparse.Namespace, judge: _Judge) -> None:
    if args.grpc is not None or args.mcp_http is not None or args.e2b is not None:
        return
    if args.server_config is None:
        judge.refuse("give --grpc [ADDR], --mcp-http HOST:PORT and/or --e2b HOST:PORT, or --config FILE")
    judge.refuse("no door to serve; add [doors.grpc], [doors.mcp_http] and/or [doors.e2b] with a listen address")


def _tls(args: argparse.Namespace, judge: _Judge) -> bool:
    """Whether the doors serve TLS: both PEM files, readable and a pair, or neither."""
    cert, key = args.tls_cert, args.tls_key
    cert_origin, key_origin = judge.origin("tls_cert"), judge.origin("tls_key")
    if cert is None and key is None:
        return False
    if cert is None or key is None:
        given, missing = (cert_origin, key_origin) if cert is not None else (key_origin, cert_origin)
        fix = (f"add {missing.label} (PEM), or remove {given.label}" if missing.in_file
               else f"pass {missing.label} FILE too, or leave {given.label} out")
        judge.refuse(f"{given.show(cert or key)} without {missing.label}: TLS needs the certificate and its "
                     f"private key; {fix}", given, missing)
    for path, origin in ((cert, cert_origin), (key, key_origin)):
        if not Path(path).is_file():
            judge.refuse(f"{origin.show(path)} is not a file; fix the path", origin)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        why = ("the key is not the certificate's" if "KEY_VALUES_MISMATCH" in str(exc)
               else f"not a PEM certificate and its unencrypted private key ({exc.reason or exc})")
        judge.refuse(f"{cert_origin.show(cert)} and {key_origin.show(key)} cannot be used: {why}; give the "
                     "server's certificate and the key it was made with, both PEM", cert_origin, key_origin)
    except OSError as exc:
        judge.refuse(f"{cert_origin.show(cert)} and {key_origin.show(key)} cannot be read: {exc.strerror or exc}; "
                     "fix their paths or permissions", cert_origin, key_origin)
    return True


def _addresses(args: argparse.Namespace, judge: _Judge, *, tls: bool) -> None:
    from harness.doors.mcp.http import _is_loopback

    insecure = bool(args.insecure)
    if args.grpc is not None:
        _grpc_address(args.grpc, judge.origin("grpc"), judge, tls=tls, insecure=insecure)
    if args.e2b is not None:
        origin = judge.origin("e2b")
        host, port = _tcp_address(args.e2b, origin, judge)
        if not (tls or insecure or _is_loopback(host)):
            judge.refuse(f"{origin.show(args.e2b)}: refusing to serve the E2B API on {host}:{port} without TLS: "
                         "API keys and access tokens would cross the network in clear text; "
                         f"{origin.fix_tls()} (e.g. on a trusted network)", origin)
        _e2b_domain(args, judge)
    if args.mcp_http is not None:
        origin = judge.origin("mcp_http")
        host, _port = _tcp_address(args.mcp_http, origin, judge)
        if not (insecure or _is_loopback(host)):
            tokens = args.grpc is not None or args.e2b is not None or args.token_file is not None
            why = ("bearer tokens would cross the network in clear text (this door has no TLS)" if tokens
                   else "without a token file the MCP door has no authentication, so anyone who can reach it can "
                        "run commands in sandboxes")
            judge.refuse(f"{origin.show(args.mcp_http)}: refusing to serve MCP over HTTP on {host}: {why}; listen "
                         f"on 127.0.0.1 and tunnel, or {origin.fix_insecure()} on a trusted network", origin)
    if args.http is not None:
        origin = judge.origin("http")
        host, port = _tcp_address(args.http, origin, judge)
        if not (tls or insecure or _is_loopback(host)):
            judge.refuse(f"{origin.show(args.http)}: refusing to serve the console on {host}:{port} without TLS: "
                         "tokens and the login cookie would cross the network in clear text; "
                         f"{origin.fix_tls()} (e.g. on a trusted network)", origin)


def _e2b_domain(args: argparse.Namespace, judge: _Judge) -> None:
    from harness.doors.e2b.domains import checked_domain

    if getattr(args, "e2b_domain", None) is not None:
        origin = judge.origin("e2b_domain")
        try:
            checked_domain(args.e2b_domain)
        except ValueError as exc:
            judge.refuse(f"{origin.show(args.e2b_domain)}: {exc}", origin)


def _grpc_address(text: str, origin: Origin, judge: _Judge, *, tls: bool, insecure: bool) -> None:
    from harness.doors.grpc.server import parse_address

    try:
        address = parse_address(text or None, name=f"{origin.label} =" if origin.in_file else origin.label)
    except CallboxError as exc:
        judge.refuse(exc.message, origin)
    if address.kind == "tcp":
        if not (tls or insecure):
            judge.refuse(f"{origin.show(text)}: refusing to serve TCP {address.value} without TLS: bearer tokens "
                         f"would cross the network in clear text; {origin.fix_tls()} (e.g. on a trusted loopback)",
                         origin)
        return
    path = Path(address.value)
    shown = origin.show(text) if text else f"{origin.show(text)} (the default socket {path})"
    if len(str(path).encode()) > SUN_PATH_MAX:
        judge.refuse(f"{shown}: the socket path is longer than {SUN_PATH_MAX} bytes; choose a shorter one", origin)
    try:
        mode = path.lstat().st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        judge.refuse(f"{shown}: {path} exists and is not a socket; remove it or choose another path", origin)
    problem = _unwritable(path)
    if problem is not None:
        judge.refuse(f"{shown}: {problem}; choose another path", origin)


def _tcp_address(text: str, origin: Origin, judge: _Judge) -> tuple[str, int]:
    from harness.doors.mcp.http import parse_addr

    try:
        return parse_addr(text)
    except CallboxError as exc:
        judge.refuse(f"{origin.show(text)}: {exc.message}", origin)


# --- tokens and files ----------------------------------------------------------------------------------


def _tokens(args: argparse.Namespace, judge: _Judge) -> None:
    """The tokens the doors will read, read now (a default file not made yet is made at start)."""
    from harness.doors.grpc.tokens import TOKEN_ENV, TOKEN_FILE_ENV, configured_tokens

    origin = judge.origin("token_file")
    if args.token_file is not None and not Path(args.token_file).is_file():
        judge.refuse(f"{origin.show(args.token_file)} is not a file; fix the path", origin)
    uses = args.grpc is not None or args.e2b is not None or args.http is not None
    if args.token_file is None and not uses:
        return
    try:
        tokens = configured_tokens(args.token_file)
    except CallboxError as exc:
        if args.token_file is not None:
            judge.refuse(f"{origin.label}: {exc.message}", origin)
        from_env = not os.environ.get(TOKEN_ENV, "").strip() and os.environ.get(TOKEN_FILE_ENV, "").strip()
        judge.refuse(f"{TOKEN_FILE_ENV}: {exc.message}" if from_env else exc.message,
                     Origin(TOKEN_FILE_ENV, "env"))
    config = args.server_config
    if config is None or args.token_file is None or tokens is None:
        return
    names = set(tokens.names)
    for client in config.clients:
        if client not in names:
            judge.refuse(f"[clients.{client}]: the token file {args.token_file} has no client named {client!r} "
                         f"(it has {', '.join(sorted(names))}); fix the name", Origin(f"[clients.{client}]", "key"))


def _writable(args: argparse.Namespace, judge: _Judge) -> None:
    """The log file and the audit store can be made or written where they are named."""
    from harness.audit.database import default_audit_path

    config = args.server_config
    if config is not None and config.log.file is not None:
        log_file, origin = config.log.file, Origin("[log] file", "key")
        if not log_file.parent.is_dir():
            judge.refuse(f"{origin.show(log_file)}: its directory does not exist; create it or fix the path", origin)
        problem = _unwritable(log_file)
        if problem is not None:
            judge.refuse(f"{origin.show(log_file)}: {problem}; fix the path or its permissions", origin)
    if args.audit_db is not None:
        audit, origin = Path(args.audit_db).expanduser(), judge.origin("audit_db")
        fix = "fix the path"
    else:
        audit = default_audit_path()
        origin = (Origin("CALLBOX_AUDIT_DB", "env") if os.environ.get("CALLBOX_AUDIT_DB")
                  else Origin("the default audit store", "default"))
        fix = "give another path: [audit] db, --audit-db or CALLBOX_AUDIT_DB"
    problem = _unwritable(audit)
    if problem is not None:
        judge.refuse(f"{origin.show(audit)}: {problem}; {fix}", origin)


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be made or written at ``path`` (its missing directories made on the
    way), or None; found without making anything."""
    if path.is_dir():
        return f"{path} is a directory, not a file"
    if path.exists():
        return None if os.access(path, os.R_OK | os.W_OK) else f"{path} cannot be read and written"
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


# --- policies and the pool -----------------------------------------------------------------------------


def _policies(args: argparse.Namespace, judge: _Judge) -> tuple[Policy, EngineChoice, dict[str, Policy], Origin]:
    """The doors' policy and each profile's, on the server's engine (the flags over the file
    over the doors' policy)."""
    from harness.cli.options import engine_choice
    from harness.engine.select import choice_of, with_engine

    config: ServerConfig | None = args.server_config
    origin = judge.origin("policy") if args.policy is not None else Origin("the packaged default policy", "default")
    policy = _served(args.policy, config, None, origin, judge)
    engine = engine_choice(args, choice_of(policy.engine, policy.ray))
    policy = with_engine(policy, engine)
    profiles: dict[str, Policy] = {}
    for name, profile in (config.profiles if config is not None else {}).items():
        if profile.policy is not None:
            profiles[name] = _served(profile.policy, config, engine, Origin(f"[profiles.{name}] policy", "key"), judge)
    return policy, engine, profiles, origin


def _served(path: Path | None, config: ServerConfig | None, engine: EngineChoice | None, origin: Origin,
            judge: _Judge) -> Policy:
    if path is not None and not Path(path).is_file():
        fix = ("remove the key to serve the packaged default policy" if origin.label == "[policy] file"
               else "leave --policy out to serve the packaged default policy" if origin.kind == "flag"
               else "remove the key to serve the server's policy")
        judge.refuse(f"{origin.show(path)} is not a file; fix the path, or {fix}", origin)
    try:
        return served_policy(path, config, engine)
    except CallboxError as exc:
        runtime = config is not None and config.runtime.default is not None
        judge.refuse(_within(origin, path, exc.message), origin,
                     *([Origin("[runtime] default", "key")] if runtime else []))


def _pool(args: argparse.Namespace, policy: Policy, policy_origin: Origin, judge: _Judge) -> None:
    """The warm pool fits in the total limit, which the gRPC and E2B doors count it in."""
    pool = policy.pool
    if not pool.enabled or (args.grpc is None and args.e2b is None):
        return
    limit, limit_origin = args.max_sandboxes, judge.origin("max_sandboxes")
    config = args.server_config
    in_file = config is not None and config.pool is not None
    where = "" if in_file else f" of {policy_origin.show(args.policy)}"
    origin = Origin("[pool] size", "key" if in_file else "default")
    for key, value in (("size", pool.size), ("max", pool.max), ("code_interpreter", pool.code_interpreter)):
        if value is None or value <= limit:
            continue
        raise_it = f"raise {limit_origin.label}" if limit_origin.in_file else f"pass a larger {limit_origin.label}"
        judge.refuse(f"[pool] {key} = {value}{where} is more than {limit_origin.show(limit)}: the gRPC and E2B "
                     f"doors count pooled sandboxes in that limit, so the pool could never hold them; lower [pool] "
                     f"{key}{'' if in_file else ' in that policy'} or {raise_it}", origin, limit_origin)


def served_policy(path: Path | None, config: ServerConfig | None, engine: EngineChoice | None = None) -> Policy:
    """The policy at ``path`` (None: the packaged default) as the doors serve it: with the
    configuration's ``[pool]`` and ``[runtime] default`` over the policy's own, and the
    server's engine (``engine``, else the configuration's ``engine`` and ``[ray]``) over the
    policy's. Raises PolicyError naming the key when the result is not a valid sandbox spec."""
    from harness.core.policy import PolicyError, load_policy
    from harness.engine.select import with_engine

    policy = load_policy(path)
    engine = engine if engine is not None else config.engine_choice() if config is not None else None
    if engine is not None:
        policy = with_engine(policy, engine)
    if config is None:
        return policy
    if config.pool is not None:
        policy = policy.model_copy(update={"pool": config.pool})
    if config.runtime.default is not None:
        sandbox = policy.sandbox.model_copy(update={"runtime": config.runtime.default})
        policy = policy.model_copy(update={"sandbox": sandbox})
        try:
            policy.sandbox_spec()
        except PolicyError as exc:
            raise PolicyError(f"[runtime] default = {config.runtime.default!r} with this policy: "
                              f"{exc.message}") from None
    return policy
