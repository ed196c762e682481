"""What every command group of the CLI shares: the parser class, the sandbox options and
the spec they make, one-line messages, the engine connection and stdin.

Nothing here imports the docker SDK at import time: ``--help`` and usage errors never
load it.
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from pydantic import ValidationError

from harness.core.errors import UsageError

if TYPE_CHECKING:
    from harness.core.policy import Policy
    from harness.engine.base import Engine
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.select import EngineChoice
    from harness.engine.spec import SandboxSpec

__all__ = [
    "MAX_STDIN_BYTES",
    "UsageParser",
    "connect_engine",
    "engine_choice",
    "engine_options",
    "one_line",
    "policy_engine",
    "read_stdin",
    "sandbox_options",
    "say",
    "setting_name",
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
                            "it; every network mode, on gVisor's own network stack). Never weaker than the "
                            "policy's sandbox.runtime or [runtime]")
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
    requires is refused."""
    from harness.core.policy import weaker_runtime
    from harness.core.problems import describe_validation_error
    from harness.engine.spec import Mount, SandboxSpec, SpecError

    fields: dict[str, object] = base.model_dump() if base is not None else {}
    env = dict(base.env) if base is not None else {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: use K=V")
        env[name] = value
    mounts = []
    for text in args.mount:
        try:
            mounts.append(Mount.parse(text))
        except ValidationError as exc:
            flag = _always(f"--mount {text}")  # the entry's problems name the entry
            raise UsageError(describe_validation_error(exc, Mount, name=flag)[0]) from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    flags = {"image": args.image, "runtime": args.runtime, "memory": args.memory, "cpus": args.cpus,
             "pids": args.pids, "network": args.network, "workdir": args.workdir, "noexec": args.noexec or None}
    given = {key for key, value in flags.items() if value is not None}
    listed = {"env": args.env, "mounts": args.mount, "allow_hosts": args.allow_host}
    given |= {key for key, values in listed.items() if values}
    fields.update({k: v for k, v in flags.items() if v is not None})
    fields["env"] = env
    fields["mounts"] = (*(base.mounts if base is not None else ()), *mounts)
    if args.allow_host:
        fields["allow_hosts"] = tuple(args.allow_host)
    elif fields.get("network") != "allowlist":
        fields["allow_hosts"] = ()  # the policy's list does not apply to another mode
    fields.update(extra)

    def named(path: str) -> str:
        return setting_name(path, given, from_policy=base is not None)

    try:
        spec = SandboxSpec.model_validate(fields).for_host()
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, SandboxSpec, name=named)[0]) from None
    except SpecError as exc:  # the setting's name it starts with becomes its flag's; a mount's names the mount
        raise UsageError(exc.message if exc.problem == exc.message else f"{named(exc.key)}: {exc.problem}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if base is not None and weaker_runtime(spec.runtime, base.runtime):
        raise UsageError(f"--runtime {spec.runtime} is weaker than the policy's sandbox.runtime = "
                         f"\"{base.runtime}\"; a command line may choose a stronger runtime than its policy, "
                         f"never a weaker one: pass --runtime {base.runtime} or leave it out")
    if policy is not None:
        policy.check_runtime(spec.runtime, spec.network, asked_by="--runtime")
    return spec


def _always(name: str) -> Callable[[str], str]:
    return lambda _path: name


SPEC_FLAGS = {"image": "--image", "runtime": "--runtime", "memory": "--memory", "cpus": "--cpus", "pids": "--pids",
              "network": "--network", "allow_hosts": "--allow-host", "mounts": "--mount", "noexec": "--noexec",
              "workdir": "--workdir", "env": "--env"}
"""The spec's settings the sandbox flags set, and their flags."""


def setting_name(path: str, given: Collection[str], *, from_policy: bool) -> str:
    """How a message names the spec setting at ``path`` (``memory``, ``mounts[1].source``):
    the flag that set it when it is in ``given`` (``--memory``), else the policy's key
    (``sandbox.memory``) when the rest came from a policy, else the setting's own name."""
    key = path.partition(".")[0].partition("[")[0]
    if key in given and key in SPEC_FLAGS:
        return SPEC_FLAGS[key]
    return f"sandbox.{path}" if from_policy else path


_UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")


def one_line(text: str) -> str:
    """``text`` as one printable line: control and format characters, line separators and
    lone surrogates (a newline or an escape sequence in an argument echoed back) are escaped."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in _UNPRINTABLE else c for c in text)


def say(message: str) -> None:
    """Print ``callbox: <message>`` on stderr, on one line."""
    print(f"callbox: {one_line(message)}", file=sys.stderr)


def engine_options(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--ray-address`` and ``--ray-token-file``: where the sandboxes run."""
    group = parser.add_argument_group("engine")
    group.add_argument("--engine", choices=["docker", "ray"],
                       help="where sandboxes run: docker (this machine's Docker engine; the default unless "
                            "CALLBOX_ENGINE, the policy or the configuration says engine = \"ray\") or ray (the "
                            "nodes of a Ray cluster)")
    group.add_argument("--ray-address", metavar="HOST:PORT",
                       help="with --engine ray: the cluster's GCS address (what `ray start --head` prints), or auto "
                            "(the cluster this machine is a node of); over CALLBOX_RAY_ADDRESS and [ray] address")
    group.add_argument("--ray-token-file", type=Path, metavar="FILE",
                       help="with --engine ray: the cluster's token (RAY_AUTH_TOKEN_PATH), mode 0600; over "
                            "CALLBOX_RAY_TOKEN_FILE and [ray] token_file")


RAY_FLAGS = {"address": "--ray-address", "token_file": "--ray-token-file"}
"""The ``[ray]`` keys the command line sets, and their flags."""
ENGINE_ENV = "CALLBOX_ENGINE"
RAY_ENV = {"address": "CALLBOX_RAY_ADDRESS", "token_file": "CALLBOX_RAY_TOKEN_FILE"}
"""The environment's defaults for ``--engine`` and the ``--ray-*`` flags (so a shell that
works with one cluster need not repeat them on every command). The ``CALLBOX_RAY_*`` ones
apply only when the engine is Ray."""


def engine_choice(args: argparse.Namespace, base: EngineChoice | None = None) -> EngineChoice:
    """The engine the command line chooses over ``base`` (a policy's or configuration's choice;
    None: Docker): ``--engine`` over ``CALLBOX_ENGINE`` over its engine, ``--ray-*`` over
    ``CALLBOX_RAY_*`` over its ``[ray]`` keys. A flag or variable that does not fit (Ray
    settings for Docker, Ray without an address or a usable token file) is a UsageError
    naming it."""
    from harness.engine.ray.settings import RaySettings
    from harness.engine.select import DOCKER, EngineChoice

    from_env = os.environ.get(ENGINE_ENV) or None
    if from_env is not None and from_env not in ("docker", "ray"):
        raise UsageError(f"{ENGINE_ENV}={from_env!r}: the engine is docker or ray")
    engine = getattr(args, "engine", None) or from_env or (base.engine if base is not None else "docker")
    given = {key: getattr(args, f"ray_{key}", None) for key in RAY_FLAGS}
    if engine == "docker":
        for key, value in given.items():
            if value is not None:
                raise UsageError(f"{RAY_FLAGS[key]} is for the Ray engine: add --engine ray, or leave it out")
        return DOCKER
    fields = base.ray.model_dump() if base is not None and base.ray is not None else {}
    named = dict(RAY_FLAGS)
    for key, variable in RAY_ENV.items():
        if given[key] is None and os.environ.get(variable):
            given[key], named[key] = os.environ[variable], variable
    if given["address"] is not None:
        fields["address"] = given["address"]
    if given["token_file"] is not None:
        fields["token_file"] = Path(given["token_file"]).expanduser().absolute()
    if "address" not in fields:
        raise UsageError("--engine ray needs the cluster's address: --ray-address HOST:PORT (the GCS address "
                         "`ray start --head` printed on the head node), and --ray-token-file FILE with its token "
                         "(or CALLBOX_RAY_ADDRESS and CALLBOX_RAY_TOKEN_FILE in the environment)")
    try:
        return EngineChoice(engine="ray", ray=RaySettings.model_validate(fields))
    except ValidationError as exc:
        raise UsageError(_ray_flag_error(exc, named)) from None


def _ray_flag_error(exc: ValidationError, named: dict[str, str]) -> str:
    error = exc.errors(include_url=False)[0]
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    loc = tuple(error.get("loc", ()))
    if message.startswith("token_file is required"):
        return ("--engine ray needs --ray-token-file FILE (or CALLBOX_RAY_TOKEN_FILE): the cluster's token "
                "(`ray get-auth-token` on the head prints it), in a file of mode 0600")
    key = str(loc[-1]) if loc else ("token_file" if message.startswith("token_file") else "")
    if key in named:
        return f"{named[key]}: {message.removeprefix('token_file ')}"
    return f"ray.{key}: {message}" if key else f"--engine ray: {message}"


def policy_engine(args: argparse.Namespace, policy: Policy) -> tuple[Policy, Callable[[], Engine]]:
    """``policy`` saying the engine the command line chooses over the policy's own (so a paused
    run's checkpoint keeps it), and a Session's ``engine_factory`` for it: Docker's connects
    when the first sandbox starts, as before; Ray's now, so a cluster that cannot be reached
    ends the command before a model is asked anything."""
    from harness.engine.select import choice_of, connect_engine, engine_connector, with_engine

    choice = engine_choice(args, choice_of(policy.engine, policy.ray))
    if choice.ray is None:
        return with_engine(policy, choice), engine_connector(choice)
    engine = connect_engine(choice)
    return with_engine(policy, choice), lambda: engine


def connect_engine(args: argparse.Namespace | None = None) -> DockerEngine:
    """The engine the command line chooses (``--engine``; Docker without it), connected.
    Imported here so `--help` and usage errors never load the docker SDK or ray."""
    from harness.engine.select import connect_engine as connect

    engine = connect(engine_choice(args) if args is not None else None)
    # The Ray engine has the Docker engine's public surface (create, open, list_sandboxes, gc,
    # snapshots, ...), which the commands are written against.
    return cast("DockerEngine", engine)


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
