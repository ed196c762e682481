"""The container of a sandbox: its hardened settings, mounts, scratch places and the agent's command line.

``run_container`` creates the sandbox's network (if any), then creates and starts the
container through docker-py's low-level API, in one create and one start call.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from harness.core.errors import ImageNotFound, SandboxStartError, short_reason
from harness.engine.docker import labels
from harness.engine.docker.agent_launch import agent_launch
from harness.engine.docker.client import remove_container, seccomp_profile
from harness.engine.docker.networks import Attachment, SandboxNetworks, engine_is_local
from harness.engine.docker.runsc_dns import TARGET as RESOLV_CONF
from harness.engine.docker.runsc_dns import write_resolv_conf
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME
from harness.engine.spec import AGENT_DIR, TMP, SandboxSpec

AGENT_SOCKET = f"{AGENT_DIR}/{AGENT_SOCKET_NAME}"
# The agent's RPC threads (a core of 8 kept, up to 72 started on demand: 32 commands + 40
# for the long-lived streams of attached jobs, terminals, tunnels and watches), gRPC's own
# threads and a thread per terminal or tunnel count against the pids limit, so the engine
# adds this reserve on top of the spec's limit, which is what tool processes get.
AGENT_MAX_CONCURRENT = 32
AGENT_PIDS_RESERVE = 128


def run_container(
    client: docker.DockerClient,
    networks: SandboxNetworks,
    owner_label: str,
    spec: SandboxSpec,
    sandbox_id: str,
    socket_dir: Path,
    uid: int,
    gid: int,
    now: float,
    extra_labels: dict[str, str],
    *,
    before_start: Callable[[str], None] | None = None,
) -> tuple[Attachment, str]:
    """Create the sandbox's network (if any), then create and start the container
    through the low-level API (no extra inspect calls); ``before_start`` gets the new
    container's id before it starts (a restore from a memory image asks for it there)."""
    label_values = {
        labels.MANAGED: "1",
        labels.SANDBOX_ID: sandbox_id,
        labels.OWNER: owner_label,
        labels.CREATED: f"{now:.3f}",
        labels.EXPIRES: f"{now + spec.ttl_seconds:.0f}",
        labels.SOCKET_DIR: str(socket_dir),
        **extra_labels,
    }
    hardening: dict[str, Any] = {
        "init": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true", f"seccomp={seccomp_profile()}"],
        "ipc_mode": "private",
        "privileged": False,
        "auto_remove": False,
    }
    attachment = networks.attach(
        sandbox_id,
        spec,
        label_values,
        {
            **hardening,
            "ulimits": [Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)],
        },
    )
    # File operations reach the scratch places that have a tmpfs and every mount (a mount
    # above a scratch place, like /home, holds whatever the host has there, maybe nothing).
    roots = sorted({spec.workdir, *spec.scratch_tmpfs(), *(m.target for m in spec.mounts)})
    command = [
        "--socket",
        AGENT_SOCKET,
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--workspace",
        spec.workdir,
        "--max-concurrent",
        str(AGENT_MAX_CONCURRENT),
    ]
    for root in roots:
        command += ["--root", root]
    if TMP in spec.scratch_tmpfs():
        command += ["--scratch-tmp", TMP]
    if spec.runtime == "runsc":
        # the agent checks gVisor applied the seccomp profile and makes clone3 answer ENOSYS
        command.append("--gvisor")
    launch = agent_launch(client, spec.image)
    command += launch.args
    mounts = [DockerMount(AGENT_DIR, str(socket_dir), type="bind", propagation="rprivate"), *launch.mounts,
              *attachment.mounts]
    mounts += [
        DockerMount(m.target, str(m.source), type="bind", read_only=m.read_only, propagation="rprivate")
        for m in spec.mounts
    ]
    if spec.runtime == "runsc" and spec.network == "open":
        # gVisor's network stack cannot reach Docker's embedded DNS server (runsc_dns)
        resolv = write_resolv_conf(socket_dir, engine_is_local=engine_is_local(client))
        mounts.append(DockerMount(RESOLV_CONF, str(resolv), type="bind", read_only=True, propagation="rprivate"))
    # A scratch place a mount covers gets no tmpfs (it would hide the mount or sit under
    # it); mounts below a scratch place land on top of its tmpfs, as Docker mounts the
    # shallower path first.
    tmpfs = {place: spec.tmpfs_options(place, uid, gid) for place in spec.scratch_tmpfs()}
    api = client.api
    try:
        host_config = api.create_host_config(
            **hardening,
            cap_add=["SETUID", "SETGID", "KILL"],
            read_only=True,
            runtime=None if spec.runtime == "runc" else spec.runtime,
            tmpfs=tmpfs,
            mounts=mounts,
            network_mode=attachment.network_mode,
            pids_limit=spec.pids + AGENT_PIDS_RESERVE,
            mem_limit=spec.memory,
            memswap_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1e9),
            ulimits=[
                Ulimit(name="nofile", soft=spec.nofile, hard=spec.nofile),
                Ulimit(name="core", soft=0, hard=0),
                Ulimit(name="fsize", soft=spec.fsize, hard=spec.fsize),
            ],
            # Tool processes raise their own OOM score to the maximum before they exec
            # (sandbox/spawner.py), so the agent is never the OOM killer's first choice.
            # (Lowering the agent's score instead needs CAP_SYS_RESOURCE in the daemon,
            # which not every host grants.)
            shm_size=spec.shm_size,
        )
        created = api.create_container(
            spec.image,
            command=command,
            entrypoint=launch.entrypoint,
            name=f"callbox-{sandbox_id}",
            hostname="sandbox",
            user="0:0",
            environment=_agent_environment(spec),
            labels=label_values,
            host_config=host_config,
        )
        if before_start is not None:
            before_start(str(created["Id"]))
        api.start(created["Id"])
    except docker.errors.ImageNotFound:
        raise ImageNotFound.named(spec.image) from None
    except docker.errors.DockerException as exc:
        remove_container(client, f"callbox-{sandbox_id}")
        raise SandboxStartError(f"the Docker engine could not start the sandbox: {short_reason(exc)}") from None
    return attachment, str(created["Id"])


def _agent_environment(spec: SandboxSpec) -> dict[str, str]:
    """The agent's own environment (tool processes get theirs from the agent, never this).
    The agent keeps runtime files in a directory it and the tool user can both write; a
    mount replacing /tmp may be writable by the tool user only (the agent has no
    CAP_DAC_OVERRIDE), so then it uses /dev/shm (a mode 1777 tmpfs) instead."""
    return {} if TMP in spec.scratch_tmpfs() else {"TMPDIR": "/dev/shm"}
