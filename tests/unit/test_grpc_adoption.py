"""What a restarted gRPC server decides without a container: which server instance still
serves a run, and the overrides a run recorded (without environment values) read back."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

from harness.doors.grpc import adoption
from harness.doors.grpc.overrides import MountRequest, SandboxOverrides
from harness.engine.docker.labels import Owner


def test_a_server_of_this_process_is_alive_until_retired() -> None:
    label = adoption.new_instance()
    other = adoption.new_instance()
    assert label != other and label.startswith(Owner.current().label() + "/")
    assert adoption.instance_alive(label) and adoption.instance_alive(other)
    adoption.retire_instance(label)
    assert not adoption.instance_alive(label)
    assert adoption.instance_alive(other)  # a second server of the same process keeps its runs
    adoption.retire_instance(other)


def test_a_server_of_a_dead_process_is_gone_and_one_elsewhere_counts_as_alive() -> None:
    child = subprocess.run([sys.executable, "-c", "from harness.doors.grpc import adoption; "
                            "print(adoption.new_instance())"], capture_output=True, text=True, check=True)
    dead = child.stdout.strip()
    assert dead.count("/") == 3
    assert not adoption.instance_alive(dead)
    elsewhere = f"{socket.gethostname()}-not-this-host/1/1.00/abcd1234"
    assert adoption.instance_alive(elsewhere)  # cannot be told from here: left alone
    assert not adoption.instance_alive("garbage")


def test_recorded_overrides_come_back_with_env_values_from_the_sandbox_spec() -> None:
    overrides = SandboxOverrides(memory_bytes=256 << 20, cpus=0.5, network="none",
                                 mounts=(MountRequest("/srv/data", "/data", True),),
                                 env={"TOKEN": "s3cret", "MODE": "ci"}, ttl_seconds=120, allowed_tools=("shell",))
    recorded = dataclasses.asdict(overrides)
    keys = sorted(recorded.pop("env"))
    stored = {**recorded, adoption.ENV_KEYS: keys}
    assert "s3cret" not in repr(stored)  # the audit store never holds the values
    spec_env = {"TOKEN": "s3cret", "MODE": "ci", "HOME": "/workspace", "HTTP_PROXY": "http://proxy:3128"}
    assert adoption._overrides(stored, spec_env) == overrides


def test_an_override_variable_missing_from_the_spec_is_left_out() -> None:
    stored = {**dataclasses.asdict(SandboxOverrides()), adoption.ENV_KEYS: ["GONE"]}
    stored.pop("env")
    assert adoption._overrides(stored, {}) == SandboxOverrides()
