"""``callbox doctor --config FILE``: what the server configuration needs to start.

``config.file`` loads the file with the loader ``callbox config check`` and ``callbox serve``
use (:func:`harness.cli.server_config.load_config`), so its verdict is theirs. That loader
stops at the first problem; the items after it look at each thing the server will need
when it starts, so every problem is reported at once, each naming the file's key and the
fix: each door's address parses (with the door's own parser) and can be listened on, or
is held by a running ``callbox serve`` (``listeners``); the token file is private and parses
(with the servers' own reader); the TLS files (``tls_checks``); the audit store's directory
is writable; the log file's directory exists. When the file does not even parse, the items
are skipped because of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.doctor.catalog import CHECKS
from harness.doctor.listeners import Bindable, try_tcp, try_unix, unwritable
from harness.doctor.report import CheckResult, result_maker
from harness.doctor.tls_checks import check_cert, check_key

if TYPE_CHECKING:
    from harness.cli.server_config import ServerConfig
    from harness.core.policy import Policy

DOORS = (("grpc", "config.grpc", "[doors.grpc] listen"), ("mcp_http", "config.mcp-http", "[doors.mcp_http] listen"),
         ("e2b", "config.e2b", "[doors.e2b] listen"), ("http", "config.http", "[http] listen"))
"""Each door: its name in the file, its check's id and its key."""


@dataclass
class ServerCheck:
    """The configuration's items, and what the rest of doctor needs of the file."""

    results: list[CheckResult] = field(default_factory=list)
    config: ServerConfig | None = None
    """The file, parsed (also when the loader refused it for a file it names); None when it
    does not parse."""
    policy: Policy | None = None
    """The policy the doors would serve (None: it cannot be loaded)."""


def config_report(path: Path) -> ServerCheck:
    """Every configuration item of the file at ``path`` (a path that is no file at all is a
    usage error, as for ``callbox config check``)."""
    from harness.cli.server_config import ConfigError, load_config

    make = result_maker("config.file")
    if not path.is_file():
        load_config(path)  # ConfigError (usage, exit 2) naming what the argument is instead
    config: ServerConfig | None
    try:
        config = load_config(path)
        loaded = make("PASS", f"{path} loads as `callbox config check` and `callbox serve` read it")
    except ConfigError as exc:
        loaded = make("FAIL", exc.message)
        config = _parsed(path)
    if config is None:
        because = "the file does not load (config.file)"
        return ServerCheck([loaded, *(result_maker(i.id)("SKIP", f"skipped: {because}") for i in CHECKS
                                      if i.scope == "config" and i.id != "config.file")])
    results = [loaded, *door_checks(config), check_tokens(config.auth.token_file),
               check_cert(config.tls.cert), check_key(config.tls.key, config.tls.cert),
               check_audit(config.audit.db), check_log(config.log.file)]
    return ServerCheck(results, config, _served_policy(config))


def _parsed(path: Path) -> ServerConfig | None:
    """The file through the loader's parser alone (its tables and keys), when it gets that far."""
    from harness.cli.server_config import ConfigError, parse_config

    try:
        text = path.read_bytes().decode("utf-8")
        return parse_config(text, source=f"config file {path}", base=path.resolve().parent)
    except (OSError, UnicodeDecodeError, ConfigError):
        return None


def _served_policy(config: ServerConfig) -> Policy | None:
    from harness.cli.server_config import served_policy
    from harness.core.errors import CallboxError

    try:
        return served_policy(config.policy.file, config)
    except CallboxError:
        return None


# ---- the doors -----------------------------------------------------------------------------


def door_checks(config: ServerConfig, attempt: Callable[[str, str], tuple[str, Bindable]] | None = None
                ) -> list[CheckResult]:
    """One item per door the file serves. ``attempt(door, listen)`` parses and tries an
    address: (what it is, the outcome); default :func:`attempt_listen`."""
    attempt = attempt or attempt_listen
    results: list[CheckResult] = []
    seen: list[tuple[str, str]] = []
    for door, check_id, key in DOORS:
        entry = config.http if door == "http" else getattr(config.doors, door)
        if entry is None:
            continue
        make = result_maker(check_id)
        named = f"{key} = {entry.listen!r}"
        try:
            where, outcome = attempt(door, entry.listen)
        except ValueError as exc:
            results.append(make("FAIL", f"{named}: {exc}"))
            continue
        clash = next((other for taken, other in seen if _clash(where, taken)), None)
        if clash is not None:
            results.append(make("FAIL", f"{named}: {where} is also where {clash} listens; give each door an "
                                        "address of its own"))
            continue
        seen.append((where, key))
        results.append(_judge_listen(make, named, where, outcome))
    return results


WILDCARDS = ("0.0.0.0", "[::]")  # noqa: S104 (every interface: what a door listening there takes)


