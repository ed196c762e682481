"""The control plane's JSON: what a create request may ask, and the bodies the e2b SDK parses.

A create request (``NewSandboxV2``; the older ``NewSandbox`` has the same names) is read
field by field (:func:`parse_create`):

* ``templateID`` names a template of :attr:`E2bSandboxes.templates` (``base``: the server's
  policy); an unknown one is ``not_found`` listing the known ones.
* ``timeout`` (seconds) is the session's ``ttl_seconds``: at least ``MIN_TIMEOUT_S`` (10 s, the
  engine's shortest; a shorter one is raised to it, as ``endAt`` then shows), at most
  the template's ``sandbox.ttl_seconds`` (more is ``permission_denied`` naming that key);
  none given: E2B's 300 s, or the limit if that is shorter.
* ``envVars`` become the sandbox's environment (``SandboxOverrides.env``), ``metadata`` is
  kept with it (both: string to string).
* ``allow_internet_access`` and ``network.allowOut``/``denyOut`` (:func:`network_request`)
  narrow the template's network, never widen it (:mod:`harness.core.network_request`: true
  beyond the policy gets the policy's network and a note, or a refusal with the policy's
  ``sandbox.on_internet_request = "refuse"``); the info's ``network`` says what the sandbox
  really has (:func:`network_body`). ``rules``, ``egressProxy`` and ``dnsServers`` are not
  supported; the options about the sandbox's public URLs (``allowPublicTraffic``,
  ``maskRequestHost``, ``httpsPorts``) are the ports' (they change no egress).
* ``secure`` (older SDKs) is accepted: every sandbox here gets an envd access token.
* ``autoPause``, ``autoPauseMemory`` and ``autoResume`` (the SDK's ``lifecycle``) are the
  sandbox's :class:`~harness.doors.e2b.lifecycle.Lifecycle` (see that module).
* Refused as not supported (501), since accepting them would promise behaviour this server
  does not have: ``mcp``, ``iam`` tokens, ``volumeMounts``.
* Any other field is refused (400) unless it is empty (null, false, "", [], {}): a newer
  SDK's option this server does not know could change what the sandbox does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.errors import CallboxError, ErrorCode
from harness.core.network_request import NetworkRequest, grant_network
from harness.core.times import iso
from harness.doors.e2b.boxes import DEFAULT_TEMPLATE, DEFAULT_TIMEOUT_S, E2bSandbox, E2bSandboxes, Metric
from harness.doors.e2b.domains import UNROUTABLE
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.lifecycle import Lifecycle, parse_lifecycle
from harness.doors.grpc.overrides import SandboxOverrides
from harness.engine.spec import SandboxSpec
from sandbox.egress_policy import Allowlist

__all__ = ["ENVD_VERSION", "CreateRequest", "created_body", "detail_body", "listed_body", "metric_body",
           "network_body", "network_request", "parse_create", "public_ports", "rfc3339", "string_map", "unsupported"]

ENVD_VERSION = "0.6.4"
"""The envd version this server answers as: the features of envd 0.6.4 the door implements."""

MIB = 1 << 20
ALL_TRAFFIC = "0.0.0.0/0"
_CREATE_FIELDS = {"templateID", "timeout", "autoPause", "autoPauseMemory", "autoResume", "allow_internet_access",
                  "network", "metadata", "envVars", "mcp", "iam", "volumeMounts", "secure"}
_PUBLIC_URL_OPTIONS = {"allowPublicTraffic", "maskRequestHost", "httpsPorts"}
_NETWORK_UNSUPPORTED = {
    "rules": "per-host request transforms are not supported (the egress proxy does not rewrite requests)",
    "egressProxy": "tunnelling through your SOCKS5 proxy is not supported (the sandbox's egress goes through "
                   "callbox's own proxy)",
    "dnsServers": "DNS servers cannot be chosen (callbox's egress proxy resolves names itself)",
}


def unsupported(message: str) -> E2bError:
    return E2bError(ErrorCode.NOT_SUPPORTED, message)


def _empty(value: Any) -> bool:
    return value is None or value is False or value in ("", [], {})


def string_map(value: Any, what: str) -> dict[str, str]:
    """A JSON object of strings (null: empty); ``invalid_argument`` naming ``what`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{what} must be an object of string values, not {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise invalid(f"{what}[{key!r}] must be a string, not {type(item).__name__}")
    return dict(value)


@dataclass(frozen=True)
class CreateRequest:
    template_id: str
    timeout: int
    overrides: SandboxOverrides
    metadata: dict[str, str]
    lifecycle: Lifecycle
    fingerprint: str
    """The request as canonical JSON (an Idempotency-Key's repeat must match it)."""
    network_note: str | None = None
    """How the network the sandbox gets differs from what was asked (:class:`NetworkGrant`), and
    its ports from ``allowPublicTraffic``."""
    public_ports: bool = False
    """Whether its ports are served without the traffic access token (:func:`public_ports`)."""


def _entries(value: Any, what: str) -> tuple[str, ...]:
    """A list of egress entries (the proxy's syntax), each checked; ``invalid_argument`` naming it."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"{what} must be a list of strings (hosts, *.wildcards, IPs or CIDR networks)")
    for index, item in enumerate(value):
        try:
            Allowlist.parse([item]).without_actions()  # a client narrows; only a policy asks or denies per entry
        except ValueError as exc:
            raise invalid(f"{what}[{index}]: {exc}") from None
    return tuple(value)


def network_request(body: Mapping[str, Any], *, update: bool = False) -> NetworkRequest:
    """What a create body (``allow_internet_access``, ``network``) or an update body (the
    network fields at its top level) asks of the sandbox's network."""
    allow = body.get("allow_internet_access")
    if allow is not None and not isinstance(allow, bool):
        raise invalid(f"allow_internet_access must be true or false, not {allow!r}")
    network = body if update else body.get("network")
    if _empty(network):
        return NetworkRequest(internet=allow)
    if not isinstance(network, dict):
        raise invalid(f"network must be an object, not {type(network).__name__}")
    where = "" if update else "network."
    known = {"allowOut", "denyOut", "allow_internet_access"} | (set() if update else _PUBLIC_URL_OPTIONS)
    for key, value in network.items():
        if key in known or _empty(value):
            continue
        if key in _NETWORK_UNSUPPORTED:
            raise unsupported(f"{where}{key}: {_NETWORK_UNSUPPORTED[key]}")
        raise invalid(f"this server does not know the network field {where}{key}; leave it unset "
                      "(it would not do what it asks)")
    return NetworkRequest(internet=allow, allow=_entries(network.get("allowOut"), f"{where}allowOut"),
                          deny=_entries(network.get("denyOut"), f"{where}denyOut"))


def _refuse_unimplemented(body: Mapping[str, Any]) -> None:
    for key, what in (("mcp", "MCP gateways"), ("iam", "workload identity tokens"), ("volumeMounts", "volumes")):
        value = body.get(key)
        if key == "iam" and isinstance(value, dict):
            value = value.get("tokens")
        if not _empty(value):
            raise unsupported(f"{key}: this server has no {what}; create the sandbox without {key}")
    unknown = sorted(key for key, value in body.items() if key not in _CREATE_FIELDS and not _empty(value))
    if unknown:
        raise invalid(f"this server does not know the create field(s) {', '.join(unknown)}; leave them unset "
                      "(it would not do what they ask)")


def parse_create(body: Any, sandboxes: E2bSandboxes, client: str | None = None) -> CreateRequest:
    """A create request's body, checked against the template's policy (see the module docstring)."""
    if not isinstance(body, dict):
        raise invalid(f"the create request must be a JSON object, not {type(body).__name__}")
    template_id = body.get("templateID") or DEFAULT_TEMPLATE
    if not isinstance(template_id, str):
        raise invalid(f"templateID must be a string, not {template_id!r}")
    policy = sandboxes.check_template(template_id, client)
    _refuse_unimplemented(body)
    timeout = body.get("timeout")
    if timeout is None:
        timeout = min(DEFAULT_TIMEOUT_S, sandboxes.timeout_limit(template_id, client))
    timeout = sandboxes.check_timeout(template_id, timeout, client=client)
    secure = body.get("secure")
    if secure is not None and not isinstance(secure, bool):
        raise invalid(f"secure must be true or false, not {secure!r}")
    wanted = network_request(body)
    try:
        granted = grant_network(policy.sandbox, wanted, policy.sandbox.on_internet_request)
    except CallboxError as error:
        raise E2bError(error.code, error.message) from None
    overrides = SandboxOverrides(ttl_seconds=timeout, env=string_map(body.get("envVars"), "envVars"),
                                 network_request=wanted)
    public, ports_note = public_ports(body, policy.sandbox.public_ports)
    note = "; ".join(n for n in (granted.note, ports_note) if n) or None
    return CreateRequest(template_id=template_id, timeout=timeout, overrides=overrides,
                         metadata=string_map(body.get("metadata"), "metadata"), network_note=note,
                         public_ports=public,
                         lifecycle=parse_lifecycle(body),
                         fingerprint=json.dumps(body, sort_keys=True, separators=(",", ":")))


def public_ports(body: Mapping[str, Any], allowed: bool) -> tuple[bool, str | None]:
    """Whether a create ``body`` gets public ports where the policy's ``sandbox.public_ports`` is
    ``allowed``, and a note when it asked for them and does not: ``allowPublicTraffic`` unset
    means E2B's default, public; under a policy that does not allow it, the owner only."""
    network = body.get("network")
    asked = network.get("allowPublicTraffic") if isinstance(network, dict) else None
    if asked is not None and not isinstance(asked, bool):
        raise invalid(f"network.allowPublicTraffic must be true or false, not {asked!r}")
    if asked is False:
        return False, None
    if allowed:
        return True, None
    note = ("its ports are served to its owner only (with the traffic access token): the policy's "
            "sandbox.public_ports is false") if asked else None
    return False, note


# ---- response bodies --------------------------------------------------------------------------------


def rfc3339(unix: float) -> str:
    """``2026-05-01T12:00:00.123Z`` (E2B's timestamps are callbox's ISO 8601 form)."""
    return iso(unix)


def created_body(sandbox: E2bSandbox, domain: str = UNROUTABLE) -> dict[str, Any]:
    """``Sandbox``: the answer of create and connect (with the envd access token), ``domain``
    being where this server serves the sandbox (:mod:`harness.doors.e2b.domains`)."""
    return {
        "domain": domain,
        "templateID": sandbox.template_id,
        "alias": sandbox.template_id,
        "sandboxID": sandbox.sandbox_id,
        "clientID": sandbox.client,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.access_token,
        "trafficAccessToken": sandbox.traffic_access_token,
    }


def listed_body(sandbox: E2bSandbox, now: float) -> dict[str, Any]:
    """``ListedSandbox``: one sandbox of a list."""
    spec = sandbox.box.spec
    return {
        "templateID": sandbox.template_id,
        "alias": sandbox.template_id,
        "sandboxID": sandbox.sandbox_id,
        "clientID": sandbox.client,
        "startedAt": rfc3339(sandbox.started_at),
        "endAt": rfc3339(sandbox.end_at(now)),
        "cpuCount": max(1, math.ceil(spec.cpus)),
        "memoryMB": spec.memory // MIB,
        "diskSizeMB": (spec.effective_workspace_size + spec.effective_tmp_size + spec.effective_home_size) // MIB,
        "metadata": dict(sandbox.metadata),
        "state": sandbox.state,
        "envdVersion": ENVD_VERSION,
        "volumeMounts": [],
    }


def detail_body(sandbox: E2bSandbox, now: float, domain: str = UNROUTABLE) -> dict[str, Any]:
    """``SandboxDetail``: one sandbox's info, with its access token, lifecycle and domain."""
    body = listed_body(sandbox, now)
    body["envdAccessToken"] = sandbox.access_token
    body["domain"] = domain
    body["lifecycle"] = sandbox.lifecycle.body()
    body.update(network_body(sandbox.box.spec, sandbox.network_note))
    body["network"]["allowPublicTraffic"] = sandbox.public_ports
    return body


def network_body(spec: SandboxSpec, note: str | None = None) -> dict[str, Any]:
    """What a sandbox's info says of the network it really has: ``allowInternetAccess``
    (true only for ``open``), ``network.allowOut``/``denyOut`` as E2B spells its rules (an
    allowlist sandbox: its allowlist's entries allowed and all other traffic denied, or, when
    a client narrowed it, the client's rules, which apply within that allowlist), and
    ``callboxNetwork`` (the SDK keeps unknown fields): the mode, the policy's allowlist, the
    client's narrowing and, when the sandbox got less than was asked, why."""
    mode = spec.network
    narrowed = bool(spec.egress_allow or spec.egress_deny)
    if mode == "open":
        rules: dict[str, Any] = {}
    elif mode == "none":
        rules = {"denyOut": [ALL_TRAFFIC]}
    elif narrowed:
        rules = {"allowOut": list(spec.egress_allow), "denyOut": list(spec.egress_deny)}
    else:
        rules = {"allowOut": list(spec.allow_hosts), "denyOut": [ALL_TRAFFIC]}
    info: dict[str, Any] = {"mode": mode, "summary": spec.network_summary(), "allowHosts": list(spec.allow_hosts),
                            "allowOut": list(spec.egress_allow), "denyOut": list(spec.egress_deny)}
    if note:
        info["note"] = note
    return {"allowInternetAccess": mode == "open", "network": rules, "callboxNetwork": info}


def metric_body(metric: Metric) -> dict[str, Any]:
    """``SandboxMetric``."""
    return {
        "timestamp": rfc3339(metric.timestamp),
        "timestampUnix": int(metric.timestamp),
        "cpuCount": metric.cpu_count,
        "cpuUsedPct": metric.cpu_used_pct,
        "memUsed": metric.mem_used,
        "memTotal": metric.mem_total,
        "memCache": 0,
        "diskUsed": metric.disk_used,
        "diskTotal": metric.disk_total,
    }
