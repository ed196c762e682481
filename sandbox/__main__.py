"""``python3 -m sandbox``: start the in-container agent.

The process spawner is forked first, while this process is still single-threaded and
has imported only what the spawner needs; only then is the rest (the argument parser,
gRPC, the services) imported and the server started. Every page this process writes
after the fork is copied, and the spawner keeps the original: what is imported before
the fork costs its memory twice.
"""

from __future__ import annotations

import os

# The agent never forks after gRPC starts (the spawner does that), so gRPC's fork
# handlers, which restart its threads in a child, are never wanted.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import sys

from sandbox.spawner import Spawner

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing is imported after the fork
if TYPE_CHECKING:
    import argparse

    from sandbox.launch import ToolUser


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="callbox-agent", description="The callbox in-container agent.")
    parser.add_argument("--socket", default="/run/callbox/agent.sock", help="unix socket to serve on")
    parser.add_argument("--workspace", default="/workspace", help="base directory for relative paths")
    parser.add_argument("--root", action="append", default=[], help="a directory file operations may touch")
    parser.add_argument("--uid", type=int, help="uid tool processes run as (default: the sandbox user)")
    parser.add_argument("--gid", type=int, help="gid tool processes run as (default: the uid's group)")
    parser.add_argument("--home", help="the tool user's HOME (default: from the user database, else /home/sandbox)")
    parser.add_argument("--tool-env", action="append", default=[], metavar="NAME=VALUE",
                        help="the image's environment, the base of every tool process's (repeatable)")
    parser.add_argument("--scratch-tmp", help="the scratch /tmp (a fresh tmpfs) to make world-writable and sticky")
    parser.add_argument("--gvisor", action="store_true",
                        help="the sandbox runs on gVisor: check its seccomp profile is applied, answer clone3 ENOSYS")
    parser.add_argument("--max-concurrent", type=int, default=32, help="concurrent commands at most")
    return parser


def _tool_user(uid: int | None, gid: int | None, home: str | None = None,
               tool_env: list[str] | None = None) -> ToolUser:
    """Who tool processes run as: ``uid`` (default the image's ``sandbox`` user), named and
    homed by the image's user database when it has the uid, else ``sandbox`` in /home/sandbox;
    ``home`` overrides the home, ``tool_env`` (``NAME=VALUE``) is the image's environment."""
    import pwd

    from sandbox.launch import ToolUser

    base = dict(entry.split("=", 1) for entry in tool_env or [] if "=" in entry) if tool_env else None
    if uid is None:
        entry = pwd.getpwnam("sandbox")
        return ToolUser(entry.pw_uid, gid if gid is not None else entry.pw_gid, home or entry.pw_dir,
                        entry.pw_name, base)
    if uid == 0:
        raise SystemExit("callbox-agent: tool processes never run as uid 0")
    try:
        entry = pwd.getpwuid(uid)
        found_home, name = entry.pw_dir, entry.pw_name
        default_gid = entry.pw_gid
    except (KeyError, OSError):
        found_home, name, default_gid = "/home/sandbox", "sandbox", uid
    return ToolUser(uid, gid if gid is not None else default_gid, home or found_home, name, base)


def _open_scratch_tmp(path: str | None) -> None:
    """Make the scratch /tmp mode 1777. Docker mounts the tmpfs with that mode, then gives it
    the mode of the image's own directory there, which an image may have made 0755; only a
    root-owned directory (the tmpfs, never a user's mount) is changed."""
    import stat

    if not path:
        return
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) != 0o1777:
        os.chmod(path, 0o1777)  # noqa: S103 (a fresh, empty tmpfs: what /tmp is everywhere)


DEFERRED_MODULES = ("asyncio", "grpc.aio", "google.protobuf.internal.python_message")
"""Imported but never used by the agent, so imported only if something touches them: asyncio
(and ssl with it) and gRPC's asyncio API, which gRPC imports at once (3.4 MiB per sandbox);
protobuf's pure-Python message classes (and its text format with them), which its upb classes
replace (1 MiB)."""


def _defer(names: tuple[str, ...]) -> None:
    """Stand a placeholder in for each module in ``names`` not imported yet: importing the name
    binds the placeholder, and the first use of one of its attributes imports the real module."""
    import importlib
    import types

    class Deferred(types.ModuleType):
        def __getattr__(self, attribute: str) -> object:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            return getattr(importlib.import_module(self.__name__), attribute)

    for name in names:
        if name not in sys.modules:
            sys.modules[name] = Deferred(name)


MALLOC_TUNING = ((-8, 1), (-3, 4 << 20), (-1, 8 << 20))
"""glibc ``mallopt`` settings for the agent (M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD).

By default glibc gives each thread that allocates its own arena, and serves each block of 1 MiB
(an output message, the read before it) with a fresh ``mmap``: every message of a large output
costs page faults and page clearing, and after a large output the agent held some 20 MiB more
than before it. One arena, blocks up to 4 MiB from the heap and at most 8 MiB kept free at its
top: measured with ``head -c 64M``, the agent spends about 40% less CPU per stream and keeps
less memory after it, and an idle agent holds slightly less."""


def _tune_malloc() -> None:
    """Apply :data:`MALLOC_TUNING` (before any thread starts: the arena limit needs it); a C
    library without ``mallopt`` (musl) keeps its own allocator's behaviour."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return
    for option, value in MALLOC_TUNING:
        mallopt(option, value)


def main(argv: list[str] | None = None) -> int:
    _tune_malloc()
    if "--gvisor" in (sys.argv[1:] if argv is None else argv):
        # before the spawner's fork and its thread: the filter must cover every thread
        from sandbox import gvisor

        gvisor.prepare()
    spawner = Spawner()
    try:
        args = _parser().parse_args(argv)
        user = _tool_user(args.uid, args.gid, args.home, args.tool_env)
        _open_scratch_tmp(args.scratch_tmp)
    except BaseException:
        spawner.close()
        raise
    import logging

    _defer(DEFERRED_MODULES)
    from sandbox.server import AgentConfig, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = AgentConfig(
        socket=args.socket, workspace=args.workspace, roots=args.root or [args.workspace, "/tmp"],
        user=user, max_concurrent=args.max_concurrent, spawner=spawner,
    )
    try:
        return serve(config)
    finally:
        spawner.close()


if __name__ == "__main__":
    sys.exit(main())
