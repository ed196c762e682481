"""The policy's ``[sandbox]`` settings are the SandboxSpec's fields, and build the spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.core.policy import MountSetting, Policy, PolicyError, SandboxSettings
from harness.engine.spec import Mount, SandboxSpec


def test_the_settings_are_the_specs_fields_with_its_defaults() -> None:
    # what a client's request beyond the policy gets, how a refused command is answered, whether
    # it may ask for root: no sandbox's settings
    policy_only = ["on_internet_request", "on_denied_command", "public_ports", "root_commands"]
    # secrets: the policy's [[secret]] tables, not a [sandbox] key
    spec_fields = [name for name in SandboxSpec.model_fields if name != "secrets"]
    assert list(SandboxSettings.model_fields) == spec_fields + policy_only
    settings, spec = SandboxSettings(), SandboxSpec()
    for name in spec_fields:
        if name != "mounts":
            assert getattr(settings, name) == getattr(spec, name), name
    assert SandboxSettings.model_fields["mounts"].annotation == tuple[MountSetting, ...]


def test_a_mount_setting_is_a_mount_spelt_with_mode() -> None:
    names = [("read_only" if n == "mode" else n) for n in MountSetting.model_fields]
    assert names == list(Mount.model_fields)
    rw = MountSetting(source=Path("/srv"), target="/data", mode="rw", uid=1001, gid=1002)
    assert rw.mount() == Mount(source=Path("/srv"), target="/data", read_only=False, uid=1001, gid=1002)
    assert MountSetting(source=Path("/srv"), target="/data").mount().read_only is True


def test_the_spec_is_built_from_every_setting() -> None:
    settings = SandboxSettings(memory="256m", cpus=0.5, pids=64, env={"A": "1"}, workdir="/srv/../work",
                               tmp_size="16m", noexec=True, nofile=128, fsize="2m", ttl_seconds=60,
                               mounts=(MountSetting(source=Path("/srv"), target="/data"),))
    spec = Policy(sandbox=settings).sandbox_spec()
    for name in SandboxSpec.model_fields:
        if name not in ("mounts", "secrets"):
            assert getattr(spec, name) == getattr(settings, name), name
    assert spec.mounts == (Mount(source=Path("/srv"), target="/data"),)
    assert spec.env is not settings.env


def test_bounds_are_the_specs_and_are_checked_when_it_is_built() -> None:
    loose = SandboxSettings(pids=2)  # the settings take it as written
    with pytest.raises(PolicyError,
                       match=r"^key 'sandbox\.pids': 2 is below the minimum of 8 \(allowed: 8 to 65536\)$"):
        Policy(sandbox=loose).sandbox_spec()
    with pytest.raises(ValidationError):
        SandboxSpec(pids=2)


def test_a_mount_problem_names_its_entry() -> None:
    bad = SandboxSettings(mounts=(MountSetting(source=Path("/srv"), target="/data"),
                                  MountSetting(source=Path("/srv"), target="relative")))
    with pytest.raises(PolicyError, match=r"^key 'sandbox\.mounts\[1\]\.target': mount target 'relative' must be"):
        Policy(sandbox=bad).sandbox_spec()


def test_the_settings_refuse_unknown_keys_and_bad_types() -> None:
    with pytest.raises(ValidationError):
        SandboxSettings.model_validate({"memroy": "1g"})
    with pytest.raises(ValidationError):
        SandboxSettings.model_validate({"cpus": "two"})
    assert SandboxSettings.model_validate({"memory": "1g"}).memory == 1 << 30
