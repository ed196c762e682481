"""Sandbox actions in the policy: [actions.NAME] parsing and refusals, the defaults, decisions
on the details the doors pass, and port_forward loosenings."""

from __future__ import annotations

import logging
import re
import tomllib
from importlib import resources
from pathlib import Path, PurePosixPath

import pytest

from harness.core.actions import ACTIONS, DEFAULT_DECISIONS, ActionPolicy, ActionRule, ActionsPolicy, action_tool
from harness.core.calls import Action
from harness.core.policy import Policy, PolicyError, load_policy, parse_policy

WORKDIR = "/workspace"


def policy(text: str) -> Policy:
    return parse_policy(text, source="policy file test.toml")


def error(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="policy file test.toml")
    return info.value.message


def decide(p: Policy, action: str, **details: object) -> tuple[Action, str, str]:
    d = p.actions.decide(action, details, workdir=WORKDIR)
    return d.action, d.rule, d.reason


# ---- the table and its defaults ---------------------------------------------------------------


def test_the_actions_are_the_fields_of_the_table() -> None:
    assert tuple(ActionsPolicy.model_fields) == ACTIONS
    assert ACTIONS == ("process", "attach", "port_forward", "copy_in", "copy_out", "snapshot", "fork", "pause",
                       "network", "revert")
    assert action_tool("port_forward") == "sandbox.port_forward"
    with pytest.raises(ValueError, match="unknown sandbox action 'forward'; the actions are process, attach"):
        action_tool("forward")


def test_defaults_port_forward_off_the_rest_allowed() -> None:
    default = Policy()
    for name in ACTIONS:
        expected = Action.DENY if name == "port_forward" else Action.ALLOW
        assert default.actions.decision_of(name) is expected, name
        assert decide(default, name)[0] is expected, name
    assert DEFAULT_DECISIONS["port_forward"] is Action.DENY
    assert default.loosened() == []


def test_the_default_policy_file_documents_every_action_at_its_default() -> None:
    text = (resources.files("harness") / "data/default-policy.toml").read_text()
    loaded = load_policy(None)
    assert loaded.actions == ActionsPolicy()
    for name in ACTIONS:
        assert f"# [actions.{name}]\n# decision = \"{DEFAULT_DECISIONS[name]}\"\n" in text, name
    for header in ("[[actions.port_forward.rules]]", "[[actions.copy_out.rules]]"):
        assert f"# {header}" in text
    for model in (ActionPolicy, ActionRule):
        for key in model.model_fields:
            if key != "rules":
                assert re.search(rf"^# {key} = ", text, re.MULTILINE), f"{model.__name__}.{key} is not documented"
    # The commented examples load as written.
    block = text[text.index("# [actions.process]"):text.index("# The same tables written inline")]
    examples = "\n".join(line.removeprefix("# ") for line in block.splitlines()
                         if re.match(r"# (\[|[a-z_]+ = )", line))
    loaded_examples = policy(examples)
    assert decide(loaded_examples, "port_forward", port=8085)[0] is Action.ALLOW
    assert decide(loaded_examples, "copy_out", path="src/.env")[0] is Action.DENY
    inline = next(line for line in text.splitlines() if line.startswith("# actions = "))
    assert tomllib.loads(inline.removeprefix("# "))["actions"]["port_forward"] == {"decision": "ask"}
    assert decide(policy(inline.removeprefix("# ")), "copy_in", path="/x")[0] is Action.ASK


def test_a_table_without_a_decision_keeps_the_default() -> None:
    p = policy('[[actions.port_forward.rules]]\naction = "deny"\nports = [22]\n[actions.snapshot]\n')
    assert p.actions.port_forward.decision is None
    assert decide(p, "port_forward", port=8000)[0] is Action.DENY
    assert decide(p, "snapshot")[0] is Action.ALLOW


def test_default_decision_is_for_tools_only() -> None:
    p = policy('default_decision = "deny"')
    assert decide(p, "copy_out", path="/workspace/x")[0] is Action.ALLOW
    assert decide(p, "port_forward", port=80)[0] is Action.DENY


# ---- refusals at load -------------------------------------------------------------------------


