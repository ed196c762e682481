"""``callbox serve``'s per-client quotas and profile policies, from its configuration file.

:func:`door_quotas` makes the one :class:`~harness.doors.quota_ledger.QuotaKeeper` every door
of the server shares (``serve_grpc``, ``serve_e2b`` and ``serve_mcp_http`` take it as
``quotas``), and :func:`profile_policies` the resolver of the clients whose profile names a
policy of its own (``policies``): each such policy file is loaded once, as the doors serve
policies (:func:`~harness.cli.server_config.served_policy`); every other client gets the
door's own policy. Without a configuration file the keeper has no quota (the doors' fair
shares still apply, and ``--max-per-client`` bounds live sandboxes as before).

On SIGHUP :func:`apply_live` gives every running door the new file's quotas at once (the use
counted so far stays; a client over a lowered quota keeps what it has and gets no more) and
its profiles' policies for the sandboxes and sessions made from then on (live ones keep the
policy they started with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.cli.server_config import ServerConfig, served_policy
from harness.core.policy import Policy
from harness.doors.profiles import PolicySource
from harness.doors.quota_ledger import QuotaKeeper
from harness.doors.quotas import Quotas
from harness.engine.select import EngineChoice

__all__ = ["apply_live", "door_quotas", "hard_per_client", "profile_policies", "quota_source"]


def hard_per_client(args: Any) -> int | None:
    """The per-client limit of ``callbox serve``'s settings if the operator set it (a hard
    limit), None when it is the default (a work-conserving share, :class:`~harness.doors.grpc.sessions.Limits`)."""
    explicit = getattr(args, "max_per_client_explicit", True)
    return int(args.max_per_client) if explicit and args.max_per_client is not None else None


def quota_source(config: ServerConfig | None, max_per_client: int | None = None) -> Callable[[str], Quotas]:
    """Client name -> its quotas: the file's (client over profile over ``[quotas]``), with
    ``live_sandboxes`` falling back to ``max_per_client`` (the flag, which wins over
    ``limits.max_per_client``; None: the file's, if it sets one) when neither the client nor
    its profile sets it."""
    if config is None:
        return lambda _client: Quotas()
    if max_per_client is not None:
        config = config.model_copy(update={"limits": config.limits.model_copy(
            update={"max_per_client": max_per_client})})
    return config.client_quotas


def door_quotas(config: ServerConfig | None, max_per_client: int | None = None) -> QuotaKeeper:
    """The keeper every door of the server shares (pass it as each door's ``quotas``)."""
    return QuotaKeeper(quota_source(config, max_per_client) if config is not None else None)


def profile_policies(config: ServerConfig | None, engine: EngineChoice | None = None) -> PolicySource | None:
    """Client name -> the policy of its profile (None: the door's own policy), served on the
    server's ``engine``; None when no profile names a policy. Raises PolicyError for a
    profile policy that cannot be served."""
    if config is None:
        return None
    loaded: dict[Path, Policy] = {}
    for profile in config.profiles.values():
        if profile.policy is not None and profile.policy not in loaded:
            loaded[profile.policy] = served_policy(profile.policy, config, engine)
    if not loaded:
        return None
    by_client: dict[str, Policy] = {}
    for name, client in config.clients.items():
        if client.profile is not None:
            path = config.profiles[client.profile].policy
            if path is not None:
                by_client[name] = loaded[path]
    return by_client.get


def apply_live(servers: Iterable[Any], config: ServerConfig, max_per_client: int | None = None,
               engine: EngineChoice | None = None) -> list[str]:
    """Give the running doors ``config``'s quotas and profile policies (a reload; the policies
    on the running ``engine``); what was done."""
    source = quota_source(config, max_per_client)
    policies = profile_policies(config, engine)
    keepers: dict[int, QuotaKeeper] = {}
    profiles: dict[int, Any] = {}
    for server in servers:
        for holder in (getattr(server, "service", None), getattr(server, "executor", None)):
            keeper = getattr(holder, "quotas", None)
            if isinstance(keeper, QuotaKeeper):
                keepers[id(keeper)] = keeper
            found = getattr(holder, "profiles", None)
            if found is not None and hasattr(found, "configure"):
                profiles[id(found)] = found
    for keeper in keepers.values():
        keeper.configure(source)
    for client_policies in profiles.values():
        client_policies.configure(policies)
    if not keepers:
        return []
    return ["quotas and profiles: applied (new limits from the next request; new sandboxes and sessions take "
            "their profile's policy)"]
