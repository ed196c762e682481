"""The container's memory cgroup counters, read to tell an OOM kill from any other SIGKILL.

cgroup v1 exposes ``oom_kill N`` in ``memory.oom_control``; cgroup v2 in
``memory.events``. Docker mounts the container's own cgroup at /sys/fs/cgroup.
"""

from __future__ import annotations

_CANDIDATES = (
    "/sys/fs/cgroup/memory/memory.oom_control",  # v1
    "/sys/fs/cgroup/memory.events",  # v2
)


def oom_kill_count(candidates: tuple[str, ...] = _CANDIDATES) -> int | None:
    """Return the cgroup's OOM-kill counter, or None when no counter is readable."""
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
