"""Changing a running sandbox's network rules: the narrowing of its allowlist.

A sandbox with ``network = "allowlist"`` reaches the outside only through its egress proxy,
which reads the spec's narrowing (``egress_allow``/``egress_deny``) from a rules file and
reads it again before the next request whenever it changes
(:meth:`harness.engine.docker.networks.SandboxNetworks.set_rules`). So a change applies to
the next request the sandbox makes, with no restart; connections already open go on.

Only the narrowing changes: the allowlist itself (``allow_hosts``, the policy's ceiling) is
fixed when the sandbox starts, and a sandbox with network ``none`` or ``open`` has no proxy
whose rules could change (``not_supported``, naming why). The new spec replaces the
sandbox's (this process's object) and that of its lifetime record, if it has one, so
another process that opens it sees the same rules.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import ValidationError

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.docker.lifetime import locked, read_record, write_record
from harness.engine.spec import SandboxSpec, SpecError

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.sandbox import Sandbox

__all__ = ["set_network_rules"]


def set_network_rules(engine: DockerEngine, sandbox: Sandbox, allow: tuple[str, ...],
                      deny: tuple[str, ...]) -> SandboxSpec:
    """Narrow ``sandbox``'s allowlist to ``allow``/``deny`` from its next request on (both
    empty: no narrowing); its new spec. ``not_supported`` unless its network is
    ``allowlist``; ``SpecError`` (``invalid_request``) for an entry the proxy cannot parse."""
    spec = sandbox.spec
    if spec.network != "allowlist":
        raise CallboxError(
            f"sandbox {sandbox.label} has network {spec.network!r}: only an 'allowlist' sandbox has an egress "
            "proxy whose rules can change while it runs; create it with network 'allowlist' (or E2B "
            "network rules) to change them later", code=ErrorCode.NOT_SUPPORTED)
    try:
        updated = SandboxSpec.model_validate({**spec.model_dump(), "egress_allow": allow, "egress_deny": deny})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SpecError("egress_allow", str(error.get("msg", exc)).removeprefix("Value error, ")) from None
    engine.networks.set_rules(sandbox.id, updated.egress_allow, updated.egress_deny)
    sandbox.spec = updated
    with locked(engine.run_root), contextlib.suppress(FileNotFoundError):
        record = read_record(engine.run_root, sandbox.id)
        if record is not None:
            write_record(engine.run_root, replace(record, spec=updated.model_dump(mode="json")))
    return updated
