"""Policy: loading and refusing TOML, rule evaluation, path globs, budgets, loosening."""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
from pydantic import BaseModel

from harness.core.acceptance import AcceptanceCheck, AcceptancePolicy
from harness.core.calls import Action, Decision
from harness.core.change_recorder import CheckpointSettings
from harness.core.errors import CallboxError
from harness.core.policy import (
    Budgets,
    Policy,
    PolicyError,
    Rule,
    SandboxSettings,
    glob_to_regex,
    load_policy,
    parse_policy,
)
from harness.core.redaction import RedactionSettings
from harness.core.sandbox_settings import PoolSettings
from harness.engine.placement import Placement
from harness.engine.spec import HostLimits, Mount, SandboxSpec


@dataclass(frozen=True)
class Tool:
    name: str
    command_field: str | None = None
    path_fields: tuple[str, ...] = ()


SHELL = Tool("shell", command_field="command", path_fields=("workdir",))
READ = Tool("read_file", path_fields=("path",))
COPY = Tool("copy", path_fields=("source", "dest"))
MULTI = Tool("multi", path_fields=("paths",))
OTHER = Tool("other")


BIG_HOST = HostLimits(cpus=64, memory=64 << 30)


def policy(text: str) -> Policy:
    return parse_policy(text, source="policy file test.toml")


def error(text: str, host: HostLimits | None = None) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="policy file test.toml", host=host)
    return info.value.message


