"""The ``callbox`` command line.

Every failure a user can cause ends in one line ``callbox: <problem>`` and a non-zero
exit: 2 for usage errors, 125 for callbox's own failures (engine unreachable, image
missing), otherwise the command's own code (124 timeout, 128+N for signal N, 137 OOM).
Output into a pipe whose reader left (``callbox tools | head``) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import sys
import threading
import time
import unicodedata
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from pydantic import ValidationError

from harness.cli import calls as cli_calls
from harness.cli import doctor as cli_doctor
from harness.cli import run as cli_run
from harness.cli import serve as cli_serve
from harness.core.errors import CallboxError, UsageError, short_reason
from harness.core.units import parse_size, timeout_seconds

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.spec import SandboxSpec

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


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="callbox", description="Sandboxed tool execution for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)

    image = sub.add_parser("image", help="build the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, parser_class=UsageParser)
    build = image_sub.add_parser("build", help="build the sandbox image offline (idempotent)")
    build.add_argument("--base", help="use this local base image (Python 3.11+) instead of debootstrap")
    build.add_argument("--tag", default="callbox-sandbox:latest", help="tag for the built image")
    build.add_argument("--wheelhouse", type=Path, help="directory of wheels to use instead of PyPI")

    ex = sub.add_parser("exec", help="run one command in a fresh disposable sandbox")
    sandbox_options(ex)
    ex.add_argument("--timeout", type=timeout_seconds, default=30.0,
                    help="wall-clock limit in seconds, at most 86400 (default 30)")
    ex.add_argument("--json", action="store_true", help="print one JSON result object instead of streaming")
    ex.add_argument("--output-cap", default="1m", help="bytes kept per stream, head and tail (default 1m)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")

    ps = sub.add_parser("ps", help="list live sandboxes")
    ps.add_argument("--json", action="store_true",
                    help="print a JSON list of {sandbox_id, container_id, status, expires_at, expires_in_s, "
                         "expired, owner}")
    gc = sub.add_parser("gc", help="remove expired or orphaned sandboxes")
    gc.add_argument("--json", action="store_true", help="print one JSON object {removed: [ids], count}")
    cli_calls.add_parsers(sub)
    cli_run.add_parser(sub)
    cli_serve.add_parsers(sub)
    cli_doctor.add_parsers(sub)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: ``callbox X.Y.Z`` from the installed package's metadata, exit 0
    (looked up only when asked, so other commands do not pay for it)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print callbox's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> NoReturn:
        import importlib.metadata

        try:
            version = importlib.metadata.version("callbox")
        except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
            version = "(not installed)"
        print(f"callbox {version}")
        parser.exit(0)


def _terminate(signum: int, _frame: object) -> NoReturn:
    # Unwind through every `finally`, so a sandbox being used is destroyed, not leaked.
    raise SystemExit(128 + signum)


EXIT_CLOSED_OUTPUT = 128 + signal.SIGPIPE
"""141: what a shell reports for a process its pipe's reader left (``callbox tools | head``)."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        code = _main(args_list)
        sys.stdout.flush()  # buffered output meets a closed pipe here, not at interpreter exit
        return code
    except BrokenPipeError as exc:
        # Python ignores SIGPIPE, so a reader that left shows up as this exception, raised
        # through every `finally` (a sandbox in use is destroyed on the way out).
        return _output_closed(exc)


def _main(args_list: list[str]) -> int:
    try:
        args = build_parser().parse_args(args_list)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="callbox: %(message)s",
        )
        return _dispatch(args)
    except CallboxError as error:
        say(error.message)
        return error.exit_code
    except KeyboardInterrupt:
        print("callbox: interrupted", file=sys.stderr)
        return 130


_UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")


def one_line(text: str) -> str:
    """``text`` as one printable line: control and format characters, line separators and
    lone surrogates (a newline or an escape sequence in an argument echoed back) are escaped."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in _UNPRINTABLE else c for c in text)


def say(message: str) -> None:
    """Print ``callbox: <message>`` on stderr, on one line."""
    print(f"callbox: {one_line(message)}", file=sys.stderr)


def _output_closed(exc: BrokenPipeError) -> int:
    """End quietly with 141 when stdout or stderr lost its reader; any other broken pipe is
    callbox's own failure."""
    closed = [s for s in (sys.stdout, sys.stderr) if _reader_gone(s) is not False]
    if not closed:
        say(short_reason(exc))
        return 125
    for stream in closed:
        # Nothing more can reach that reader; point the descriptor at /dev/null so the
        # interpreter's final flush does not report the same broken pipe again.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
    return EXIT_CLOSED_OUTPUT


def _reader_gone(stream: TextIO | None) -> bool | None:
    """Whether ``stream`` is a pipe or socket whose other end was closed (None: cannot tell)."""
    if stream is None:
        return None
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return None
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "image":
        return _image_build(args)
    if args.command == "exec":
        return _exec(args)
    if args.command == "ps":
        return _ps(args)
    if args.command == "gc":
        return _gc(args)
    if args.command in cli_calls.COMMANDS:
        return cli_calls.run(args)
    if args.command == "run":
        return cli_run.run(args)
    if args.command in cli_serve.COMMANDS:
        return cli_serve.run(args)
    if args.command in cli_doctor.COMMANDS:
        return cli_doctor.run(args)
    raise UsageError(f"unknown command {args.command}")