def test_an_unknown_action_is_refused_naming_the_valid_ones() -> None:
    message = error('[actions.forward]\ndecision = "allow"')
    assert message.startswith("policy file test.toml: unexpected key 'actions.forward' (allowed: process, attach, "
                              "port_forward, copy_in, copy_out, snapshot, fork, pause, network, revert)")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[actions.pause]\ndecision = "maybe"', "key 'actions.pause.decision' must be 'allow', 'ask' or 'deny'"),
        ('[actions.fork]\nallow = true', "unexpected key 'actions.fork.allow' (allowed: decision, rules)"),
        ('[[actions.copy_in.rules]]\naction = "deny"\nports = [80]',
         "key 'actions.copy_in': rules[0] is a ports rule (ports rules are for port_forward); a copy_in rule "
         'takes path = "GLOB"'),
        ('[[actions.port_forward.rules]]\naction = "deny"\npath = "/x"',
         "key 'actions.port_forward': rules[0] is a path rule (path rules are for copy_in, copy_out); a "
         "port_forward rule takes ports = [8000]"),
        ('[[actions.snapshot.rules]]\naction = "deny"\ncommand = "x"',
         "key 'actions.snapshot': rules[0] is a command rule (command rules are for process); snapshot takes no "
         "rules, only decision"),
        ('[[actions.copy_out.rules]]\naction = "deny"\npath = "x"\nports = [1]',
         "key 'actions.copy_out.rules[0]': give exactly one of ports"),
        ('[[actions.copy_out.rules]]\naction = "deny"', "key 'actions.copy_out.rules[0]': give exactly one of"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = []', "ports is empty"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = ["9100-9000"]',
         "ports entry '9100-9000' is not a port or an ascending range of ports (1 to 65535)"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = [0]', "ports entry 0 is not a port"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = [70000]', "ports entry 70000 is not a port"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = ["http"]',
         "ports entry 'http' is neither a port nor a range"),
        ('[[actions.port_forward.rules]]\naction = "allow"\nports = [true]',
         "key 'actions.port_forward.rules[0].ports[0]' must be an integer or a string"),
        ('[[actions.copy_out.rules]]\naction = "deny"\npath = "../etc"', "contains '..'"),
        ('[[actions.process.rules]]\naction = "deny"\ncommand = "regex:("', "is not a valid regular expression"),
        ('[[tool]]\nname = "sandbox.port_forward"\ndescription = "x"\nkind = "command"\nargv = ["true"]',
         "names starting with 'sandbox.' are the audit's sandbox actions"),
    ],
)
def test_bad_action_tables_name_the_key_and_the_fix(text: str, problem: str) -> None:
    assert problem in error(text)


# ---- decisions --------------------------------------------------------------------------------


def test_port_forward_is_denied_by_default_naming_the_key_to_set() -> None:
    action, rule, reason = decide(Policy(), "port_forward", sandbox="web", port=8000)
    assert (action, rule) == (Action.DENY, "actions.port_forward.decision")
    assert "is off" in reason and '[actions.port_forward] decision = "allow"' in reason
    assert "[[actions.port_forward.rules]]" in reason


def test_decisions_name_their_key() -> None:
    p = policy('[actions.copy_out]\ndecision = "ask"\n[actions.fork]\ndecision = "deny"\n'
               '[actions.port_forward]\ndecision = "deny"')
    assert decide(p, "copy_out", path="/workspace/a") == (
        Action.ASK, "actions.copy_out.decision",
        "approval required by policy: copying files out of a sandbox needs a person's approval "
        '(actions.copy_out.decision = "ask")')
    action, rule, reason = decide(p, "fork", name="b")
    assert (action, rule) == (Action.DENY, "actions.fork.decision")
    assert reason.startswith('denied by policy: forking a sandbox is not allowed (actions.fork.decision = "deny"); '
                             'set [actions.fork] decision = "allow"')
    assert 'actions.port_forward.decision = "deny")' in decide(p, "port_forward", port=1)[2]  # set, not the default
    assert decide(p, "snapshot")[2] == 'allowed by policy (actions.snapshot.decision = "allow", the default)'


def test_port_rules() -> None:
    p = policy('[[actions.port_forward.rules]]\naction = "allow"\nports = [8000, "9000-9100", " 3000 - 3001 "]\n'
               '[[actions.port_forward.rules]]\naction = "deny"\nports = ["9050"]\nreason = "the admin port"')
    for port in (8000, 9000, 9100, 9049, 3000, 3001):
        action, rule, reason = decide(p, "port_forward", port=port)
        assert action is Action.ALLOW, port
        assert rule == 'actions.port_forward.rules[0] (allow ports [8000, "9000-9100", " 3000 - 3001 "])'
        assert reason == (f"allowed by policy rule actions.port_forward.rules[0]: the port {port} matches ports "
                          '[8000, "9000-9100", " 3000 - 3001 "]')
    assert decide(p, "port_forward", port=9050) == (
        Action.DENY, 'actions.port_forward.rules[1] (deny ports ["9050"])',
        "denied by policy rule actions.port_forward.rules[1]: the admin port")
    for port in (7999, 9101, 2999):
        assert decide(p, "port_forward", port=port)[1] == "actions.port_forward.decision", port
    assert decide(p, "port_forward", port=" 8000 ")[0] is Action.ALLOW  # digits count as the port
    assert decide(p, "port_forward", port="9050")[0] is Action.DENY
    # A detail the rule cannot read (missing, not a port) makes it not apply.
    assert decide(p, "port_forward")[1] == "actions.port_forward.decision"
    assert decide(p, "port_forward", port="http")[1] == "actions.port_forward.decision"
    assert decide(p, "port_forward", port=True)[1] == "actions.port_forward.decision"


def test_most_restrictive_rule_wins_whatever_the_order() -> None:
    for rules in (('"allow"', '"ask"'), ('"ask"', '"allow"')):
        text = "".join(f'[[actions.port_forward.rules]]\naction = {a}\nports = ["1-65535"]\n' for a in rules)
        assert decide(policy(text), "port_forward", port=80)[0] is Action.ASK