def writable_dir(path: Path) -> Path:
    """A directory the tool user can write (as root: owned by uid 1000, as tool processes are then)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, 1000, 1000)
    return path


def _docs_suffix() -> str:
    where = resources.files("harness") / "data/default-policy.toml"
    return f" (every key is documented in the default policy, {where})"


# ---- the default policy -------------------------------------------------------------------


def test_default_policy_loads_and_equals_the_model_defaults() -> None:
    loaded = load_policy(None)
    assert loaded.model_dump() == Policy().model_dump()
    assert loaded.sandbox_spec() == SandboxSpec()
    assert loaded.loosened() == []


def test_default_policy_allows_every_tool() -> None:
    loaded = load_policy(None)
    for tool in (SHELL, READ, OTHER):
        assert loaded.decide(tool, {"command": "rm -rf /", "path": "/etc/shadow"}).action is Action.ALLOW


def test_default_policy_documents_every_key() -> None:
    text = (resources.files("harness") / "data/default-policy.toml").read_text()
    models: list[type[BaseModel]] = [Policy, SandboxSettings, Budgets, Rule, RedactionSettings, PoolSettings,
                                     Placement, CheckpointSettings, AcceptancePolicy, AcceptanceCheck]
    for model in models:
        for key in model.model_fields:
            if key in ("sandbox", "budgets", "tools", "mounts", "env", "rules", "redaction", "pool", "placement",
                       "checkpoints", "acceptance", "check"):
                continue  # tables, documented by their [header]
            assert re.search(rf"^#? ?{key} = ", text, re.MULTILINE), f"{model.__name__}.{key} is not documented"
    for header in ("[sandbox]", "[sandbox.env]", "[[sandbox.mounts]]", "[sandbox.placement]", "[budgets]",
                   "[redaction]", "[tools.shell]", "[checkpoints]",
                   "[[tools.shell.rules]]", "[pool]", "[acceptance]", "[[acceptance.check]]"):
        assert header in text


def test_default_policy_values_equal_the_model_defaults_key_by_key() -> None:
    raw = tomllib.loads((resources.files("harness") / "data/default-policy.toml").read_text())
    defaults = Policy()
    assert raw["default_decision"] == defaults.default_decision
    for key, value in raw["budgets"].items():
        assert getattr(defaults.budgets, key) == value, key
    parsed = SandboxSettings.model_validate(raw["sandbox"])
    for key in raw["sandbox"]:
        assert getattr(parsed, key) == getattr(defaults.sandbox, key), key


# ---- loading errors ----------------------------------------------------------------------


def test_toml_syntax_error_names_line_and_column() -> None:
    message = error('[sandbox]\nmemory = "1g"\ncpus = = 2\n')
    assert message == (
        "policy file test.toml is not valid TOML: Invalid value (at line 3, column 8); fix the syntax there"
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "nope.toml")
    assert info.value.message == (
        f"policy file {tmp_path / 'nope.toml'} does not exist; pass an existing TOML file to --policy, "
        "or leave --policy out to use the default policy"
    )
    assert info.value.exit_code == 2
    assert isinstance(info.value, CallboxError)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    assert info.value.message == f"policy file {tmp_path} is a directory; pass the policy's TOML file"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'default_decision = "\xff"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.message == f"policy file {path} is not UTF-8 text (bad byte at offset 20); save it as UTF-8"


def test_load_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[budgets]\nmax_tool_calls = 0\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.message == (
        f"policy file {path}: key 'budgets.max_tool_calls': 0 is below the minimum of 1" + _docs_suffix()
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('sandboxx = 1', "unexpected key 'sandboxx' (allowed: sandbox, allowed_tools, default_decision, tools, "
                         "budgets, redaction, tool, secret, actions, pool, runtime, checkpoints, memory, engine, ray, "
                         "acceptance)"),
        ('[sandbox]\nmemroy = "1g"', "unexpected key 'sandbox.memroy' (allowed: image, runtime, memory, cpus, "
                                     "pids, network, allow_hosts, ask_timeout, egress_allow, egress_deny, mounts, "
                                     "allowed_mount_roots, workdir, env, tmp_size, workspace_size, home_size, "
                                     "scratch_dirs, noexec, nofile, fsize, ttl_seconds, paused_ttl_seconds, placement, "
                                     "on_internet_request, on_denied_command, public_ports, root_commands)"),
        ('[[sandbox.mounts]]\nsource = "/srv"\ntarget = "/data"\nreadonly = true',
         "unexpected key 'sandbox.mounts[0].readonly' (allowed: source, target, mode, uid, gid)"),
        ('[tools.shell]\nallow = true', "unexpected key 'tools.shell.allow' (allowed: decision, rules)"),
        ('[[tools.my-tool.rules]]\naction = "deny"\npath = "x"\nwhy = "no"',
         "unexpected key 'tools.my-tool.rules[0].why' (allowed: action, command, path, reason)"),
        ('[budgets]\nmax_calls = 3', "unexpected key 'budgets.max_calls' (allowed: max_tool_calls, "
                                     "max_wall_time_s, call_timeout_ceiling_s, default_call_timeout_s, "
                                     "max_output_bytes, max_image_bytes, max_image_pixels, "
                                     "max_images_per_result)"),
    ],
)
def test_unknown_keys_are_refused(text: str, problem: str) -> None:
    assert error(text) == f"policy file test.toml: {problem}" + _docs_suffix()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[sandbox]\nmemory = "lots"',
         "key 'sandbox.memory': 'lots' is not a size; use a number with an optional unit k, m or g (e.g. 512m)"),
        ('[sandbox]\nmemory = "1m"', "key 'sandbox.memory': 1m is below the minimum of 32m"),
        ('[sandbox]\npids = 0', "key 'sandbox.pids': 0 is below the minimum of 8 (allowed: 8 to 65536)"),
        ('[sandbox]\nfsize = 1500', "key 'sandbox.fsize': 1500 is below the minimum of 1m"),
        ('[sandbox]\ncpus = "two"', "key 'sandbox.cpus' must be a number, got 'two'"),
        ('[sandbox]\nworkdir = "work"', "key 'sandbox.workdir': workdir 'work' must be an absolute path inside "
                                        "the sandbox"),
        ('[sandbox]\nnetwork = "allowlist"', "sandbox: network 'allowlist' needs at least one allowed host "
                                             "(--allow-host HOST[:PORT], or allow_hosts in the policy); with "
                                             "none, use network 'none'"),
        ('[sandbox]\ntmp_size = "600m"', "sandbox: tmp_size 600m must be smaller than the memory limit, 512m "
                                         "(tmpfs pages count against it)"),
        ('[sandbox.env]\n"BAD NAME" = "x"', "key 'sandbox.env': environment variable name 'BAD NAME' is not valid"),
        ('[[sandbox.mounts]]\nsource = "/srv"\ntarget = "/proc/x"',
         "key 'sandbox.mounts[0].target': mount target '/proc/x' would cover /proc, which the sandbox needs"),
        ('[[sandbox.mounts]]\nsource = "/srv"\ntarget = "/data"\nmode = "wr"',
         "key 'sandbox.mounts[0].mode' must be 'ro' or 'rw', got 'wr'"),
        ('default_decision = "maybe"', "key 'default_decision' must be 'allow', 'ask' or 'deny', got 'maybe'"),
        ('[tools.shell]\ndecision = "yes"', "key 'tools.shell.decision' must be 'allow', 'ask' or 'deny', got 'yes'"),
        ('[[tools.shell.rules]]\naction = "deny"',
         "key 'tools.shell.rules[0]': give exactly one of command = \"PATTERN\" or path = \"GLOB\" in each rule"),
        ('[[tools.shell.rules]]\naction = "deny"\ncommand = "x"\npath = "y"',
         "key 'tools.shell.rules[0]': give exactly one of command = \"PATTERN\" or path = \"GLOB\" in each rule"),
        ('[[tools.shell.rules]]\naction = "deny"\ncommand = "regex:(rm"',
         "key 'tools.shell.rules[0]': command 'regex:(rm' is not a valid regular expression: missing ), "
         "unterminated subpattern at position 0"),
        ('[[tools.shell.rules]]\naction = "deny"\ncommand = "  "', "key 'tools.shell.rules[0]': command pattern is "
                                                                    "empty"),
        ('[[tools.read_file.rules]]\naction = "deny"\npath = "../secrets/*"',
         "key 'tools.read_file.rules[0]': path pattern '../secrets/*' contains '..'; write the path it means "
         "without it"),
        ('[tools."bad name!"]\ndecision = "deny"',
         "key 'tools': 'bad name!' is not a tool name (1 to 64 letters, digits, '_', '.', '-'; see `callbox "
         "tools`)"),
        ('allowed_tools = "shell"', "key 'allowed_tools' must be an array, got 'shell'"),
        ('tools = 3', "key 'tools' must be a table, got 3"),
        ('[budgets]\ndefault_call_timeout_s = 900',
         "key 'budgets': default_call_timeout_s (900) is above call_timeout_ceiling_s (600); lower the default or "
         "raise the ceiling"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(text: str, problem: str) -> None:
    assert error(text) == f"policy file test.toml: {problem}" + _docs_suffix()


def test_several_problems_are_all_listed() -> None:
    message = error('[budgets]\nmax_tool_calls = 0\nmax_output_bytes = "big"')
    assert message == (
        "policy file test.toml has 2 problems: key 'budgets.max_tool_calls': 0 is below the minimum of 1; "
        "key 'budgets.max_output_bytes' must be an integer, got 'big'" + _docs_suffix()
    )


# ---- sandbox settings --------------------------------------------------------------------


def test_sandbox_spec_from_settings(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    project = writable_dir(tmp_path / "x")
    path = tmp_path / "p.toml"
    path.write_text(
        '[sandbox]\nmemory = "256m"\ncpus = 0.5\nenv = {LANG = "C.UTF-8"}\nallowed_mount_roots = ["."]\n'
        'home_size = "16m"\nnoexec = true\n'
        '[[sandbox.mounts]]\nsource = "data"\ntarget = "/data"\n'
        f'[[sandbox.mounts]]\nsource = "{project}"\ntarget = "/workspace"\nmode = "rw"\n'
    )
    spec = load_policy(path).sandbox_spec()
    assert spec.memory == 256 << 20
    assert spec.cpus == 0.5
    assert spec.env == {"LANG": "C.UTF-8"}
    assert (spec.home_size, spec.noexec) == (16 << 20, True)
    # Relative mount sources and roots are taken against the policy file's directory.
    assert spec.mounts == (
        Mount(source=tmp_path / "data", target="/data", read_only=True),
        Mount(source=project, target="/workspace", read_only=False),
    )
    assert spec.allowed_mount_roots == (tmp_path,)


def test_loosening_is_logged_naming_each_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    project = writable_dir(tmp_path / "x")
    path = tmp_path / "loose.toml"
    path.write_text(
        '[sandbox]\nmemory = "2g"\ncpus = 4\npids = 1024\nnofile = 4096\nfsize = "4g"\npublic_ports = true\n'
        f'[[sandbox.mounts]]\nsource = "{project}"\ntarget = "/workspace"\nmode = "rw"\n'
    )
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        loaded = load_policy(path, host=BIG_HOST)
    notes = [
        f"sandbox.mounts[0] mounts {project} read-write at /workspace",
        "sandbox.memory = 2g is above the default 512m",
        "sandbox.cpus = 4 is above the default 1",
        "sandbox.pids = 1024 is above the default 256",
        "sandbox.nofile = 4096 is above the default 1024",
        "sandbox.fsize = 4g is above the default 1g",
        "sandbox.public_ports = true: a sandbox's ports are served through the E2B door to any client that names "
        "them, without its traffic access token, unless its creator keeps them private (the default is false: the "
        "owner only)",
    ]
    assert loaded.loosened() == notes
    records = [r for r in caplog.records if r.name == "callbox.policy"]
    assert [r.levelno for r in records] == [logging.WARNING] * len(notes)
    assert [r.getMessage() for r in records] == [
        f"policy file {path} loosens a hardened default: {note}" for note in notes
    ]


def test_tightening_is_not_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tight.toml"
    path.write_text('[sandbox]\nmemory = "256m"\ncpus = 0.5\npids = 64\nnoexec = true\n[[sandbox.mounts]]\n'
                    f'source = "{tmp_path}"\ntarget = "/data"\n')
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        assert load_policy(path).loosened() == []
    assert caplog.records == []


# ---- the sandbox checked against this host when the policy loads ----------------------------


def test_a_missing_mount_source_is_refused_at_load_naming_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[sandbox.mounts]]\nsource = "."\ntarget = "/a"\n'
                    '[[sandbox.mounts]]\nsource = "gone"\ntarget = "/b"\nmode = "rw"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.message == (
        f"policy file {path}: key 'sandbox.mounts[1].source': mount source {tmp_path}/gone does not exist on "
        "the host" + _docs_suffix()
    )
    assert info.value.exit_code == 2


@pytest.mark.parametrize("source", ["/etc", "/var/lib/docker", "/var/lib"])
def test_a_forbidden_mount_source_is_refused_at_load(source: str) -> None:
    if not os.path.exists(source):
        pytest.skip(f"{source} does not exist on this host")
    message = error(f'[[sandbox.mounts]]\nsource = "{source}"\ntarget = "/data"\n')
    assert message.startswith(f"policy file test.toml: key 'sandbox.mounts[0].source': mount source {source} is a "
                              "system path")


def test_a_mount_outside_the_allowed_roots_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    message = error(f'[sandbox]\nallowed_mount_roots = ["{tmp_path}/in"]\n'
                    f'[[sandbox.mounts]]\nsource = "{tmp_path}/out"\ntarget = "/data"\n')
    assert f"key 'sandbox.mounts[0].source': mount source {tmp_path}/out is outside the allowed mount roots" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root-owned directory the test can make")
def test_a_root_owned_rw_mount_is_refused_at_load(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    message = error(f'[[sandbox.mounts]]\nsource = "{project}"\ntarget = "/workspace/project"\nmode = "rw"\n')
    assert message.startswith(
        f"policy file test.toml: key 'sandbox.mounts[0].source': rw mount {project} (at /workspace/project) is not "
        "writable by the tool user uid 1000, gid 1000")
    assert "owner root (uid 0), group root (gid 0), mode 0755" in message
    assert "uid and gid on its [[sandbox.mounts]] entry" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_uid_and_gid_keys_pick_the_tool_user(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 0, 4343)
    shared.chmod(0o775)
    loaded = policy(f'[[sandbox.mounts]]\nsource = "{shared}"\ntarget = "/out"\nmode = "rw"\nuid = 4242\ngid = 4343\n')
    spec = loaded.host_checked_spec()
    assert (spec.mounts[0].uid, spec.mounts[0].gid, spec.tool_identity()) == (4242, 4343, (4242, 4343))


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ('mode = "rw"\nuid = 0', "key 'sandbox.mounts[0].uid': tool processes never run as root: pick a uid/gid of 1 "
                                 "or more, not 0"),
        ('mode = "rw"\nuid = 5\ngid = 0', "key 'sandbox.mounts[0].gid': tool processes never run as root: pick a "
                                          "uid/gid of 1 or more, not 0"),
        ('uid = 5', "sandbox.mounts[0]: uid/gid apply to rw mounts only (the tool user writes there); /data is ro"),
        ('mode = "rw"\ngid = 5', "sandbox.mounts[0]: gid=5 needs uid= as well (the tool user's uid)"),
    ],
)
def test_bad_mount_ids_name_their_key(tmp_path: Path, keys: str, problem: str) -> None:
    message = error(f'[[sandbox.mounts]]\nsource = "{tmp_path}"\ntarget = "/data"\n{keys}\n')
    assert message == f"policy file test.toml: {problem}" + _docs_suffix()


def test_two_mounts_at_one_target_are_refused_at_load(tmp_path: Path) -> None:
    message = error(f'[[sandbox.mounts]]\nsource = "{tmp_path}"\ntarget = "/data"\n'
                    f'[[sandbox.mounts]]\nsource = "{tmp_path}"\ntarget = "/data/"\n')
    assert message == (
        "policy file test.toml: key 'sandbox.mounts': mounts[0] and mounts[1] both mount at /data; a container path "
        "takes one mount: pick another target for one of them" + _docs_suffix()
    )


@pytest.mark.parametrize(
    ("text", "host", "problem"),
    [
        ("cpus = 4", HostLimits(cpus=2), "key 'sandbox.cpus': 4 is more than the 2 CPU(s) of this host; use at "
                                         "most 2"),
        ('memory = "1t"', HostLimits(memory=24 << 30), "key 'sandbox.memory': 1t is more than the "
                                                       "24.0 GiB of memory of this host; use at most 24576m"),
        ("cpus = 0.001", None, "key 'sandbox.cpus': 0.001 is below the minimum of 0.01 (the smallest CPU "
                               "quota Docker accepts)"),
    ],
)
def test_cpus_and_memory_are_checked_against_the_host(text: str, host: HostLimits | None, problem: str) -> None:
    assert error(f"[sandbox]\n{text}\n", host) == f"policy file test.toml: {problem}" + _docs_suffix()


def test_loosening_starts_just_above_the_default() -> None:
    at_default = Policy(sandbox=SandboxSettings(pids=256, cpus=1, nofile=1024))
    assert at_default.loosened() == []
    above = Policy(sandbox=SandboxSettings(pids=257, cpus=1.5, memory=(512 << 20) + 1))
    assert above.loosened() == [
        "sandbox.memory = 536870913 is above the default 512m",
        "sandbox.cpus = 1.5 is above the default 1",
        "sandbox.pids = 257 is above the default 256",
    ]


def test_network_loosening_is_noted() -> None:
    # The spec refuses network modes other than none for now; the note is still there for when it does not.
    loose = Policy(sandbox=SandboxSettings(network="open"))
    assert loose.loosened() == ['sandbox.network = "open" (the default is "none")']


# ---- decisions ----------------------------------------------------------------------------


def test_unlisted_tool_gets_default_decision() -> None:
    p = policy('default_decision = "deny"')
    assert p.decide(OTHER, {}) == Decision(
        Action.DENY, "default_decision",
        "denied by policy: the tool 'other' may not be used (default_decision = \"deny\")",
    )
    assert Policy().decide(OTHER, {}) == Decision(
        Action.ALLOW, "default_decision", 'allowed by policy (default_decision = "allow")'
    )


def test_tool_decision() -> None:
    p = policy('default_decision = "deny"\n[tools.shell]\ndecision = "ask"\n[tools.read_file]\n')
    assert p.decide(SHELL, {"command": "ls"}) == Decision(
        Action.ASK, "tools.shell.decision",
        "approval required by policy: every call of 'shell' needs approval (tools.shell.decision = \"ask\")",
    )
    # Listed without a decision: the default applies.
    assert p.decide(READ, {"path": "x"}).rule == "default_decision"
    assert p.decide(READ, {"path": "x"}).action is Action.DENY


def test_allowed_tools() -> None:
    p = policy('allowed_tools = ["read_file", "shell"]')
    assert p.tool_allowed("shell")
    assert not p.tool_allowed("other")
    assert p.decide(OTHER, {}) == Decision(
        Action.DENY, "allowed_tools",
        "denied by policy: the tool 'other' is not enabled in this run (allowed_tools: read_file, shell)",
    )
    assert p.decide(SHELL, {"command": "ls"}).action is Action.ALLOW
    assert Policy().tool_allowed("anything")


SHELL_RULES = """
[tools.shell]
decision = "allow"
[[tools.shell.rules]]
action = "allow"
command = "*"
[[tools.shell.rules]]
action = "ask"
command = "*git push*"
reason = "pushing leaves the sandbox"
[[tools.shell.rules]]
action = "deny"
command = "*rm -rf*"
[[tools.shell.rules]]
action = "ask"
command = "*rm*"
"""


def test_deny_beats_ask_beats_allow() -> None:
    p = policy(SHELL_RULES)
    assert p.decide(SHELL, {"command": "ls"}).rule == 'tools.shell.rules[0] (allow command "*")'
    assert p.decide(SHELL, {"command": "git push origin"}) == Decision(
        Action.ASK,
        'tools.shell.rules[1] (ask command "*git push*")',
        "approval required by policy rule tools.shell.rules[1]: pushing leaves the sandbox",
    )
    # deny is listed after an ask that also matches, and wins.
    assert p.decide(SHELL, {"command": "git push && rm -rf /"}) == Decision(
        Action.DENY,
        'tools.shell.rules[2] (deny command "*rm -rf*")',
        'denied by policy rule tools.shell.rules[2]: the command matches "*rm -rf*"',
    )
    # Two ask rules match: the first listed names the decision.
    assert p.decide(SHELL, {"command": "git push; rm x"}).rule == 'tools.shell.rules[1] (ask command "*git push*")'


def test_precedence_does_not_depend_on_order() -> None:
    p = policy(
        '[[tools.shell.rules]]\naction = "deny"\ncommand = "*curl*"\n'
        '[[tools.shell.rules]]\naction = "ask"\ncommand = "*curl*"\n'
        '[[tools.shell.rules]]\naction = "allow"\ncommand = "*curl*"\n'
    )
    assert p.decide(SHELL, {"command": "curl x"}).action is Action.DENY


def test_matching_rule_replaces_the_tool_decision() -> None:
    p = policy('[tools.shell]\ndecision = "ask"\n[[tools.shell.rules]]\naction = "allow"\ncommand = "git status"\n')
    assert p.decide(SHELL, {"command": "git status"}) == Decision(
        Action.ALLOW,
        'tools.shell.rules[0] (allow command "git status")',
        'allowed by policy rule tools.shell.rules[0]: the command matches "git status"',
    )
    assert p.decide(SHELL, {"command": "git status --short"}).rule == "tools.shell.decision"


def test_deny_tool_with_an_allow_rule() -> None:
    p = policy('[tools.shell]\ndecision = "deny"\n[[tools.shell.rules]]\naction = "allow"\ncommand = "ls*"\n')
    assert p.decide(SHELL, {"command": "ls -l"}).action is Action.ALLOW
    assert p.decide(SHELL, {"command": "cat x"}) == Decision(
        Action.DENY, "tools.shell.decision",
        "denied by policy: the tool 'shell' may not be used (tools.shell.decision = \"deny\")",
    )


# ---- command patterns ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "command", "matches"),
    [
        ("rm -rf *", "rm -rf /tmp", True),
        ("rm -rf *", "sudo rm -rf /", False),  # a glob matches the whole command
        ("*rm -rf *", "sudo rm -rf /", True),
        ("rm -rf *", "  rm   -rf\t/tmp\n", True),  # whitespace is collapsed
        ("git status", "git status --short", False),
        ("git stat?s", "git status", True),
        ("git [sl]*", "git log", True),
        ("git [!sl]*", "git log", False),
        ("ls", "LS", False),  # case-sensitive
        ("regex:git (status|log)( .*)?", "git log --oneline", True),
        ("regex:git (status|log)( .*)?", "git push", False),
        ("regex:rm", "rm -rf /", False),  # fullmatch, not search
        ("regex:.*\\brm\\b.*", "echo hi; rm -rf /", True),
        ("regex:.*\\brm\\b.*", "echo hi; format", False),
        ("regex:echo a b", "echo   a\n b", True),
    ],
)
def test_command_patterns(pattern: str, command: str, matches: bool) -> None:
    p = Policy.model_validate({"tools": {"shell": {"rules": [{"action": "deny", "command": pattern}]}}})
    assert (p.decide(SHELL, {"command": command}).action is Action.DENY) is matches


def test_command_rules_skip_calls_without_a_command() -> None:
    p = policy('[[tools.shell.rules]]\naction = "deny"\ncommand = "*"\n')
    assert p.decide(SHELL, {}).action is Action.ALLOW
    assert p.decide(SHELL, {"command": None}).action is Action.ALLOW
    assert p.decide(OTHER, {"command": "x"}).action is Action.ALLOW  # OTHER has no command field


def test_command_as_argv_list() -> None:
    p = policy('[[tools.shell.rules]]\naction = "deny"\ncommand = "rm -rf *"\n')
    assert p.decide(SHELL, {"command": ["rm", "-rf", "/"]}).action is Action.DENY


def test_decide_accepts_the_validated_model() -> None:
    class ShellArgs(BaseModel):
        command: str
        workdir: str = "/etc"

    p = policy('[[tools.shell.rules]]\naction = "ask"\npath = "/etc/**"\n')
    # The default workdir counts, though the model did not send it.
    assert p.decide(SHELL, ShellArgs(command="ls")).action is Action.ASK
    assert p.decide(SHELL, ShellArgs(command="ls", workdir="/tmp")).action is Action.ALLOW


# ---- path globs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/etc/*", "/etc/passwd", True),
        ("/etc/*", "/etc/ssl/certs", False),  # * stays in one component
        ("/etc/**", "/etc/ssl/certs/x.pem", True),
        ("/etc/**", "/etc", True),  # trailing ** includes the directory itself
        ("/etc/**", "/etcetera", False),
        ("/a/**/b", "/a/b", True),  # ** is zero or more directories
        ("/a/**/b", "/a/x/y/b", True),
        ("/a/**/b", "/a/xb", False),
        ("/**/.env", "/.env", True),
        ("/**/.env", "/srv/app/.env", True),
        ("/**/.env", "/srv/app/.env.local", False),
        ("/**", "/", True),
        ("/**", "/anything/at/all", True),
        ("/src/*.py", "/src/.hidden.py", True),  # dotfiles are not special
        ("/src/?.py", "/src/a.py", True),
        ("/src/?.py", "/src/ab.py", False),
        ("/src/[ab].py", "/src/b.py", True),
        ("/src/[!ab].py", "/src/b.py", False),
        ("/src/[!ab].py", "/src/c.py", True),
        ("/x/a**", "/x/ab/c", False),  # ** inside a component is a plain *
        ("/x/a**", "/x/abc", True),
        ("/x[1]/f", "/x1/f", True),
        ("/x[/f", "/x[/f", True),  # an unclosed [ is literal
        ("/a.b", "/aXb", False),  # . is literal
        ("/etc/", "/etc", True),  # trailing and repeated slashes are normalised
        ("//etc//passwd", "/etc/passwd", True),
    ],
)
def test_path_globs(pattern: str, path: str, matches: bool) -> None:
    p = Policy.model_validate({"tools": {"read_file": {"rules": [{"action": "deny", "path": pattern}]}}})
    assert (p.decide(READ, {"path": path}).action is Action.DENY) is matches


def test_glob_to_regex_translation() -> None:
    assert glob_to_regex("/a/**/b/*.py") == "/a/(?:.*/)?b/[^/]*\\.py"
    assert glob_to_regex("/a/**") == "/a(?:/.*)?"
    assert glob_to_regex("**") == ".*"
    assert glob_to_regex("[!x]") == "(?:(?!/)[^x])"


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("src/*.py", "src/main.py", True),  # relative call path, relative pattern: both under workdir
        ("src/*.py", "/workspace/src/main.py", True),
        ("/workspace/src/*.py", "src/main.py", True),
        ("src/*.py", "/other/src/main.py", False),  # a relative pattern is anchored at workdir
        ("src/**", "./src/../src/a/b", True),
        ("secret", "x/../secret", True),
        ("/etc/passwd", "../../etc/passwd", True),  # .. cannot step around a rule
        ("/etc/passwd", "/workspace/../etc//passwd", True),
        ("**/.env", "/tmp/.env", True),  # a leading ** matches anywhere, not only under workdir
        ("**/.env", ".env", True),
        (".", "/workspace", True),
        (".", "/workspace/x", False),
        ("**", "/anywhere", True),
    ],
)
def test_relative_paths_are_taken_against_the_workdir(pattern: str, path: str, matches: bool) -> None:
    p = Policy.model_validate({"tools": {"read_file": {"rules": [{"action": "deny", "path": pattern}]}}})
    assert (p.decide(READ, {"path": path}).action is Action.DENY) is matches


def test_custom_workdir_and_override() -> None:
    p = policy(
        '[sandbox]\nworkdir = "/home/sandbox/work/"\n[[tools.read_file.rules]]\naction = "deny"\npath = "*.key"\n'
    )
    assert p.decide(READ, {"path": "id.key"}).action is Action.DENY
    assert p.decide(READ, {"path": "/home/sandbox/work/id.key"}).action is Action.DENY
    assert p.decide(READ, {"path": "/workspace/id.key"}).action is Action.ALLOW
    # The caller runs the sandbox with another workdir: relative paths and patterns follow it.
    assert p.decide(READ, {"path": "/workspace/id.key"}, workdir="/workspace").action is Action.DENY
    assert p.decide(READ, {"path": "id.key"}, workdir="/workspace").action is Action.DENY


def test_workdir_at_the_root() -> None:
    p = policy('[sandbox]\nworkdir = "/"\n[[tools.read_file.rules]]\naction = "deny"\npath = "etc/*"\n')
    assert p.decide(READ, {"path": "etc/passwd"}).action is Action.DENY
    assert p.decide(READ, {"path": "/etc/passwd"}).action is Action.DENY
    assert p.decide(READ, {"path": "/usr/etc/x"}).action is Action.ALLOW


def test_deny_path_rule_names_the_path_that_matched() -> None:
    p = policy('[[tools.copy.rules]]\naction = "deny"\npath = "/etc/**"\n')
    assert p.decide(COPY, {"source": "notes.txt", "dest": "/etc/cron.d/x"}) == Decision(
        Action.DENY,
        'tools.copy.rules[0] (deny path "/etc/**")',
        "denied by policy rule tools.copy.rules[0]: the path '/etc/cron.d/x' matches \"/etc/**\"",
    )


def test_deny_and_ask_path_rules_apply_when_any_path_matches() -> None:
    p = policy('[[tools.copy.rules]]\naction = "ask"\npath = "/etc/**"\n')
    assert p.decide(COPY, {"source": "/etc/hosts", "dest": "out"}).action is Action.ASK
    assert p.decide(COPY, {"source": "in", "dest": "out"}).action is Action.ALLOW


def test_allow_path_rule_applies_only_when_every_path_matches() -> None:
    p = policy('[tools.copy]\ndecision = "deny"\n[[tools.copy.rules]]\naction = "allow"\npath = "/workspace/**"\n')
    assert p.decide(COPY, {"source": "a", "dest": "b"}) == Decision(
        Action.ALLOW,
        'tools.copy.rules[0] (allow path "/workspace/**")',
        'allowed by policy rule tools.copy.rules[0]: every path matches "/workspace/**"',
    )
    # One allowed path cannot carry an unlisted one along.
    assert p.decide(COPY, {"source": "a", "dest": "/etc/passwd"}).rule == "tools.copy.decision"
    # A call with no path at all is not covered by a path rule.
    assert p.decide(COPY, {"source": None}).rule == "tools.copy.decision"


def test_list_of_paths() -> None:
    p = policy('[[tools.multi.rules]]\naction = "deny"\npath = "**/*.pem"\n')
    assert p.decide(MULTI, {"paths": ["a.txt", "b/c.pem"]}).action is Action.DENY
    assert p.decide(MULTI, {"paths": ["a.txt", "b/c.txt"]}).action is Action.ALLOW
    assert p.decide(MULTI, {"paths": []}).action is Action.ALLOW


def test_decide_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    p = policy(SHELL_RULES + '[[tools.read_file.rules]]\naction = "deny"\npath = "/etc/**"\n')

    def no_compile(*_args: object, **_kw: object) -> None:
        raise AssertionError("a pattern was compiled during decide()")

    monkeypatch.setattr(re, "compile", no_compile)
    monkeypatch.setattr(re, "fullmatch", no_compile)
    assert p.decide(SHELL, {"command": "rm -rf /"}).action is Action.DENY
    assert p.decide(READ, {"path": "/etc/shadow"}).action is Action.DENY


# ---- check_tools ---------------------------------------------------------------------------


def test_check_tools_accepts_a_matching_registry() -> None:
    policy('allowed_tools = ["shell"]' + SHELL_RULES).check_tools([SHELL, READ])


def test_check_tools_refuses_names_and_rules_that_cannot_apply() -> None:
    p = policy(
        'allowed_tools = ["shell", "shel"]\n'
        '[tools.read_fle]\ndecision = "deny"\n'
        '[[tools.read_file.rules]]\naction = "deny"\ncommand = "x"\n'
        '[[tools.other.rules]]\naction = "deny"\npath = "x"\n'
    )
    with pytest.raises(PolicyError) as info:
        p.check_tools([SHELL, READ, OTHER])
    assert info.value.message == (
        "policy: allowed_tools names 'shel', which is not a registered tool; "
        "[tools.read_fle] is for 'read_fle', which is not a registered tool; "
        "tools.read_file.rules[0] is a command rule, but 'read_file' takes no command; "
        "tools.other.rules[0] is a path rule, but 'other' takes no paths "
        "(registered tools: other, read_file, shell); fix or remove these keys"
    )


# ---- budgets ---------------------------------------------------------------------------------


def test_budget_defaults() -> None:
    b = Budgets()
    assert (b.max_tool_calls, b.max_wall_time_s, b.call_timeout_ceiling_s, b.max_output_bytes,
            b.default_call_timeout_s) == (200, 3600, 600, 30000, 30)


def test_max_tool_calls() -> None:
    b = policy("[budgets]\nmax_tool_calls = 3").budgets
    assert b.check(2, 0.0) is None  # the third call may run
    assert b.check(3, 0.0) == Decision(
        Action.DENY,
        "budgets.max_tool_calls",
        "denied: this run has used its budget of 3 tool calls (budgets.max_tool_calls); finish with what you have",
    )


def test_max_wall_time() -> None:
    b = policy("[budgets]\nmax_wall_time_s = 60").budgets
    assert b.check(0, 59.9) is None
    assert b.check(0, 60.0) == Decision(
        Action.DENY,
        "budgets.max_wall_time_s",
        "denied: this run has used its wall-time budget of 60 s (budgets.max_wall_time_s); finish with what you have",
    )


def test_call_timeout_is_clamped_to_the_ceiling() -> None:
    b = policy("[budgets]\ncall_timeout_ceiling_s = 120\ndefault_call_timeout_s = 10").budgets
    assert b.call_timeout(None)[:3] == (10, None, False)
    assert b.call_timeout(60)[:3] == (60, 60, False)
    assert b.call_timeout(120)[:3] == (120, 120, False)
    clamped = b.call_timeout(900)
    assert clamped[:3] == (120, 900, True)
    assert clamped.meta() == {"timeout_clamped": {"requested_s": 900, "ceiling_s": 120}}
    assert clamped.note() == ("Timeout lowered: timeout 900 is above this sandbox's ceiling; the command got "
                              "timeout 120 (120 s).")
    in_ms = b.call_timeout(99999.999, argument="timeout_ms", unit_s=0.001)
    assert in_ms.note() == ("Timeout lowered: timeout_ms 99999999 is above this sandbox's ceiling; the command got "
                            "timeout_ms 120000 (120 s).")
    assert b.call_timeout(60).meta() == {} and b.call_timeout(60).note() == ""
    with pytest.raises(ValueError, match="a call timeout must be positive, got 0"):
        b.call_timeout(0)
