"""The OCI runtime a policy requires (``[runtime]``) and the ``--runtime`` flag.

A create asking for a weaker runtime than required is refused with the setting's name,
never moved to the stronger runtime; runsc runs every network mode.
"""

from __future__ import annotations

import argparse

import pytest

from harness.cli.options import UsageParser, sandbox_options, spec_from_args
from harness.core.errors import UsageError
from harness.core.policy import Policy, PolicyError, parse_policy

REQUIRED = """
[runtime]
require = "runsc"
[sandbox]
runtime = "runsc"
"""


def test_runtime_table_parses() -> None:
    policy = parse_policy(REQUIRED + '[runtime.tools]\nshell = "runsc"\n')
    assert policy.runtime.require == "runsc"
    assert policy.runtime.tools == {"shell": "runsc"}
    assert policy.sandbox_spec().runtime == "runsc"
    assert policy.required_runtime() == ("runsc", "runtime.require")


def test_no_runtime_table_requires_nothing() -> None:
    policy = parse_policy("")
    assert policy.required_runtime() == ("runc", None)
    assert policy.sandbox_spec().runtime == "runc"


def test_unknown_runtime_or_key_is_refused_naming_it() -> None:
    with pytest.raises(PolicyError, match=r"runtime\.require"):
        parse_policy('[runtime]\nrequire = "kata"\n')
    with pytest.raises(PolicyError, match=r"runtime\.strict"):
        parse_policy('[runtime]\nstrict = true\n')
    with pytest.raises(PolicyError, match="not a tool name"):
        parse_policy('[runtime.tools]\n"bad name" = "runsc"\n')


def test_policy_whose_sandbox_runtime_is_weaker_than_required_is_refused_at_load() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy('[runtime]\nrequire = "runsc"\n[sandbox]\nruntime = "runc"\n')
    message = caught.value.message
    assert "sandbox.runtime 'runc' is weaker than 'runsc'" in message
    assert "runtime.require" in message


def test_leaving_sandbox_runtime_out_is_not_silently_upgraded() -> None:
    # The default runtime is runc; a requirement refuses it rather than picking runsc.
    with pytest.raises(PolicyError, match=r"runtime\.require"):
        parse_policy('[runtime]\nrequire = "runsc"\n')


def test_tool_requirement_applies_only_where_the_tool_is_exposed() -> None:
    tool_rule = '[runtime.tools]\nshell = "runsc"\n'
    with pytest.raises(PolicyError, match=r"runtime\.tools\.shell"):
        parse_policy(tool_rule)  # allowed_tools absent: every tool, shell included, is exposed
    with pytest.raises(PolicyError, match=r"runtime\.tools\.shell"):
        parse_policy('allowed_tools = ["shell", "read_file"]\n' + tool_rule)
    policy = parse_policy('allowed_tools = ["read_file"]\n' + tool_rule)
    assert policy.sandbox_spec().runtime == "runc"
    assert policy.required_runtime() == ("runc", None)


def test_a_tightened_copy_that_exposes_the_tool_is_refused() -> None:
    # A door that narrows or widens allowed_tools builds the spec from its copy of the policy.
    policy = parse_policy('allowed_tools = ["read_file"]\n[runtime.tools]\nshell = "runsc"\n')
    widened = policy.model_copy(update={"allowed_tools": ("read_file", "shell")})
    with pytest.raises(PolicyError, match=r"runtime\.tools\.shell"):
        widened.sandbox_spec()


def test_runsc_with_a_network_is_a_policy() -> None:
    spec = parse_policy('[sandbox]\nruntime = "runsc"\nnetwork = "allowlist"\nallow_hosts = ["pypi.org"]\n'
                        ).sandbox_spec()
    assert (spec.runtime, spec.network) == ("runsc", "allowlist")


def _args(*argv: str) -> argparse.Namespace:
    parser = UsageParser(prog="callbox call")
    sandbox_options(parser, defaults=False)
    return parser.parse_args(list(argv))


def test_runtime_flag_sets_the_runtime() -> None:
    assert spec_from_args(_args("--runtime", "runsc"), Policy().sandbox_spec()).runtime == "runsc"
    assert spec_from_args(_args(), Policy().sandbox_spec()).runtime == "runc"
    parser = UsageParser(prog="callbox exec")
    sandbox_options(parser)
    assert parser.parse_args([]).runtime == "runc"
    with pytest.raises(UsageError, match="invalid choice"):
        parser.parse_args(["--runtime", "kata"])


def test_runtime_flag_weaker_than_the_policy_is_refused_not_upgraded() -> None:
    policy = parse_policy(REQUIRED)
    with pytest.raises(UsageError, match=r"--runtime runc is weaker than the policy's sandbox.runtime = \"runsc\""):
        spec_from_args(_args("--runtime", "runc"), policy.sandbox_spec())
    assert spec_from_args(_args(), policy.sandbox_spec()).runtime == "runsc"


def test_runtime_flag_checked_against_the_policy_names_the_requirement() -> None:
    policy = parse_policy('allowed_tools = ["read_file"]\n[runtime.tools]\nread_file = "runsc"\n'
                          '[sandbox]\nruntime = "runsc"\n')
    with pytest.raises(PolicyError, match=r"--runtime 'runc' is weaker than 'runsc', which runtime\.tools\.read_file"):
        spec_from_args(_args("--runtime", "runc"), None, policy=policy)


def test_runtime_flag_runsc_with_network_is_taken() -> None:
    # Whether the engine's runsc has a network stack is the engine's check (test_runsc_network).
    spec = spec_from_args(_args("--runtime", "runsc", "--network", "open"))
    assert (spec.runtime, spec.network) == ("runsc", "open")
