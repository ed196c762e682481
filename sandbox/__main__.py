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
    parser.add_argument("--max-concurrent", type=int, default=32, help="concurrent commands at most")
    return parser


def _tool_user(uid: int | None, gid: int | None) -> ToolUser:
    import pwd

    from sandbox.launch import ToolUser

    if uid is None:
        entry = pwd.getpwnam("sandbox")
        return ToolUser(entry.pw_uid, gid if gid is not None else entry.pw_gid, entry.pw_dir, entry.pw_name)
    if uid == 0:
        raise SystemExit("callbox-agent: tool processes never run as uid 0")
    try:
        entry = pwd.getpwuid(uid)
        home, name = entry.pw_dir, entry.pw_name
        default_gid = entry.pw_gid
    except KeyError:
        home, name, default_gid = "/home/sandbox", "sandbox", uid
    return ToolUser(uid, gid if gid is not None else default_gid, home, name)


def main(argv: list[str] | None = None) -> int:
    spawner = Spawner()
    try:
        args = _parser().parse_args(argv)
        user = _tool_user(args.uid, args.gid)
    except BaseException:
        spawner.close()
        raise
    import logging

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
