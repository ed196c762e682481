"""``callbox serve --config FILE`` reloads its file on SIGHUP, keeping every live sandbox.

The file is judged by the judge of the start (:mod:`harness.cli.server_check`, through
:func:`~harness.cli.server_config.apply_config`): a file ``callbox serve`` would refuse is
refused with the same message, and the running configuration stays. The sandbox limits (``limits.max_sandboxes``,
``limits.max_per_client``) apply at once to every door's executor: a client over a lowered
limit keeps its sandboxes and may create none until it is under it again. ``[quotas]``,
``[profiles]`` and ``[clients]`` apply at once as well (new limits from the next request,
new profile policies for the sandboxes and sessions made from then on), and so do ``[log]``
and ``[telemetry]`` (spans already taken are sent to the old endpoint). A
change of any other setting (a door's address, TLS, the token file, the policy, the audit
store, ``[http]`` listen, ``[service]``, ``[pool]``, ``[runtime]``, ``engine`` and ``[ray]``)
cannot apply to a running door: it is reported as waiting for a restart and not applied, so
the server never runs half of a new configuration without saying so (live sandboxes stay
on the engine they started on).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable
from typing import Any

from harness.cli.serve_quotas import hard_per_client
from harness.cli.server_config import SETTINGS, apply_config

LIVE = ("max_per_client", "max_sandboxes")
"""Settings a reload applies to the running doors; every other one waits for a restart."""

LIVE_SECTIONS = ("log", "telemetry", "quotas", "profiles", "clients")
"""Tables of the file (beyond :data:`SETTINGS`) a reload applies at once."""
QUOTA_SECTIONS = ("quotas", "profiles", "clients")
"""Tables whose change gives every door's quota keeper and profile policies the file's anew
(so does ``limits.max_per_client``, the fallback of ``live_sandboxes``)."""
RESTART_SECTIONS = ("service", "pool", "runtime", "ray")
"""Tables of the file whose change waits for a restart."""
RESTART_KEYS = ("engine",)
"""Top-level keys of the file whose change waits for a restart."""


def executors(servers: Iterable[Any]) -> list[Any]:
    """The executor services behind the running doors (the gRPC and E2B doors share one
    when both run), each once."""
    found: dict[int, Any] = {}
    for server in servers:
        for executor in (getattr(server, "service", None), getattr(server, "executor", None)):
            if executor is not None and hasattr(executor, "limits"):
                found[id(executor)] = executor
    return list(found.values())


def reload(command_line: argparse.Namespace, running: argparse.Namespace,
           servers: Iterable[Any]) -> list[str]:
    """Re-read ``--config``'s file and apply what can apply live; ``running`` (the settings
    in force) is updated to match. Returns what happened, one line each; raises the file's
    ConfigError (nothing applied) when it has a problem."""
    from harness.doors.grpc.sessions import Limits

    if command_line.config is None:
        return ["SIGHUP: this server was started without --config, so there is nothing to reload"]
    fresh = copy.copy(command_line)
    apply_config(fresh)
    before_max_per_client = running.max_per_client
    running.max_per_client_explicit = getattr(fresh, "max_per_client_explicit", True)
    notes: list[str] = []
    for name, key in SETTINGS.items():
        before, after = getattr(running, name), getattr(fresh, name)
        if before == after:
            continue
        if name in LIVE:
            setattr(running, name, after)
            notes.append(f"{key}: {before} -> {after}, applied")
        else:
            notes.append(f"{key}: {before!r} -> {after!r} takes effect when the server restarts; "
                         f"the running doors keep {before!r}")
    before_config = running.server_config
    notes += _sections(running, fresh)
    if before_config is not None and (before_max_per_client != running.max_per_client or any(
            getattr(before_config, key) != getattr(running.server_config, key) for key in QUOTA_SECTIONS)):
        from harness.cli.serve_quotas import apply_live

        apply_live(servers, running.server_config, hard_per_client(running), getattr(running, "engine_choice", None))
    limits = Limits(max_sandboxes_per_client=hard_per_client(running), max_sandboxes_total=running.max_sandboxes)
    for executor in executors(servers):
        executor.limits = limits  # one reference swap: a create reads it under the executor's lock
    return notes or ["SIGHUP: the configuration file is unchanged"]


def _sections(running: argparse.Namespace, fresh: argparse.Namespace) -> list[str]:
    """Apply the live tables of the fresh file, report the others; ``running.server_config``
    becomes the running file with the live tables replaced."""
    from harness.cli.serve_logging import configure_logging

    before, after = running.server_config, fresh.server_config
    if before is None or after is None:
        return []
    notes: list[str] = []
    update: dict[str, Any] = {}
    for section in LIVE_SECTIONS:
        if getattr(before, section) != getattr(after, section):
            update[section] = getattr(after, section)
            notes.append(f"[{section}]: changed, applied")
    if "log" in update:
        configure_logging(after.log)
    if "telemetry" in update:
        from harness.telemetry import tracing

        tracing.configure(after.telemetry.otlp_endpoint, service_name=after.telemetry.service_name)
    for key in RESTART_KEYS:
        if getattr(before, key) != getattr(after, key):
            notes.append(f"{key}: {getattr(before, key)!r} -> {getattr(after, key)!r} takes effect when the server "
                         "restarts; the running doors keep their engine")
    for section in RESTART_SECTIONS:
        if getattr(before, section) != getattr(after, section):
            notes.append(f"[{section}]: changed; takes effect when the server restarts")
    running.server_config = before.model_copy(update=update)
    return notes
