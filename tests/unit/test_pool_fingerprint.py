"""The warm pool's fingerprint: which spec fields a claim must match, and which it need not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.core.policy import Policy
from harness.core.sandbox_settings import PoolSettings
from harness.engine.docker.pool import NOT_PART_OF_FINGERPRINT, fingerprint
from harness.engine.spec import Mount, SandboxSpec

BASE = SandboxSpec()

CHANGES: dict[str, Any] = {
    "image": "other:latest",
    "runtime": "runsc",
    "memory": 256 << 20,
    "cpus": 0.5,
    "pids": 64,
    "workdir": "/srv",
    "tmp_size": 16 << 20,
    "workspace_size": 32 << 20,
    "home_size": 8 << 20,
    "scratch_dirs": ("/logs",),
    "noexec": True,
    "nofile": 256,
    "fsize": 2 << 20,
    "ask_timeout": 30.0,
}


@pytest.mark.parametrize(("field", "value"), sorted(CHANGES.items()))
def test_a_container_setting_changes_the_fingerprint(field: str, value: Any) -> None:
    assert fingerprint(BASE.model_copy(update={field: value})) != fingerprint(BASE)


def test_network_and_allow_list_change_the_fingerprint() -> None:
    allowlist = SandboxSpec(network="allowlist", allow_hosts=("example.com",))
    assert fingerprint(allowlist) != fingerprint(BASE)
    assert fingerprint(allowlist) != fingerprint(SandboxSpec(network="allowlist", allow_hosts=("example.org",)))


def test_secrets_change_the_fingerprint() -> None:
    from harness.engine.secrets import SecretSpec

    allowlist = SandboxSpec(network="allowlist", allow_hosts=("example.com",))
    secret = SecretSpec(name="T", env="T", hosts=("example.com",), header="Authorization: Bearer {value}")
    assert fingerprint(allowlist.model_copy(update={"secrets": (secret,)})) != fingerprint(allowlist)


def test_mounts_change_the_fingerprint(tmp_path: Path) -> None:
    ro = BASE.model_copy(update={"mounts": (Mount(source=tmp_path, target="/data"),)})
    rw = BASE.model_copy(update={"mounts": (Mount(source=tmp_path, target="/data", read_only=False),)})
    elsewhere = BASE.model_copy(update={"mounts": (Mount(source=tmp_path, target="/other"),)})
    assert len({fingerprint(BASE), fingerprint(ro), fingerprint(rw), fingerprint(elsewhere)}) == 4


def test_env_ttl_and_mount_roots_do_not_count() -> None:
    changed = BASE.model_copy(update={"env": {"A": "1"}, "ttl_seconds": 60, "allowed_mount_roots": (Path("/srv"),)})
    assert fingerprint(changed) == fingerprint(BASE)


def test_every_spec_field_is_either_in_the_fingerprint_or_named_as_left_out() -> None:
    counted = set(CHANGES) | {"network", "allow_hosts", "egress_allow", "egress_deny", "mounts", "secrets"}
    assert counted | NOT_PART_OF_FINGERPRINT == set(SandboxSpec.model_fields)
    assert not counted & NOT_PART_OF_FINGERPRINT


def test_the_fingerprint_is_stable() -> None:
    assert fingerprint(SandboxSpec()) == fingerprint(SandboxSpec())


def test_the_pool_is_off_by_default() -> None:
    assert Policy().pool.size == 0
    assert PoolSettings().ceiling == 0


def test_pool_settings_are_checked() -> None:
    assert PoolSettings(size=2, max=5).ceiling == 5
    assert PoolSettings(size=3).ceiling == 3
    with pytest.raises(ValueError, match=r"at least pool\.size"):
        PoolSettings(size=4, max=2)
    with pytest.raises(ValueError):
        PoolSettings(size=-1)
    with pytest.raises(ValueError):
        Policy.model_validate({"pool": {"sizes": 1}})
