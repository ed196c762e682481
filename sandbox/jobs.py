"""Background jobs: detached processes with a replayable output ring buffer (sandbox.v1.Jobs)."""

from __future__ import annotations

from sandbox.launch import Launcher, ToolUser
from sandbox.v1 import jobs_pb2_grpc


class JobManager:
    """Starts and tracks the sandbox's background jobs."""

    def __init__(self, user: ToolUser | None, workspace: str, launcher: Launcher | None = None) -> None:
        self.user = user
        self.workspace = workspace
        self.launcher = launcher

    def stop(self, why: str) -> None:
        """The agent is stopping: kill every job's whole tree."""


class JobsService(jobs_pb2_grpc.JobsServicer):
    """sandbox.v1.Jobs over a JobManager."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager
