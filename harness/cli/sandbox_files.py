"""``callbox sandbox cp | port``: files both ways and a sandbox port on the host's loopback.

``cp SRC DST``: exactly one side is ``NAME:PATH`` (a sandbox path; relative to its workdir,
``NAME:`` alone is the workdir), the other a host path (write ``./a:b`` for a host path with
a colon). Destinations work like ``docker cp``: copying ``web:/workspace/src`` to an existing
host directory ``out`` gives ``out/src``, else ``out`` is the copy; existing files are
replaced, directories merged. Both ways stream (memory stays bounded). It is the
``copy_in`` or ``copy_out`` action, its sandbox-side path what the policy's path rules see.

``port NAME PORT``: listens on 127.0.0.1 (``--host-port``, default a free port) and carries
each connection to PORT on the sandbox's own loopback, through its agent (the sandbox needs
no network), until Ctrl-C or SIGTERM (then exit 0). It first prints the URL
(``http://127.0.0.1:P``), with ``--json`` a line ``{host, host_port, sandbox_port, url,
sandbox, sandbox_id}``, then one line per connection (stderr; with ``--json`` a line
``{connection, peer}`` on stdout) and at the end ``{closed: true, connections}``. It is the
``port_forward`` action, which the default policy denies: allow it (or some ports) with
``[actions.port_forward]`` in a policy given with ``--policy``.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from harness.cli.sandbox_common import (
    connect,
    gate_options,
    guarded,
    load_gate_policy,
    opened,
    print_json,
    run_of,
    size,
)
from harness.core.errors import UsageError

if TYPE_CHECKING:
    from harness.engine.docker.sandbox import Sandbox
    from harness.engine.ports import PortForward
    from harness.engine.transfer import CopyResult


def add_verbs(verbs: Any) -> None:
    cp = verbs.add_parser("cp", help="copy files between the host and a sandbox (one side NAME:PATH)")
    cp.add_argument("src", help="NAME:PATH in a sandbox, or a host path")
    cp.add_argument("dst", help="a host path, or NAME:PATH in a sandbox")
    cp.add_argument("--json", action="store_true",
                    help="print {direction, sandbox, sandbox_id, sandbox_path, host_path, files, dirs, symlinks, "
                         "bytes, skipped, seconds, mb_per_s}")
    gate_options(cp)

    port = verbs.add_parser("port", help="forward a host loopback port to a sandbox port until Ctrl-C")
    port.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    port.add_argument("port", type=_port_number(1), help="the port in the sandbox (its loopback)")
    port.add_argument("--host-port", type=_port_number(0), default=0, metavar="P",
                      help="the host port on 127.0.0.1 (default 0: a free one)")
    port.add_argument("--json", action="store_true",
                      help="print JSON lines: {host, host_port, sandbox_port, url, sandbox, sandbox_id} first, "
                           "{connection, peer} per connection, {closed, connections} at the end")
    gate_options(port)


def _port_number(lowest: int) -> Callable[[str], int]:
    """An argparse ``type``: a port from ``lowest`` to 65535."""

    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
        if not lowest <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{text} is not a port from {lowest} to 65535")
        return value

    return port


SERVER_RUN_ID = re.compile(r"[a-z0-9]+-[0-9]{8}T[0-9]{6}-[0-9a-f]{12}")
"""The id a server gives its sandbox's run, which its clients know it by (``e2b-20250102T030405-0123456789ab``)."""


def split_endpoint(text: str) -> tuple[str, str] | None:
    """``("web", "/workspace/x")`` for ``web:/workspace/x``; None for a host path. The part
    before the first colon must be a sandbox name or id (no ``/``), or a server's run id."""
    from harness.engine.docker.lifetime import NAME_PATTERN

    head, colon, path = text.partition(":")
    if not colon or not (NAME_PATTERN.fullmatch(head) or SERVER_RUN_ID.fullmatch(head)):
        return None
    return head, path


def sandbox_path(path: str, workdir: str) -> str:
    """A sandbox path made absolute against ``workdir`` (empty: the workdir itself)."""
    joined = posixpath.normpath(posixpath.join(workdir, path)) if path else workdir
    return "/" + joined.lstrip("/")