def _engine() -> DockerEngine:
    # Imported here so `--help` and usage errors never load the docker SDK.
    from harness.engine.docker.engine import DockerEngine

    return DockerEngine.connect()


def _image_build(args: argparse.Namespace) -> int:
    from harness.engine.docker.engine import connect_client
    from harness.engine.image import ImageBuildError, build_image

    client = connect_client(timeout=600)
    repo_root = Path(__file__).resolve().parents[2]
    try:
        result = build_image(client, repo_root=repo_root, base=args.base, tag=args.tag,
                             wheelhouse=args.wheelhouse, progress=lambda line: print(f"callbox: {line}",
                                                                                    file=sys.stderr))
    except ImageBuildError as exc:
        raise CallboxError(str(exc)) from None
    state = "built" if result.built else "up to date"
    print(f"{result.tag} {state} ({result.image_id[:19]}, {result.seconds:.1f} s)")
    return 0


def spec_from_args(args: argparse.Namespace, base: SandboxSpec | None = None, **extra: object) -> SandboxSpec:
    """The sandbox flags applied over ``base`` (the hardened defaults when None); flags left
    unset (None) keep the base's value, mounts and env add to it. The spec is checked against
    this host (mounts, their writability, cpus, memory) before any engine is contacted."""
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
        flags = {"image": args.image, "memory": args.memory, "cpus": args.cpus, "pids": args.pids,
                 "network": args.network, "workdir": args.workdir, "noexec": args.noexec or None}
        fields.update({k: v for k, v in flags.items() if v is not None})
        fields["env"] = env
        fields["mounts"] = (*(base.mounts if base is not None else ()), *mounts)
        if args.allow_host:
            fields["allow_hosts"] = tuple(args.allow_host)
        elif fields.get("network") != "allowlist":
            fields["allow_hosts"] = ()  # the policy's list does not apply to another mode
        fields.update(extra)
        return SandboxSpec.model_validate(fields).for_host()
    except ValidationError as exc:
        raise UsageError(first_error(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _exec(args: argparse.Namespace) -> int:
    from harness.core.errors import AgentCallError
    from harness.engine.exec_result import ExecResult, collect, gap_marker, start_failure_exit_code

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given: use `callbox exec [OPTIONS] -- CMD [ARG...]`")
    try:
        cap = parse_size(args.output_cap)
    except ValueError as exc:
        raise UsageError(f"--output-cap: {exc}") from None
    spec = spec_from_args(args, ttl_seconds=max(600, int(args.timeout) + 300))
    stdin = _read_stdin()

    def stream(name: str, data: bytes, dropped_before: int) -> None:
        out = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        if dropped_before:
            out.write(gap_marker(dropped_before))
        out.write(data)
        out.flush()

    engine = _engine()
    sandbox = engine.create(spec)
    try:
        events = sandbox.agent.exec(
            cmd, cwd=spec.workdir, env=sandbox.spec.env, stdin=stdin, timeout_ms=int(args.timeout * 1000),
            output_cap_bytes=cap, rpc_timeout=args.timeout + 60,
        )
        try:
            result = collect(events, on_output=None if args.json else stream)
        except AgentCallError as error:
            code = start_failure_exit_code(error)
            if code is None:
                raise
            result = ExecResult.not_started(code, error.message)
        finally:
            # On any way out (a reader that left raises BrokenPipeError in stream()), the
            # RPC is cancelled before the sandbox is destroyed.
            if isinstance(events, Generator):
                events.close()
    finally:
        sandbox.destroy()
    if args.json:
        print(json.dumps(result.to_json()))
    elif result.error is not None:
        say(result.error)
    elif result.timed_out:
        print(f"callbox: timed out after {args.timeout:g} s; the process tree was killed", file=sys.stderr)
    elif result.oom_killed:
        print(f"callbox: killed by the OOM killer (memory limit {args.memory})", file=sys.stderr)
    return result.shell_exit_code


def _read_stdin() -> bytes:
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


def _ps(args: argparse.Namespace) -> int:
    engine = _engine()
    now = time.time()
    rows = [{
        "sandbox_id": info.sandbox_id,
        "container_id": info.container_id,
        "status": info.status,
        "expires_at": info.expires,
        "expires_in_s": round(info.expires - now),
        "expired": info.expires <= now,
        "owner": info.owner,
    } for info in engine.list_sandboxes()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'SANDBOX':<14}{'CONTAINER':<14}{'STATUS':<10}{'EXPIRES IN':<12}OWNER")
    for row in rows:
        expires = "expired" if row["expired"] else f"{row['expires_in_s']}s"
        print(f"{row['sandbox_id']:<14}{row['container_id']:<14}{row['status']:<10}{expires:<12}{row['owner']}")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from harness.engine.docker.engine import DockerEngine, connect_client

    client = connect_client()
    engine = DockerEngine(client, reap_on_start=False)
    removed = engine.gc()
    if args.json:
        print(json.dumps({"removed": removed, "count": len(removed)}))
        return 0
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    print(f"{len(removed)} sandbox(es) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
