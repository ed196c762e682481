"""Which Ray driver (job) created each sandbox of a node, and which of those drivers are gone.

On one machine a sandbox's container carries its creating process in a label, and gc removes
the sandbox once that process is gone (unless it is named or kept). On a Ray node the creating
process is a driver elsewhere on the cluster, so the node's host writes down, per sandbox, the
Ray job id of the driver that asked for it (one small file per sandbox in the node's state
directory, so a restarted host still knows). The cluster's job table says when a job ended:
its driver exited, was killed, or lost its node. Then its sandboxes are orphans, removed at
the host's next gc unless they are named or kept (a server that keeps its sandboxes across
its own restart marks them kept when it creates them).

What cannot be judged is left alone: a sandbox with no driver on record (the warm pool's, an
earlier version's), and every sandbox while the job table cannot be read.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

log = logging.getLogger("callbox.ray.host")

_JOB_ID = re.compile(r"[0-9a-f]{2,64}")
_SANDBOX_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class DriverLedger:
    """Sandbox id -> the Ray job id of the driver that created it, one file each under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, mode=0o700, exist_ok=True)

    def record(self, sandbox_id: str, job_id: str | None) -> None:
        if job_id is None or not _JOB_ID.fullmatch(job_id) or not _SANDBOX_ID.fullmatch(sandbox_id):
            return
        temporary = self.directory / f".{sandbox_id}.tmp"
        temporary.write_text(job_id)
        temporary.replace(self.directory / sandbox_id)

    def forget(self, sandbox_id: str) -> None:
        if _SANDBOX_ID.fullmatch(sandbox_id):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / sandbox_id).unlink()

    def entries(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for entry in self.directory.iterdir():
            if entry.name.startswith("."):
                continue
            with contextlib.suppress(OSError):
                found[entry.name] = entry.read_text().strip()
        return found


def ended_jobs() -> set[str] | None:
    """The ids (hex) of the cluster's jobs that have ended; None when the job table cannot be read."""
    try:
        from ray._private import state

        return {str(job["JobID"]) for job in state.jobs() if job.get("IsDead")}  # type: ignore[no-untyped-call]
    except Exception as exc:  # an API of Ray's that moved, or the control store away: judge nothing
        log.warning("cannot read the cluster's job table (orphaned sandboxes wait for their expiry): %s", exc)
        return None


def current_job() -> str | None:
    """This process's Ray job id (hex), when it is a driver connected to a cluster."""
    try:
        import ray

        job: str = ray.get_runtime_context().get_job_id()
        return job
    except Exception:
        return None
