"""The secrets a policy gives its sandboxes: its ``[[secret]]`` tables and the secret headers
of its declared ``http`` tools (:mod:`harness.engine.secrets` defines them; the egress proxy
carries them), and the passwords of its declared ``sql`` tools (the sandbox gets one only
inside a call's request; :func:`tool_password_pairs` has each redacted like a secret).

:func:`sandbox_secrets` is what :meth:`Policy.sandbox_spec` puts in the spec;
:func:`secret_problems` is what the policy loader checks before the first call: each
``[[secret]]``'s value can be read, and the ``openssl`` command that makes each sandbox's
certificate authority is installed.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from harness.core.declared_http import implied_secrets
from harness.core.errors import CallboxError
from harness.engine.secrets import SecretSpec
from sandbox.egress_policy import Allowlist, split_host_port

if TYPE_CHECKING:
    from harness.core.policy import Policy

__all__ = ["SecretSpec", "sandbox_secrets", "secret_problems", "tool_password_pairs"]


def sandbox_secrets(policy: Policy) -> tuple[SecretSpec, ...]:
    """The policy's ``[[secret]]`` and, when its network is an allowlist, the secret headers of
    the http tools it exposes whose hosts ``allow_hosts`` allows (optional: a variable that is
    not set is their call's error; a host not allowed is the tool's own error)."""
    if policy.sandbox.network != "allowlist":
        return policy.secret
    allowlist = Allowlist.parse(policy.sandbox.allow_hosts)
    implied = [s for t in policy.tool if t.kind == "http" and policy.tool_allowed(t.name) for s in implied_secrets(t)
               if all(allowlist.permits(host, port or 443) is None for host, port in map(split_host_port, s.hosts))]
    return (*policy.secret, *implied)


def tool_password_pairs(policy: Policy) -> list[tuple[str, str]]:
    """``(kind, value)`` pairs for the redactor: the password of each declared sql tool that
    can be read now (one that cannot is that tool's call's error, not the session's)."""
    pairs: list[tuple[str, str]] = []
    for tool in policy.tool:
        if tool.kind == "sql" and tool.password is not None:
            try:
                pairs.append((f"secret:{tool.name}.password", tool.password.read(tool.name)))
            except CallboxError:
                continue
    return pairs


def secret_problems(policy: Policy) -> str | None:
    """Why the policy's secrets cannot be used (a value that cannot be read, no openssl), or None."""
    secrets = policy.secret
    if sandbox_secrets(policy) and shutil.which("openssl") is None:
        return ("this policy's secrets ([[secret]], or a declared http tool's secret header) need the openssl "
                "command where callbox runs, to make each sandbox's certificate authority; install it "
                "(Debian: apt-get install openssl)")
    for index, secret in enumerate(secrets):
        try:
            secret.read()
        except CallboxError as exc:
            return f"key 'secret[{index}]': {exc}"
    return None
