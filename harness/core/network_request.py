"""A client's request for a sandbox's network, granted within what the policy gives.

A client (the E2B door's ``allow_internet_access`` and ``network.allow_out``/``deny_out``, the
gRPC door's and ``callbox sandbox network``'s allow and deny lists) may narrow the network
its sandbox's policy gives, never widen it. What the policy gives is the ceiling:

* ``none``: nothing. A request that asks for a destination (``internet`` true, or an allow
  entry) gets nothing all the same, or is refused (below).
* ``allowlist``: the hosts of ``sandbox.allow_hosts``, through the sandbox's egress proxy.
  The request's allow and deny entries become the spec's ``egress_allow``/``egress_deny``,
  which the proxy applies *within* ``allow_hosts``: an allow entry beyond them reaches
  nothing more (the result is the intersection, shown as both lists wherever the sandbox's
  network is shown). ``internet`` false, or a deny entry of all traffic with no allow entry,
  keeps the proxy with every destination denied, so a later update can open what the
  policy allows.
* ``open``: everything the packet filter lets through. ``internet`` false (or all traffic
  denied) without allow entries is network ``none``; with allow entries it is network
  ``allowlist`` with those entries as its allowlist (HTTP and HTTPS through the proxy, on the
  entries' ports: a portless entry is 80 and 443). Denying particular destinations while
  allowing the rest cannot be done without the proxy, whose protocols are narrower than
  ``open``: ``not_supported``, saying so. A running ``open`` sandbox's rules cannot change
  (it has no proxy); an update that denies nothing leaves it as it is.

A request for more than the ceiling (``internet`` true when the policy is not ``open``, or an
allow entry when it is ``none``) is granted what the policy gives, and the grant's
``note`` says so (the doors log it and show the network the sandbox really has), unless the
policy's ``sandbox.on_internet_request`` is ``"refuse"``: then it is refused
(``permission_denied``) naming that key and ``sandbox.network``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.spec import SandboxFields, SandboxSpec

__all__ = ["ALL_TRAFFIC", "InternetRequestMode", "NetworkGrant", "NetworkRequest", "NetworkRulesSetter",
           "grant_network", "live_rules", "update_network"]

ALL_TRAFFIC = "0.0.0.0/0"
"""E2B's spelling of every destination (``::/0`` means the same here)."""
InternetRequestMode = Literal["grant-policy", "refuse"]


def _all_traffic(entry: str) -> bool:
    return entry.strip().endswith("/0")


