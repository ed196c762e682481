"""Policies with ``[[tool]]`` tables, read from TOML text as ``callbox`` reads a policy file,
for the declared tools' unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.policy import Policy, PolicyError, parse_policy
from harness.engine.spec import HostLimits
from harness.tools import registry_for

HOST = HostLimits(cpus=None, memory=None)
"""A host that sets no CPU or memory ceiling, so a policy's own limits are what is read."""


def load(text: str, base_dir: Path | None = None) -> Policy:
    return parse_policy(text, source="test.toml", base_dir=base_dir, host=HOST)


def problem(text: str, base_dir: Path | None = None) -> str:
    """The message of the policy error ``text`` is refused with (exit status 2), whether it is
    found when the policy is read or when its tools are registered."""
    with pytest.raises(PolicyError) as info:
        registry_for(load(text, base_dir))
    assert info.value.exit_code == 2
    return info.value.message
