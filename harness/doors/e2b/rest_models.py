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
* ``allow_internet_access``: false is network ``none``; true is refused unless the
  template's network is ``open`` (a sandbox never gets more network than its policy gives).
  ``network``: ``denyOut: ["0.0.0.0/0"]`` alone is network ``none``; the options about the
  sandbox's public URLs (``allowPublicTraffic``, ``maskRequestHost``, ``httpsPorts``) change
  nothing here (this server publishes no sandbox URLs); egress rules are not supported.
* ``secure`` (older SDKs) is accepted: every sandbox here gets an envd access token.
* Refused as not supported (501), since accepting them would promise behaviour this server
  does not have: ``autoPause`` true (a timeout here removes the sandbox), ``autoResume``
  enabled, ``mcp``, ``iam`` tokens, ``volumeMounts``. ``autoPauseMemory`` only qualifies
  ``autoPause`` and is ignored.
* Any other field is refused (400) unless it is empty (null, false, "", [], {}): a newer
  SDK's option this server does not know could change what the sandbox does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.errors import ErrorCode
from harness.core.times import iso
from harness.doors.e2b.boxes import DEFAULT_TEMPLATE, DEFAULT_TIMEOUT_S, E2bSandbox, E2bSandboxes, Metric
from harness.doors.e2b.domains import UNROUTABLE
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.grpc.overrides import SandboxOverrides

__all__ = ["ENVD_VERSION", "CreateRequest", "created_body", "detail_body", "listed_body", "metric_body",
           "parse_create", "rfc3339", "string_map", "unsupported"]

ENVD_VERSION = "0.6.4"
"""The envd version this server answers as: the features of envd 0.6.4 the door implements."""

MIB = 1 << 20
ALL_TRAFFIC = "0.0.0.0/0"
_CREATE_FIELDS = {"templateID", "timeout", "autoPause", "autoPauseMemory", "autoResume", "allow_internet_access",
                  "network", "metadata", "envVars", "mcp", "iam", "volumeMounts", "secure"}
_PUBLIC_URL_OPTIONS = {"allowPublicTraffic", "maskRequestHost", "httpsPorts"}


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
    fingerprint: str
    """The request as canonical JSON (an Idempotency-Key's repeat must match it)."""


def _network(body: Mapping[str, Any], server_network: str) -> str | None:
    """The network the request asks for: None (the template's) or ``none``."""
    wanted: str | None = None
    allow = body.get("allow_internet_access")
    if allow is not None:
        if not isinstance(allow, bool):
            raise invalid(f"allow_internet_access must be true or false, not {allow!r}")
        if not allow:
            wanted = "none"
        elif server_network != "open":
            detail = ("gives sandboxes no network" if server_network == "none"
                      else "lets sandboxes reach only the hosts of sandbox.allow_hosts")
            raise E2bError(ErrorCode.PERMISSION_DENIED,
                           f"allow_internet_access: this server's policy {detail} (sandbox.network = "
                           f"{server_network!r}); leave allow_internet_access unset or false")
    network = body.get("network")
    if _empty(network):
        return wanted
    if not isinstance(network, dict):
        raise invalid(f"network must be an object, not {type(network).__name__}")
    rules = {key: value for key, value in network.items() if key not in _PUBLIC_URL_OPTIONS and not _empty(value)}
    if not rules:
        return wanted
    if set(rules) == {"denyOut"} and rules["denyOut"] == [ALL_TRAFFIC]:
        return "none"
    raise unsupported(f"network: {', '.join(sorted(rules))} is not supported: this server gives a sandbox its "
                      f"policy's network ({server_network!r}) or none; ask for none with allow_internet_access "
                      "false (or denyOut ['0.0.0.0/0'] alone)")


def _refuse_unimplemented(body: Mapping[str, Any]) -> None:
    if body.get("autoPause") is True:
        raise unsupported("autoPause: this server removes a sandbox when its timeout passes, it cannot pause it "
                          "instead; leave lifecycle.on_timeout unset or 'kill', and pause it yourself with pause()")
    resume = body.get("autoResume")
    if isinstance(resume, dict) and resume.get("enabled"):
        raise unsupported("autoResume: a paused sandbox here resumes only through Sandbox.connect; leave "
                          "lifecycle.auto_resume unset or false")
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
    overrides = SandboxOverrides(network=_network(body, policy.sandbox.network), ttl_seconds=timeout,
                                 env=string_map(body.get("envVars"), "envVars"))
    return CreateRequest(template_id=template_id, timeout=timeout, overrides=overrides,
                         metadata=string_map(body.get("metadata"), "metadata"),
                         fingerprint=json.dumps(body, sort_keys=True, separators=(",", ":")))


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
    body["lifecycle"] = {"autoResume": False, "onTimeout": "kill"}
    network = sandbox.box.spec.network
    if network in ("open", "none"):
        body["allowInternetAccess"] = network == "open"
    return body


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