@dataclass(frozen=True)
class NetworkRequest:
    """What a client asks of its sandbox's network; None: not asked."""

    internet: bool | None = None
    """E2B's ``allow_internet_access``: false denies all traffic (but the allow entries)."""
    allow: tuple[str, ...] = ()
    """Destinations allowed even if ``deny`` names them (E2B's ``allow_out``)."""
    deny: tuple[str, ...] = ()
    """Destinations refused unless ``allow`` names them (E2B's ``deny_out``)."""

    @property
    def asked(self) -> bool:
        return self.internet is not None or bool(self.allow) or bool(self.deny)

    @property
    def blocks_all(self) -> bool:
        """Everything not in ``allow`` is denied."""
        return self.internet is False or any(_all_traffic(entry) for entry in self.deny)

    @property
    def wants_more(self) -> bool:
        """It asks for some destination (the internet, or an allow entry)."""
        return self.internet is True or bool(self.allow)

    def rules(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The proxy's narrowing: (allow, deny)."""
        deny = self.deny
        if self.internet is False and not any(_all_traffic(entry) for entry in deny):
            deny = (*deny, ALL_TRAFFIC)
        return self.allow, deny


@dataclass(frozen=True)
class NetworkGrant:
    """What a sandbox gets: spec values, and a note when that is less than was asked."""

    network: str
    allow_hosts: tuple[str, ...]
    egress_allow: tuple[str, ...] = ()
    egress_deny: tuple[str, ...] = ()
    note: str | None = None

    def updates(self) -> dict[str, object]:
        return {"network": self.network, "allow_hosts": self.allow_hosts, "egress_allow": self.egress_allow,
                "egress_deny": self.egress_deny}


def _beyond(settings: SandboxFields[Any], mode: InternetRequestMode, what: str) -> str:
    """The note of a request beyond the policy; with ``refuse``, the refusal."""
    gives = {"none": "no network", "allowlist": f"only the hosts of sandbox.allow_hosts "
                                                  f"({', '.join(settings.allow_hosts)})",
             "open": "the internet"}[settings.network]
    text = f"{what} is beyond this server's policy, which gives sandboxes {gives} (sandbox.network = " \
           f"{settings.network!r})"
    if mode == "refuse":
        raise CallboxError(f"{text}; it refuses such requests (sandbox.on_internet_request = 'refuse'): ask for "
                           "no more than that", code=ErrorCode.PERMISSION_DENIED)
    return f"{text}; the sandbox gets what the policy gives"


def _asked_for(request: NetworkRequest) -> str:
    return "internet access" if request.internet is True and not request.allow else \
        f"allow {', '.join(request.allow)}"


def grant_network(settings: SandboxFields[Any], request: NetworkRequest,
                  mode: InternetRequestMode = "grant-policy") -> NetworkGrant:
    """What a new sandbox of ``settings`` (the policy's ``[sandbox]``) gets for ``request``
    (see the module docstring); ``permission_denied`` or ``not_supported`` as it says."""
    network, hosts = settings.network, tuple(settings.allow_hosts)
    if network == "none":
        note = _beyond(settings, mode, _asked_for(request)) if request.wants_more else None
        return NetworkGrant("none", (), note=note)
    if network == "allowlist":
        note = None
        if request.internet is True and not request.blocks_all:
            note = _beyond(settings, mode, "internet access")
        allow, deny = request.rules()
        return NetworkGrant("allowlist", hosts, allow, deny, note=note)
    if not request.blocks_all:
        if request.deny:
            raise CallboxError(
                f"deny {', '.join(request.deny)}: denying some destinations while allowing the rest needs the egress "
                "proxy, which this server's policy does not put in front of its sandboxes (sandbox.network = "
                "'open'); deny all traffic (0.0.0.0/0) and allow what the sandbox needs instead",
                code=ErrorCode.NOT_SUPPORTED)
        return NetworkGrant("open", ())
    if not request.allow:
        return NetworkGrant("none", ())
    return NetworkGrant("allowlist", request.allow)


def live_rules(spec: SandboxSpec, request: NetworkRequest,
               mode: InternetRequestMode = "grant-policy") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The narrowing (allow, deny) a running sandbox of ``spec`` gets for ``request`` (an
    update replaces the whole narrowing, as E2B's does). ``permission_denied`` for more
    than its network gives (a sandbox without network asked for a destination, or the
    internet under ``on_internet_request = "refuse"``); ``not_supported`` when its network
    has no proxy to apply rules (``open`` asked to deny something). Nothing to do: ``none``
    asked for nothing, ``open`` asked to deny nothing (Harbor's ``update_network({})``)."""
    if spec.network == "none":
        if request.wants_more:
            raise CallboxError(f"{_asked_for(request)}: this sandbox has no network (it was created with network "
                               "'none'), and a running sandbox's network cannot be widened",
                               code=ErrorCode.PERMISSION_DENIED)
        return (), ()
    if spec.network == "open":
        if not request.deny and request.internet is not False:
            return (), ()  # denies nothing: everything stays reachable, as it is
        raise CallboxError("this sandbox has network 'open' (a bridge of its own, without the egress proxy that "
                           "applies rules): its rules cannot change while it runs; create it with network rules "
                           "(allow_out with deny_out 0.0.0.0/0) to change them later", code=ErrorCode.NOT_SUPPORTED)
    if request.internet is True and not request.blocks_all and mode == "refuse":
        _beyond(spec, mode, "internet access")
    return request.rules()


class NetworkRulesSetter(Protocol):
    """A sandbox whose engine can change its rules while it runs (the Docker engine's)."""

    spec: SandboxSpec

    def set_network_rules(self, allow: tuple[str, ...], deny: tuple[str, ...]) -> SandboxSpec: ...


def update_network(box: object, spec: SandboxSpec, request: NetworkRequest,
                   mode: InternetRequestMode = "grant-policy") -> SandboxSpec:
    """Replace the narrowing of the running sandbox ``box`` (its spec: ``spec``) by what
    ``request`` asks, within its policy's network (:func:`live_rules`); its spec afterwards.
    The one implementation behind every door's update (E2B's ``update_network``, the gRPC
    ``UpdateNetwork``, ``callbox sandbox network``); each door authorizes and records it as
    the sandbox action ``network``."""
    allow, deny = live_rules(spec, request, mode)
    if spec.network in ("none", "open"):
        return spec  # asked for nothing more than the nothing it has, or to deny nothing of everything
    setter = getattr(box, "set_network_rules", None)
    if setter is None:
        raise CallboxError("this engine cannot change a sandbox's network while it runs (only the Docker engine's "
                           "sandboxes can)", code=ErrorCode.NOT_SUPPORTED)
    updated: SandboxSpec = setter(allow, deny)
    return updated
