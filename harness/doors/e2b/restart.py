"""The E2B door's sandboxes across a server restart (``keep_sandboxes``).

A keeping server leaves the E2B door's sandboxes running when it stops, like the gRPC
door's (:mod:`harness.doors.grpc.adoption`: the engine's keep record written at creation,
the run meta naming the container, the serving instance and the overrides). The next
server on the same audit store adopts them with :func:`adopt_e2b` before it serves, through
that module's :func:`~harness.doors.grpc.adoption.adopt` and the door's
:class:`~harness.doors.grpc.adoption.DoorHooks`:

* **Policy.** A sandbox's policy is its template's (``template`` in its run meta, for its
  client: :meth:`E2bSandboxes.template`) tightened by its recorded overrides (the timeout,
  the network, the envVars' names with their values read back from the sandbox's spec). A
  template this server no longer has, or a policy that no longer allows those overrides:
  the sandbox is destroyed and its run ends ``policy_changed``.
* **What the door adds.** The template id, the metadata, the lifecycle (a sandbox its
  timeout paused stays paused, kept until its paused TTL, and resumes as it was created to)
  and the start time (``startedAt`` of the listing) come from the run meta; the envVars
  from the overrides; the timeout from the engine's lifetime records (a paused sandbox
  stays paused, its clock standing still).
* **The envd access token.** The audit store keeps only the SHA-256 digests of the tokens a
  sandbox was given (:data:`~harness.doors.e2b.access_tokens.ENVD_TOKENS`), never a token. An
  adopted sandbox gets a new token, which create-style answers (``connect``, the sandbox's
  details) hand out: ``Sandbox.connect(id)`` in the SDK takes it from there. The tokens
  handed out before stay valid, checked against their digests, so a client that still
  holds its ``Sandbox`` object goes on without connecting again (the SDK's instance
  ``connect()`` keeps the token it has). The new token's digest joins the record (the last
  :data:`MAX_TOKENS`), so it outlives the next restart too. The traffic access token of its
  ports is carried over the same way (:data:`~harness.doors.e2b.access_tokens.TRAFFIC_TOKENS`).

What is not carried over: the door's memory of Idempotency-Keys (a repeated create after a
restart starts a new sandbox), and the envd requests in flight at the stop (a stopping
server ends each, with the command or watch it streamed): the files stay, the commands
that were running do not.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from harness.audit.store import AuditError, RunRecord
from harness.core.policy import Policy
from harness.doors.e2b.access_tokens import ENVD_TOKENS, TRAFFIC_TOKENS, token_digest
from harness.doors.e2b.boxes import (
    DEFAULT_TEMPLATE,
    DOOR,
    E2bSandbox,
    E2bSandboxes,
)
from harness.doors.e2b.lifecycle import lifecycle_of_meta
from harness.doors.grpc.adoption import Adoption, DoorHooks, adopt
from harness.doors.grpc.sessions import ClientSession

__all__ = ["MAX_TOKENS", "adopt_e2b", "e2b_hooks"]

log = logging.getLogger("callbox.e2b")

MAX_TOKENS = 16
"""The most access-token digests a sandbox's run keeps (one per restart it lived through)."""


def adopt_e2b(sandboxes: E2bSandboxes) -> Adoption:
    """Adopt the E2B sandboxes earlier servers on this audit store left (see the module docstring)."""
    return adopt(sandboxes.executor, e2b_hooks(sandboxes))


def e2b_hooks(sandboxes: E2bSandboxes) -> DoorHooks:
    """How the E2B door's runs are adopted into ``sandboxes``."""

    def base_policy(run: RunRecord) -> Policy | None:
        return sandboxes.template(_template_of(run), str(run.meta["client"]))

    def adopted(session: ClientSession, run: RunRecord) -> None:
        sandboxes.add_adopted(_sandbox(sandboxes, session, run))

    return DoorHooks(DOOR, base_policy, adopted)


def _template_of(run: RunRecord) -> str:
    template = run.meta.get("template")
    return template if isinstance(template, str) and template else DEFAULT_TEMPLATE


def _sandbox(sandboxes: E2bSandboxes, session: ClientSession, run: RunRecord) -> E2bSandbox:
    """The door's sandbox of an adopted ``session`` of ``run``, with a new access token."""
    meta = run.meta
    digests = _digests(meta, ENVD_TOKENS)
    token = secrets.token_urlsafe(24)
    digests = [*digests, token_digest(token)][-MAX_TOKENS:]
    traffic = secrets.token_urlsafe(24)
    traffic_digests = [*_digests(meta, TRAFFIC_TOKENS), token_digest(traffic)][-MAX_TOKENS:]
    with contextlib.suppress(AuditError):
        sandboxes.audit.update_run_meta(run.id, {ENVD_TOKENS: digests, TRAFFIC_TOKENS: traffic_digests})
    metadata = meta.get("metadata")
    started = meta.get("started_at")
    return E2bSandbox(
        session=session, template_id=_template_of(run), access_token=token,
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {},
        env_vars=dict(session.overrides.env),
        started_at=float(started) if isinstance(started, int | float) else run.created,
        token_digests=tuple(digests), lifecycle=lifecycle_of_meta(meta),
        traffic_access_token=traffic, traffic_digests=tuple(traffic_digests),
        public_ports=meta.get("public_ports") is True,
    )


def _digests(meta: Mapping[str, Any], key: str) -> list[str]:
    recorded = meta.get(key)
    return [d for d in recorded if isinstance(d, str)] if isinstance(recorded, list) else []
