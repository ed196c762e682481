"""Commands as root: the policy's opt-in (``[sandbox] root_commands``) and its refusal.

Commands run as the sandbox's unprivileged tool user. A client may ask for ``root`` instead
(E2B's ``user="root"``); that runs only when the policy sets ``root_commands = true`` (see
:class:`~harness.core.sandbox_settings.SandboxSettings` for what root means in a sandbox).
Otherwise the request is refused with :func:`root_refusal`, a policy decision that names the
key and the fix, recorded in the audit like any other refused action. File operations asked
for as root (E2B's ``files.*(user="root")``) follow the same key, and are served as the tool
user's: never with root's rights.
"""

from __future__ import annotations

from harness.core.calls import Action, Decision

__all__ = ["ROOT_COMMANDS_KEY", "ROOT_COMMANDS_LOOSENED", "ROOT_USER", "root_refusal"]

ROOT_USER = "root"
ROOT_COMMANDS_KEY = "sandbox.root_commands"
ROOT_COMMANDS_LOOSENED = (f"{ROOT_COMMANDS_KEY} = true: clients may run commands as root (uid 0 with the "
                          "container's capabilities) in their sandboxes, and file operations asked for as root are "
                          "served as the tool user's, except a read only root may do, done with root's rights (the "
                          "default is false)")


def root_refusal(tool_user: str) -> Decision:
    """The decision for a command asked to run as root under a policy that does not allow it
    (``tool_user``: the sandbox's user as the caller names it)."""
    return Decision(Action.DENY, f"{ROOT_COMMANDS_KEY} = false",
                    f"denied by policy: commands run as the sandbox's unprivileged user {tool_user!r}, not as "
                    f"{ROOT_USER!r} "
                    f"({ROOT_COMMANDS_KEY} = false, the default); leave the user unset, or set "
                    f"[sandbox] root_commands = true in the policy to allow root commands")