def test_path_rules_on_copies() -> None:
    p = policy('[actions.copy_in]\ndecision = "deny"\n'
               '[[actions.copy_in.rules]]\naction = "allow"\npath = "uploads/**"\n'
               '[[actions.copy_out.rules]]\naction = "deny"\npath = "**/.env"\n'
               '[[actions.copy_out.rules]]\naction = "ask"\npath = "/etc/**"\n')
    assert decide(p, "copy_in", path="/workspace/uploads/a/b.txt")[0] is Action.ALLOW
    assert decide(p, "copy_in", path="uploads")[0] is Action.ALLOW  # relative: against the workdir
    assert decide(p, "copy_in", path="/workspace/uploads/../src")[0] is Action.DENY  # normalised first
    assert decide(p, "copy_in", path=["uploads/a", "uploads/b"])[0] is Action.ALLOW
    assert decide(p, "copy_in", path=["uploads/a", "src/b"])[0] is Action.DENY  # allow needs EVERY path
    assert decide(p, "copy_in", host_path="/home/me/x")[0] is Action.DENY  # no sandbox path: the decision
    action, _, reason = decide(p, "copy_out", path="project/.env")
    assert action is Action.DENY and "the path '/workspace/project/.env' matches path \"**/.env\"" in reason
    assert decide(p, "copy_out", path=["/workspace/ok", "/etc/passwd"])[0] is Action.ASK  # ANY path
    assert decide(p, "copy_out", path="/workspace/ok")[0] is Action.ALLOW
    assert decide(p, "copy_out", path=PurePosixPath("/etc/hosts"))[0] is Action.ASK


def test_path_rules_follow_a_custom_workdir() -> None:
    p = policy('[[actions.copy_out.rules]]\naction = "deny"\npath = "secret/*"')
    assert p.actions.decide("copy_out", {"path": "secret/k"}, workdir="/srv").action is Action.DENY
    assert p.actions.decide("copy_out", {"path": "/workspace/secret/k"}, workdir="/srv").action is Action.ALLOW
    assert p.actions.decide("copy_out", {"path": "/srv/secret/k"}, workdir="/srv").action is Action.DENY


def test_command_rules_on_processes() -> None:
    p = policy('[[actions.process.rules]]\naction = "ask"\ncommand = "python3 -m http.server*"\n'
               '[[actions.process.rules]]\naction = "deny"\ncommand = "regex:.*\\\\bnc\\\\b.*"\n')
    assert decide(p, "process", command="python3  -m http.server 8000")[0] is Action.ASK
    assert decide(p, "process", command=["python3", "-m", "http.server"])[0] is Action.ASK
    assert decide(p, "process", command="sh -c 'nc -l 1'")[0] is Action.DENY
    assert decide(p, "process", command="sleep 100")[0] is Action.ALLOW
    assert decide(p, "process", command=[1, 2])[0] is Action.ALLOW  # not a command: the rules do not apply


def test_decide_refuses_an_unknown_action() -> None:
    with pytest.raises(ValueError, match="unknown sandbox action 'copy'"):
        Policy().actions.decide("copy", {}, workdir=WORKDIR)


# ---- loosening --------------------------------------------------------------------------------


def test_letting_ports_through_is_a_loosening() -> None:
    assert policy('[actions.port_forward]\ndecision = "allow"').loosened() == [
        'actions.port_forward.decision = "allow": sandbox ports can be forwarded to the host (the default is "deny")']
    assert policy('[actions.port_forward]\ndecision = "ask"').loosened() == [
        'actions.port_forward.decision = "ask": sandbox ports can be forwarded to the host once a person approves '
        '(the default is "deny")']
    rules = policy('[[actions.port_forward.rules]]\naction = "allow"\nports = [8000]\n'
                   '[[actions.port_forward.rules]]\naction = "deny"\nports = [22]\n'
                   '[[actions.port_forward.rules]]\naction = "ask"\nports = ["9000-9001"]\n')
    assert rules.loosened() == [
        'actions.port_forward.rules[0] allows forwarding sandbox ports [8000] to the host (the default is "deny")',
        'actions.port_forward.rules[2] asks before forwarding sandbox ports ["9000-9001"] to the host (the default '
        'is "deny")',
    ]


def test_other_actions_and_denials_loosen_nothing() -> None:
    p = policy('[actions.port_forward]\ndecision = "deny"\n[[actions.port_forward.rules]]\naction = "deny"\n'
               'ports = [22]\n[actions.copy_out]\ndecision = "allow"\n[actions.process]\ndecision = "ask"')
    assert p.loosened() == []


def test_a_loosening_is_logged_when_the_policy_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[actions.port_forward]\ndecision = "allow"\n')
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        load_policy(path)
    assert [r.getMessage() for r in caplog.records] == [
        f'policy file {path} loosens a hardened default: actions.port_forward.decision = "allow": sandbox ports '
        'can be forwarded to the host (the default is "deny")']
