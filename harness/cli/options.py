"""What every command group of the CLI shares: the parser class, the sandbox options and
the spec they make, one-line messages, the engine connection and stdin.

Nothing here imports the docker SDK at import time: ``--help`` and usage errors never
load it.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError

from harness.core.errors import UsageError

if TYPE_CHECKING:
    from harness.core.policy import Policy
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.spec import SandboxSpec

__all__ = [
    "MAX_STDIN_BYTES",
    "UsageParser",
    "connect_engine",
    "first_error",
    "one_line",
    "read_stdin",
    "sandbox_options",
    "say",
    "spec_from_args",
]

MAX_STDIN_BYTES = 64 << 20


class UsageParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def sandbox_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The sandbox flags of `exec` (with the hardened defaults) and `call` (None: the policy decides)."""

    def d(value: object) -> object:
        return value if defaults else None

    group = parser.add_argument_group("sandbox")
    group.add_argument("--image", default=d("callbox-sandbox:latest"), help="local sandbox image")
    group.add_argument("--runtime", choices=["runc", "runsc"], default=d("runc"),
                       help="OCI runtime: runc (default: namespaces and seccomp on the host's kernel) or runsc "
                            "(gVisor's user-space kernel between the tools and the host's; `make runsc` installs "
                            "it; network none only). Never weaker than the policy's sandbox.runtime or [runtime]")
    group.add_argument("--memory", default=d("512m"), help="memory limit, swap equal to it (default 512m)")
    group.add_argument("--cpus", type=float, default=d(1.0), help="CPU quota in cores (default 1)")
    group.add_argument("--pids", type=int, default=d(256), help="process limit for tools (default 256)")
    group.add_argument("--network", choices=["none", "allowlist", "open"], default=d("none"),
                       help="none (default): no network; allowlist: HTTP(S) only through the filtering "
                            "egress proxy, to --allow-host entries; open: outside access, never the host, "
                            "other sandboxes or metadata (needs root for the packet filter)")
    group.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                       help="egress allowlist entry for --network allowlist (repeatable): exact name, "
                            "*.example.com for subdomains, an IP literal; no port means 80 and 443")
    group.add_argument("--mount", action="append", default=[], metavar="HOST:CONTAINER[:ro|rw[,uid=N,gid=N]]",
                       help="bind mount, read-only unless :rw (repeatable); a mount at /workspace, /tmp or "
                            "/home/sandbox replaces the scratch tmpfs there. Tools run as uid=N,gid=N of a rw "
                            "mount (never 0), else its owner if not root, else 1000; each rw mount must be "
                            "writable by that user")
    group.add_argument("--noexec", action="store_true", default=d(False),
                       help="mount /workspace, /tmp and the home directory noexec (default: executable)")
    group.add_argument("--workdir", default=d("/workspace"), help="working directory inside the sandbox")
    group.add_argument("--env", action="append", default=[], metavar="K=V", help="environment variable")


def spec_from_args(args: argparse.Namespace, base: SandboxSpec | None = None, *, policy: Policy | None = None,
                   **extra: object) -> SandboxSpec:
    """The sandbox flags applied over ``base`` (the hardened defaults when None); flags left
    unset (None) keep the base's value, mounts and env add to it. The spec is checked against
    this host (mounts, their writability, cpus, memory) before any engine is contacted.

    The runtime is checked, never raised: ``--runtime`` weaker than ``base``'s (the policy's
    ``sandbox.runtime``, which meets its ``[runtime]`` requirements) or than what ``policy``
    requires is refused, and so is runsc with a network."""
    from harness.core.policy import runtime_network_check, weaker_runtime
    from harness.engine.spec import Mount, SandboxSpec

    fields: dict[str, object] = base.model_dump() if base is not None else {}
    env = dict(base.env) if base is not None else {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: use K=V")
        env[name] = value
    try:
        mounts = tuple(Mount.parse(m) for m in args.mount)
        flags = {"image": args.image, "runtime": args.runtime, "memory": args.memory, "cpus": args.cpus,
                 "pids": args.pids, "network": args.network, "workdir": args.workdir, "noexec": args.noexec or None}
        fields.update({k: v for k, v in flags.items() if v is not None})
        fields["env"] = env
        fields["mounts"] = (*(base.mounts if base is not None else ()), *mounts)
        if args.allow_host:
            fields["allow_hosts"] = tuple(args.allow_host)
        elif fields.get("network") != "allowlist":
            fields["allow_hosts"] = ()  # the policy's list does not apply to another mode
        fields.update(extra)
        spec = SandboxSpec.model_validate(fields).for_host()
    except ValidationError as exc:
        raise UsageError(first_error(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if base is not None and weaker_runtime(spec.runtime, base.runtime):
        raise UsageError(f"--runtime {spec.runtime} is weaker than the policy's sandbox.runtime = "
                         f"\"{base.runtime}\"; a command line may choose a stronger runtime than its policy, "
                         f"never a weaker one: pass --runtime {base.runtime} or leave it out")
    if policy is not None:
        policy.check_runtime(spec.runtime, spec.network, asked_by="--runtime")
    else:
        runtime_network_check(spec.runtime, spec.network, asked_by="--runtime")
    return spec


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


_UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")


def one_line(text: str) -> str:
    """``text`` as one printable line: control and format characters, line separators and
    lone surrogates (a newline or an escape sequence in an argument echoed back) are escaped."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in _UNPRINTABLE else c for c in text)


def say(message: str) -> None:
    """Print ``callbox: <message>`` on stderr, on one line."""
    print(f"callbox: {one_line(message)}", file=sys.stderr)


def connect_engine() -> DockerEngine:
    """The local Docker engine. Imported here so `--help` and usage errors never load the docker SDK."""
    from harness.engine.docker.engine import DockerEngine

    return DockerEngine.connect()


def read_stdin() -> bytes:
    """The caller's piped stdin (nothing when it is a terminal or closed)."""
    if sys.stdin is None or sys.stdin.isatty():
        return b""
    try:
        data = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read stdin: {exc.strerror or exc}") from None
    if len(data) > MAX_STDIN_BYTES:
        raise UsageError(f"stdin is larger than {MAX_STDIN_BYTES >> 20} MiB")
    return data
