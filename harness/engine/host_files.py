"""Host files as a mount sees them: who may write one, who owns it, how to fix it."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

__all__ = ["can_write", "describe_owner", "mount_fixes"]


def _name(lookup: str, number: int) -> str:
    try:
        return pwd.getpwuid(number).pw_name if lookup == "user" else grp.getgrgid(number).gr_name
    except KeyError:
        return str(number)


def can_write(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether uid/gid (no supplementary groups, as tool processes run) may write this
    file, or create files in this directory, by its mode bits."""
    need = 0o3 if stat.S_ISDIR(st.st_mode) else 0o2
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid == gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & need == need


def describe_owner(st: os.stat_result) -> str:
    """Who owns a host file and its mode, as a mount's error names them."""
    return (f"owner {_name('user', st.st_uid)} (uid {st.st_uid}), group {_name('group', st.st_gid)} "
            f"(gid {st.st_gid}), mode {stat.S_IMODE(st.st_mode):04o}")


def mount_fixes(source: Path, uid: int, gid: int) -> str:
    """The ways to make ``source`` a rw mount the tool user can write."""
    return (f"chown it to a non-root user (`chown -R {uid}:{gid} {source}`), make it writable for uid {uid}, "
            "pick the tool uid/gid that can write it (--mount HOST:CONTAINER:rw,uid=N,gid=N, or uid and gid "
            "on its [[sandbox.mounts]] entry), or mount it :ro")
