"""Which policy each client is served with: the server's, or its profile's.

A server may map clients to profiles, each with a policy of its own (its tools, decisions
and sandbox settings). Every door asks :class:`ClientPolicies` for the policy of a client's
new sandbox or session, and for the tools that client is shown. The resolver
(``client name -> Policy``, None for the door's default) is the server configuration's; the policy it returns is
checked against the door's tool registry the first time it is seen (a profile's policy may
not name tools the server lacks) and then kept, so a lookup is a dictionary read.

A reload swaps the resolver (:meth:`ClientPolicies.configure`): new sandboxes and sessions
take the new policy; those that are live keep the one they started with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from harness.core.policy import Policy
from harness.core.registry import ToolRegistry

__all__ = ["ClientPolicies", "PolicySource"]

PolicySource = Callable[[str], Policy | None]
"""A client name -> its policy, or None for the door's own (the server's) policy."""


class ClientPolicies:
    """Per client name, the policy it is served with (``default`` when ``resolve`` is None)."""

    def __init__(self, default: Policy, registry: ToolRegistry, resolve: PolicySource | None = None) -> None:
        self.default = default
        self.registry = registry
        self._resolve = resolve
        self._lock = threading.Lock()
        self._by_client: dict[str, Policy] = {}
        self._checked: dict[int, tuple[Policy, list[str]]] = {id(default): (default, registry.exposed_names(default))}

    def configure(self, resolve: PolicySource | None, default: Policy | None = None) -> None:
        """Resolve clients' policies with ``resolve`` from now on (a reload)."""
        with self._lock:
            self._resolve = resolve
            if default is not None:
                self.default = default
            self._by_client = {}

    def of(self, client: str) -> Policy:
        """The policy ``client``'s new sandboxes and sessions are served with. A policy naming
        tools this server's registry lacks raises PolicyError (it was checked against the
        registry only now)."""
        with self._lock:
            found = self._by_client.get(client)
            resolve = self._resolve
        if found is not None:
            return found
        policy = (resolve(client) if resolve is not None else None) or self.default
        self._exposed(policy)
        with self._lock:
            self._by_client[client] = policy
        return policy

    def exposed(self, client: str) -> list[str]:
        """The tool names ``client``'s policy exposes."""
        return self._exposed(self.of(client))

    def _exposed(self, policy: Policy) -> list[str]:
        with self._lock:
            known = self._checked.get(id(policy))
        if known is not None and known[0] is policy:
            return known[1]
        policy.check_tools(t.definition for t in self.registry.tools())
        names = self.registry.exposed_names(policy)
        with self._lock:
            self._checked[id(policy)] = (policy, names)
        return names