def plan_copy(src: str, dst: str) -> tuple[str, str, str, str]:
    """``(direction, sandbox, sandbox side, host side)`` of ``cp SRC DST``; UsageError unless
    exactly one side is in a sandbox."""
    source, target = split_endpoint(src), split_endpoint(dst)
    if source is not None and target is not None:
        raise UsageError("both sides are in a sandbox; copy out to the host first, then in (`callbox sandbox cp "
                         "A:PATH DIR`, then `callbox sandbox cp DIR B:PATH`)")
    if source is None and target is None:
        raise UsageError("neither side is in a sandbox; write one of them as NAME:PATH (e.g. web:/workspace)")
    if source is not None:
        return "out", source[0], source[1], dst
    assert target is not None
    return "in", target[0], target[1], src


def _cp(args: argparse.Namespace) -> int:
    direction, name, inside, host = plan_copy(args.src, args.dst)
    if not host:
        raise UsageError("the host path is empty; give a file or directory (. for here)")
    policy = load_gate_policy(args)
    engine = connect(args)
    host_path = Path(host)
    with opened(engine, name) as sandbox:
        path = sandbox_path(inside, sandbox.spec.workdir)
        transfer = sandbox.transfer
        details = {"sandbox": name, "path": path, "host_path": str(host_path.absolute())}
        action = "copy_in" if direction == "in" else "copy_out"
        with guarded(args, policy, run_of(sandbox), action, details, workdir=sandbox.spec.workdir) as ticket:
            if direction == "in":
                result = transfer.copy_in(host_path, path, overwrite=True)
            else:
                result = transfer.copy_out(path, host_path)
            ticket.outcome.update(files=result.files, bytes=result.bytes)
    _say_copy(args, sandbox, direction, path, host, result)
    return 0


def _say_copy(args: argparse.Namespace, sandbox: Sandbox, direction: str, path: str, host: str,
              result: CopyResult) -> None:
    rate = result.bytes / 1e6 / result.seconds if result.seconds > 0 else 0.0
    if args.json:
        print_json({"direction": direction, "sandbox": sandbox.label, "sandbox_id": sandbox.id, "sandbox_path": path,
                    "host_path": host, **result.to_json(), "mb_per_s": round(rate, 2)})
        return
    where = f"{host} -> {sandbox.label}:{path}" if direction == "in" else f"{sandbox.label}:{path} -> {host}"
    links = f", {_count(result.symlinks, 'symlink')}" if result.symlinks else ""
    print(f"copied {_count(result.files, 'file')}, {_count(result.dirs, 'dir')}{links} ({size(result.bytes)}) {where} "
          f"in {result.seconds:.2f} s ({rate:.1f} MB/s)")
    for note in result.skipped:
        print(f"callbox: left out: {note}", file=sys.stderr)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


class _Stop(BaseException):
    """Ctrl-C or SIGTERM: end the forward (a normal end)."""


def _stop(_signum: int, _frame: object) -> NoReturn:
    raise _Stop


def _port(args: argparse.Namespace) -> int:
    from harness.engine.ports import forward_port

    policy = load_gate_policy(args)
    engine = connect(args)
    lock = threading.Lock()

    def log_connection(peer: tuple[str, int]) -> None:
        with lock:
            count = forward.connections if forward is not None else 0
            if args.json:
                print_json({"connection": count, "peer": f"{peer[0]}:{peer[1]}"})
            else:
                print(f"callbox: connection {count} from {peer[0]}:{peer[1]}", file=sys.stderr, flush=True)

    forward: PortForward | None = None
    with opened(engine, args.name) as sandbox:
        details = {"sandbox": args.name, "port": args.port, "host_port": args.host_port}
        with guarded(args, policy, run_of(sandbox), "port_forward", details, workdir=sandbox.spec.workdir) as ticket:
            sandbox.require_running()
            previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                forward = forward_port(sandbox.agent, args.port, host_port=args.host_port,
                                       on_connection=log_connection)
                url = f"http://{forward.address}"
                with lock:
                    if args.json:
                        print_json({"host": forward.host, "host_port": forward.host_port,
                                    "sandbox_port": args.port, "url": url, "sandbox": sandbox.label,
                                    "sandbox_id": sandbox.id})
                    else:
                        print(url, flush=True)
                        print(f"callbox: forwarding {forward.address} to port {args.port} of sandbox "
                              f"{sandbox.label}; Ctrl-C stops", file=sys.stderr, flush=True)
                while True:
                    signal.pause()
            except _Stop:
                pass
            finally:
                if forward is not None:
                    forward.close()
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
            connections = forward.connections if forward is not None else 0
            ticket.outcome.update(host_port=forward.host_port if forward else 0, connections=connections)
    if args.json:
        print_json({"closed": True, "connections": connections})
    else:
        print(f"callbox: forward closed after {connections} connection(s)", file=sys.stderr)
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"cp": _cp, "port": _port}
