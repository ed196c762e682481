"""``callbox sandbox network NAME [--allow ENTRY]... [--deny ENTRY]... [--no-internet]``: a
running sandbox's network rules.

Without a rule flag it shows the network the sandbox has. With them it replaces the
sandbox's narrowing (every earlier rule goes, as E2B's ``update_network`` does), within
what the sandbox was started with: an ``allowlist`` sandbox's ``allow_hosts`` are the
ceiling, a sandbox with network ``none`` gets nothing more, and one with network ``open``
has no egress proxy to apply rules (refused, saying so). The rules apply from the
sandbox's next connection on. ``--allow`` entries are allowed even if a ``--deny`` entry
names them; ``--no-internet`` denies everything ``--allow`` does not name; ``--clear``
removes the narrowing. Entries are the allowlist's: ``HOST[:PORT]``, ``*.example.com``,
IP literals and CIDR networks; a portless allow entry is ports 80 and 443, a portless deny
entry every port. The change is the policy's ``network`` action (``--policy``), recorded in
the audit store under the sandbox's run; the same operation as the E2B door's
``update_network`` and the gRPC door's ``UpdateNetwork``
(:func:`harness.core.network_request.update_network`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.cli.sandbox_common import connect, gate_options, guarded, load_gate_policy, opened, print_json

if TYPE_CHECKING:
    from harness.engine.spec import SandboxSpec


def add_verbs(verbs: Any) -> None:
    net = verbs.add_parser("network", help="show or change a running sandbox's network rules (within its network)")
    net.add_argument("name", help="sandbox name or id")
    net.add_argument("--allow", action="append", default=[], metavar="ENTRY",
                     help="allow this destination even if --deny names it (HOST[:PORT], *.domain, IP, CIDR)")
    net.add_argument("--deny", action="append", default=[], metavar="ENTRY",
                     help="refuse this destination unless --allow names it (0.0.0.0/0: everything)")
    net.add_argument("--no-internet", action="store_true", help="deny everything --allow does not name")
    net.add_argument("--clear", action="store_true", help="remove the narrowing: all the sandbox's network gives")
    gate_options(net)
    net.add_argument("--json", action="store_true",
                     help="print {name, sandbox_id, network, allow_hosts, allow, deny, summary}")


def network_json(name: str | None, sandbox_id: str, spec: SandboxSpec) -> dict[str, Any]:
    return {"name": name, "sandbox_id": sandbox_id, "network": spec.network, "allow_hosts": list(spec.allow_hosts),
            "allow": list(spec.egress_allow), "deny": list(spec.egress_deny), "summary": spec.network_summary()}


def _network(args: argparse.Namespace) -> int:
    from harness.core.errors import UsageError
    from harness.core.network_request import NetworkRequest, update_network

    changing = bool(args.allow or args.deny or args.no_internet or args.clear)
    if args.clear and (args.allow or args.deny or args.no_internet):
        raise UsageError("--clear removes every rule: give it alone, or give the rules to set instead")
    asked = NetworkRequest(internet=False if args.no_internet else None, allow=tuple(args.allow),
                           deny=tuple(args.deny))
    policy = load_gate_policy(args) if changing else None
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        spec = sandbox.spec
        if policy is not None:
            details = {"sandbox": args.name, "internet": asked.internet, "allow": list(asked.allow),
                       "deny": list(asked.deny)}
            with guarded(args, policy, sandbox.id, "network", details, workdir=spec.workdir) as ticket:
                spec = update_network(sandbox, spec, asked, policy.sandbox.on_internet_request)
                ticket.outcome["network"] = spec.network_summary()
    if args.json:
        print_json(network_json(sandbox.name, sandbox.id, spec))
    else:
        print(f"sandbox {sandbox.label}: network {spec.network_summary()}")
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"network": _network}