def _clash(a: str, b: str) -> bool:
    """Whether two doors' addresses (``HOST:PORT`` or ``unix socket PATH``) take the same socket."""
    if a == b:
        return not a.endswith(":0")
    if a.startswith("unix socket") or b.startswith("unix socket"):
        return False
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    return port_a == port_b and port_a != "0" and (host_a in WILDCARDS or host_b in WILDCARDS)


def _judge_listen(make: Callable[..., CheckResult], named: str, where: str, outcome: Bindable) -> CheckResult:
    if outcome.problem is None:
        if where.endswith(":0"):
            return make("PASS", f"{named}: port 0, so serve picks a free port when it starts")
        return make("PASS", f"{named}: {where} is free")
    if outcome.in_use and outcome.holder is not None and outcome.holder.is_callbox_serve:
        return make("PASS", f"{named}: {where} is held by a running callbox serve ({outcome.holder.describe()}); "
                            "stop it before starting another on this file")
    if outcome.in_use:
        holder = outcome.holder.describe() if outcome.holder is not None else "another process"
        return make("FAIL", f"{named}: {outcome.problem} by {holder}; stop that or choose another address")
    return make("FAIL", f"{named}: {outcome.problem}")


def attempt_listen(door: str, listen: str) -> tuple[str, Bindable]:
    """Parse ``listen`` with the door's own parser and try it (ValueError: it does not parse)."""
    from harness.core.errors import CallboxError

    try:
        if door == "grpc":
            from harness.doors.grpc.server import parse_address

            address = parse_address(listen or None)
            if address.kind == "unix":
                return f"unix socket {address.value}", try_unix(Path(address.value))
            host, _, port = address.value.rpartition(":")
        else:
            from harness.doors.mcp.http import parse_addr

            host, port_number = parse_addr(listen)
            port = str(port_number)
    except CallboxError as exc:
        raise ValueError(exc.message) from None
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    where = f"{shown}:{port}"
    if int(port) == 0:
        return where, Bindable()
    return where, try_tcp(host, int(port))


# ---- the files -----------------------------------------------------------------------------


def check_tokens(path: Path | None) -> CheckResult:
    from harness.core.errors import CallboxError
    from harness.doors.grpc.tokens import load_token_file

    make = result_maker("config.tokens")
    if path is None:
        return make("SKIP", "[auth] token_file not set: serve takes $CALLBOX_TOKEN, $CALLBOX_TOKEN_FILE or the "
                            "default token file (made on first start)")
    named = f"[auth] token_file = {str(path)!r}"
    try:
        tokens = load_token_file(path)
    except CallboxError as exc:
        return make("FAIL", f"{named}: {exc.message}")
    mode = os.stat(path).st_mode & 0o777
    return make("PASS", f"{named}: {len(tokens)} client(s) ({', '.join(tokens.names)}), mode {mode:04o}")


def _writable_dir(directory: Path) -> str | None:
    """Why this user cannot make files in ``directory`` (made first where missing), or None."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    problem = unwritable(existing)
    if problem is not None and existing != directory:
        return f"{problem}, so {directory} cannot be made"
    return problem


def _opens_for_writing(path: Path) -> bool:
    """Whether this user can open the existing file ``path`` for appending (nothing is written)."""
    try:
        with path.open("ab"):
            return True
    except OSError:
        return False


def check_audit(db: Path | None) -> CheckResult:
    from harness.audit.database import default_audit_path

    make = result_maker("config.audit")
    path = db if db is not None else default_audit_path()
    named = f"[audit] db = {str(path)!r}" if db is not None else f"[audit] db not set, so {str(path)!r}"
    if path.exists():
        if not path.is_file():
            return make("FAIL", f"{named} is not a file; give the path of the audit database")
        if not _opens_for_writing(path):
            return make("FAIL", f"{named} is not writable by this user; fix its owner or mode")
    if (problem := _writable_dir(path.parent)) is not None:
        return make("FAIL", f"{named}: {problem}; create the directory or make it writable by the user callbox "
                            "serve runs as")
    state = "exists and is writable" if path.exists() else "will be created (its directory is writable)"
    return make("PASS", f"{named} {state}")


def check_log(file: Path | None) -> CheckResult:
    make = result_maker("config.log")
    if file is None:
        return make("SKIP", "[log] file not set: the server logs to standard error (journald under systemd)")
    named = f"[log] file = {str(file)!r}"
    if not file.parent.is_dir():
        return make("FAIL", f"{named}: its directory {file.parent} does not exist; create it or fix the path")
    if file.exists() and not _opens_for_writing(file):
        return make("FAIL", f"{named} is not writable by this user; fix its owner or mode")
    if (problem := unwritable(file.parent)) is not None:
        return make("FAIL", f"{named}: {problem}, where rotation makes its files; make it writable by the user "
                            "callbox serve runs as")
    return make("PASS", f"{named}: its directory exists and is writable")
