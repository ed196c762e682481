"""Where the Ray test cluster lives on this machine: its names, addresses and directories.

Everything carries ``cbray`` (bridge cbray0, namespaces cbray-w1/cbray-w2, /run/cbray,
/var/lib/cbray, /tmp/cbray, cgroups cbray-wN) and the address range 10.250.0.0/24 is its own,
so nothing of it can be mistaken for the main dockerd's or another test's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUN_DIR = Path("/run/cbray")
STATE_DIR = Path("/var/lib/cbray")
TEMP_DIR = Path("/tmp/cbray")
"""Ray's temp dirs (short: a unix socket path has at most 107 bytes) and the dockerds' logs."""
OUR_ROOTS = (RUN_DIR, STATE_DIR, TEMP_DIR)
BRIDGE = "cbray0"
NETWORK = "10.250.0.0/24"
HEAD_IP = "10.250.0.1"
GCS_PORT = 6379
HEAD_TEMP_DIR = TEMP_DIR / "head"
MARKER = "CBRAY_NODE"
"""The environment variable naming the node of every process the cluster starts."""
TOKEN_FILE = RUN_DIR / "auth_token"
PID_RECORD = RUN_DIR / "pids"
OWNER_FILE = RUN_DIR / "owner"
FORWARD_RULE = ("FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT")
"""Packets bridged between the workers pass iptables' FORWARD chain (br_netfilter), whose
policy Docker sets to DROP; this accepts cbray0-to-cbray0 traffic and nothing else."""


@dataclass(frozen=True)
class Worker:
    """A worker node: its namespace, address, dockerd and directories."""

    name: str
    ip: str

    @property
    def netns(self) -> str:
        return f"cbray-{self.name}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def veth(self) -> str:
        """The host end of its veth pair (the other end is eth0 in the namespace)."""
        return f"cbray-{self.name}"

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / self.name

    @property
    def docker_socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def dockerd_pidfile(self) -> Path:
        return self.run_dir / "dockerd.pid"

    @property
    def dockerd_log(self) -> Path:
        return TEMP_DIR / f"dockerd-{self.name}.log"

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def data_root(self) -> Path:
        return STATE_DIR / self.name / "docker"

    @property
    def state_dir(self) -> Path:
        return STATE_DIR / self.name / "state"

    @property
    def sandbox_run_root(self) -> Path:
        return self.run_dir / "sandboxes"

    @property
    def temp_dir(self) -> Path:
        return TEMP_DIR / self.name

    @property
    def cgroup_parent(self) -> str:
        return f"cbray-{self.name}"

    def node_env(self) -> dict[str, str]:
        """The node settings its Ray workers inherit from ``ray start``."""
        return {"CALLBOX_NODE_NAME": self.name, "DOCKER_HOST": self.docker_host,
                "CALLBOX_RUN_ROOT": str(self.sandbox_run_root), "CALLBOX_STATE_DIR": str(self.state_dir)}


WORKERS = (Worker("w1", "10.250.0.2"), Worker("w2", "10.250.0.3"))
