"""Choosing the engine: the engine/[ray] pair, the command line's flags over a policy's
choice, the choice carried in a policy, and failing fast (and readably) when the Ray cluster
is not there or ray is not installed.

No cluster is needed: an address nobody listens on, and a listener that never speaks, stand
for a cluster that does not answer (what a real one does is tested in tests/ray)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.cli.options import engine_choice
from harness.core.errors import EngineUnavailable, UsageError
from harness.core.policy import Policy, load_policy, parse_policy
from harness.engine.ray import preflight
from harness.engine.ray.settings import RaySettings
from harness.engine.select import DOCKER, EngineChoice, check_engine_keys, choice_of, connect_engine, with_engine

BOUND_S = 15.0
"""The longest a command may take to say a cluster does not answer (the probe waits 5 s)."""


@pytest.fixture
def tok(tmp_path: Path) -> Path:
    path = tmp_path / "ray-token"
    path.write_text("f" * 64)
    path.chmod(0o600)
    return path


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A loopback port that takes connections (the kernel's backlog) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.fixture(autouse=True)
def no_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Docker engine that does not exist: a path that wrongly reaches for it fails with 125."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    for variable in ("CALLBOX_ENGINE", "CALLBOX_RAY_ADDRESS", "CALLBOX_RAY_TOKEN_FILE"):
        monkeypatch.delenv(variable, raising=False)
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


def flags(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {"engine": None, "ray_address": None, "ray_token_file": None}
    values.update(given)
    return argparse.Namespace(**values)


# ---- the pair of keys ----------------------------------------------------------------------


def test_ray_and_engine_go_together(tok: Path) -> None:
    ray = RaySettings(address="10.0.0.1:6379", token_file=tok)
    with pytest.raises(ValueError, match=r'\[ray\] is set but engine is not set; add engine = "ray"'):
        check_engine_keys(None, ray)
    with pytest.raises(ValueError, match=r'\[ray\] is set but engine is "docker"'):
        check_engine_keys("docker", ray)
    with pytest.raises(ValueError, match=r'engine = "ray" needs a \[ray\] table: address = "HOST:PORT"'):
        check_engine_keys("ray", None)
    check_engine_keys("ray", ray)
    check_engine_keys("docker", None)
    check_engine_keys(None, None)
    with pytest.raises(ValueError, match="needs a"):
        EngineChoice(engine="ray")


def test_a_file_that_sets_no_engine_chooses_nothing(tok: Path) -> None:
    assert choice_of(None, None) is None
    assert choice_of("docker", None) == DOCKER
    ray = RaySettings(address="10.0.0.1:6379", token_file=tok)
    assert choice_of("ray", ray) == EngineChoice(engine="ray", ray=ray)
    assert DOCKER.describe() == "the Docker engine of this machine"
    assert EngineChoice(engine="ray", ray=ray).describe() == f"the Ray cluster 10.0.0.1:6379 (namespace callbox, " \
                                                              f"token {tok})"


def test_with_engine_writes_the_choice_into_a_policy(tok: Path) -> None:
    plain = Policy()
    assert with_engine(plain, DOCKER) is plain  # nothing named, Docker chosen: unchanged
    ray = EngineChoice(engine="ray", ray=RaySettings(address="10.0.0.1:6379", token_file=tok))
    on_ray = with_engine(plain, ray)
    assert (on_ray.engine, on_ray.ray) == ("ray", ray.ray)
    assert with_engine(on_ray, ray) is on_ray
    back = with_engine(on_ray, DOCKER)
    assert (back.engine, back.ray) == ("docker", None)
    # What a paused run's checkpoint stores, and rebuilds its harness from:
    assert Policy.model_validate(on_ray.model_dump(mode="json")).ray == ray.ray


# ---- the flags over a policy's choice ------------------------------------------------------


def test_no_flags_keep_the_base_choice(tok: Path) -> None:
    assert engine_choice(flags()) == DOCKER
    ray = EngineChoice(engine="ray", ray=RaySettings(address="10.0.0.1:6379", token_file=tok, namespace="ci"))
    assert engine_choice(flags(), ray) == ray
    assert engine_choice(flags(engine="docker"), ray) == DOCKER


def test_flags_replace_the_keys_they_name(tok: Path, tmp_path: Path) -> None:
    base = EngineChoice(engine="ray", ray=RaySettings(address="10.0.0.1:6379", token_file=tok, namespace="ci"))
    other = tmp_path / "other-token"
    other.write_text("e" * 64)
    other.chmod(0o400)
    chosen = engine_choice(flags(ray_address="10.0.0.9:7000", ray_token_file=other), base)
    assert chosen.ray is not None
    assert (chosen.ray.address, chosen.ray.token_file, chosen.ray.namespace) == ("10.0.0.9:7000", other, "ci")


def test_a_relative_token_file_flag_is_taken_against_the_working_directory(
        tok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tok.parent)
    chosen = engine_choice(flags(engine="ray", ray_address="10.0.0.1:6379", ray_token_file=Path(tok.name)))
    assert chosen.ray is not None and chosen.ray.token_file == tok


@pytest.mark.parametrize(("given", "says"), [
    ({"engine": "ray"}, "--engine ray needs the cluster's address: --ray-address HOST:PORT"),
    ({"engine": "ray", "ray_address": "10.0.0.1:6379"}, "--engine ray needs --ray-token-file FILE"),
    ({"engine": "ray", "ray_address": "10.0.0.1"}, "--ray-address: '10.0.0.1' is not HOST:PORT"),
    ({"ray_address": "10.0.0.1:6379"}, "--ray-address is for the Ray engine: add --engine ray"),
    ({"engine": "docker", "ray_token_file": Path("t")}, "--ray-token-file is for the Ray engine"),
])
def test_flags_that_do_not_fit_are_usage_errors(given: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError) as raised:
        engine_choice(flags(**given))
    assert raised.value.message.startswith(says), raised.value.message
    assert raised.value.exit_code == 2


def test_an_open_token_file_flag_says_chmod(tmp_path: Path) -> None:
    open_token = tmp_path / "t"
    open_token.write_text("f" * 64)
    open_token.chmod(0o644)
    with pytest.raises(UsageError, match=r"^--ray-token-file: '.*' is accessible by group or others .*chmod 600"):
        engine_choice(flags(engine="ray", ray_address="10.0.0.1:6379", ray_token_file=open_token))


# ---- the environment's defaults -------------------------------------------------------------


def test_the_environment_chooses_ray_when_no_flag_does(tok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBOX_ENGINE", "ray")
    monkeypatch.setenv("CALLBOX_RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("CALLBOX_RAY_TOKEN_FILE", str(tok))
    chosen = engine_choice(flags())
    assert chosen.ray is not None and (chosen.ray.address, chosen.ray.token_file) == ("10.0.0.1:6379", tok)
    # Flags win over the environment, which wins over a policy's or configuration's choice.
    assert engine_choice(flags(engine="docker")) == DOCKER
    assert engine_choice(flags(ray_address="10.0.0.9:7000")).ray.address == "10.0.0.9:7000"  # type: ignore[union-attr]
    assert engine_choice(flags(), DOCKER).engine == "ray"


def test_ray_variables_wait_for_the_ray_engine(tok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBOX_RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("CALLBOX_RAY_TOKEN_FILE", str(tok))
    assert engine_choice(flags()) == DOCKER  # not an error: they apply once the engine is Ray
    chosen = engine_choice(flags(engine="ray"))
    assert chosen.ray is not None and chosen.ray.address == "10.0.0.1:6379"


@pytest.mark.parametrize(("variables", "says"), [
    ({"CALLBOX_ENGINE": "kubernetes"}, "CALLBOX_ENGINE='kubernetes': the engine is docker or ray"),
    ({"CALLBOX_ENGINE": "ray"}, "--engine ray needs the cluster's address: --ray-address HOST:PORT"),
    ({"CALLBOX_ENGINE": "ray", "CALLBOX_RAY_ADDRESS": "10.0.0.1"}, "CALLBOX_RAY_ADDRESS: '10.0.0.1' is not HOST:PORT"),
])
def test_variables_that_do_not_fit_are_named(variables: dict[str, str], says: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as raised:
        engine_choice(flags())
    assert raised.value.message.startswith(says), raised.value.message


def test_an_open_token_file_variable_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_token = tmp_path / "t"
    open_token.write_text("f" * 64)
    open_token.chmod(0o644)
    monkeypatch.setenv("CALLBOX_RAY_TOKEN_FILE", str(open_token))
    with pytest.raises(UsageError, match=r"^CALLBOX_RAY_TOKEN_FILE: '.*' is accessible by group or others"):
        engine_choice(flags(engine="ray", ray_address="10.0.0.1:6379"))


# ---- a policy's engine ---------------------------------------------------------------------


def test_a_policy_names_its_engine_and_cluster(tok: Path) -> None:
    text = f'engine = "ray"\n[ray]\naddress = "10.0.0.1:6379"\ntoken_file = "{tok.name}"\nnamespace = "ci"\n'
    policy = parse_policy(text, source="policy file p.toml", base_dir=tok.parent)
    assert policy.engine == "ray"
    assert policy.ray is not None and policy.ray.token_file == tok and policy.ray.namespace == "ci"
    assert policy.loosened() == []


@pytest.mark.parametrize(("text", "says"), [
    ('[ray]\naddress = "10.0.0.1:6379"\nallow_unauthenticated = true\n',
     "key 'ray': [ray] is set but engine is not set; add engine = \"ray\""),
    ('engine = "ray"\n', "key 'ray': engine = \"ray\" needs a [ray] table"),
    ('engine = "kubernetes"\n', "key 'engine' must be 'docker' or 'ray', got 'kubernetes'"),
    ('engine = "ray"\n[ray]\naddress = "10.0.0.1:6379"\nport = 1\nallow_unauthenticated = true\n',
     "unexpected key 'ray.port' (allowed: address, namespace, token_file, allow_unauthenticated, node_ip, "
     "relay_port, image)"),
    ('engine = "ray"\n[ray]\naddress = "10.0.0.1:6379"\n', "key 'ray': token_file is required"),
    ('engine = "ray"\n[ray]\naddress = "10.0.0.1:6379"\ntoken_file = "missing"\n',
     "ray.token_file '{dir}/missing' does not exist"),
])
def test_a_policy_engine_problem_names_its_key_and_fix(text: str, says: str, tok: Path) -> None:
    from harness.core.policy import PolicyError

    with pytest.raises(PolicyError) as raised:
        parse_policy(text, source="policy file p.toml", base_dir=tok.parent)
    assert says.format(dir=tok.parent) in raised.value.message


def test_a_policy_without_a_token_logs_its_loosening(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p.toml"
    path.write_text('engine = "ray"\n[ray]\naddress = "10.0.0.1:6379"\nallow_unauthenticated = true\n')
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        load_policy(path)
    assert f"policy file {path} loosens a hardened default: ray.allow_unauthenticated = true" in caplog.text


# ---- failing fast and readably -------------------------------------------------------------


def ray_choice(address: str, token_file: Path) -> EngineChoice:
    return EngineChoice(engine="ray", ray=RaySettings(address=address, token_file=token_file))


def test_no_listener_is_an_engine_error_at_once(tok: Path, closed_port: int) -> None:
    started = time.monotonic()
    with pytest.raises(EngineUnavailable) as raised:
        connect_engine(ray_choice(f"127.0.0.1:{closed_port}", tok))
    assert time.monotonic() - started < 2.0
    assert raised.value.message.startswith(f"no Ray cluster answers at 127.0.0.1:{closed_port} (Connection refused)")


def test_a_peer_that_never_answers_is_given_up_on_at_the_deadline(tok: Path) -> None:
    with silent_listener() as port:
        settings = RaySettings(address=f"127.0.0.1:{port}", token_file=tok)
        started = time.monotonic()
        with pytest.raises(EngineUnavailable) as raised:
            preflight.probe_gcs(settings, timeout=0.5)
        took = time.monotonic() - started
    assert 0.4 < took < 3.0
    assert raised.value.message.startswith(f"the Ray cluster at 127.0.0.1:{port} did not answer within 0.5 s")


def test_without_ray_the_choice_names_the_install(tok: Path, closed_port: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an interpreter without ray finds
    with pytest.raises(preflight.RayMissing) as raised:
        connect_engine(ray_choice(f"127.0.0.1:{closed_port}", tok))
    assert "pip install 'callbox[ray]'" in raised.value.message


def test_a_session_on_a_ray_policy_fails_closed_when_the_cluster_is_gone(tok: Path, closed_port: int,
                                                                         tmp_path: Path) -> None:
    from harness.audit.store import AuditStore
    from harness.core.session import Session
    from harness.tools import builtin_registry

    policy = parse_policy(f'engine = "ray"\n[ray]\naddress = "127.0.0.1:{closed_port}"\ntoken_file = "{tok}"\n')
    with AuditStore(tmp_path / "audit.db") as audit, Session(builtin_registry(), policy, audit) as session, \
            pytest.raises(EngineUnavailable, match="no Ray cluster answers"):
        session.sandbox()


# ---- the command line ----------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    code = cli.main(argv)
    took = time.monotonic() - started
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err, took


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "done"}\n')
    return path


def test_run_with_ray_and_no_address_is_a_usage_error(capsys: pytest.CaptureFixture[str], transcript: Path) -> None:
    code, err, _ = run_cli(capsys, ["run", str(transcript), "--engine", "ray"])
    assert code == 2
    assert err.startswith("callbox: --engine ray needs the cluster's address: --ray-address HOST:PORT")


@pytest.mark.parametrize("command", [
    ["run", "{transcript}"], ["call", "shell", '{{"command": "true"}}'], ["exec", "--", "true"],
    ["ps"], ["gc"], ["sandbox", "ls"], ["sandbox", "new"], ["sandbox", "exec", "sb", "--", "true"], ["doctor"],
    # The snapshot verbs ask the cluster's nodes, never this machine's snapshot store:
    ["sandbox", "snapshots"], ["sandbox", "rm-snapshot", "s1"], ["sandbox", "restore", "box1"],
    ["sandbox", "fork", "--from-snapshot", "s1"],
])
def test_every_command_with_engine_flags_says_a_dead_cluster_in_one_line(
        command: list[str], capsys: pytest.CaptureFixture[str], transcript: Path, tok: Path,
        closed_port: int) -> None:
    argv = [word.format(transcript=transcript) for word in command]
    engine = ["--engine", "ray", "--ray-address", f"127.0.0.1:{closed_port}", "--ray-token-file", str(tok)]
    at = argv.index("--") if "--" in argv else len(argv)  # the options go before a command's --
    code, err, took = run_cli(capsys, [*argv[:at], *engine, *argv[at:]])
    assert took < BOUND_S
    if command == ["doctor"]:  # a report, with the reason on its line
        assert code == 1
        return
    assert code == 125, err
    assert err == (f"callbox: no Ray cluster answers at 127.0.0.1:{closed_port} (Connection refused); check the "
                   "address and that the head node runs (`ray start --head` there)\n")


def test_the_environment_alone_sends_a_command_to_the_cluster(capsys: pytest.CaptureFixture[str], tok: Path,
                                                             closed_port: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBOX_ENGINE", "ray")
    monkeypatch.setenv("CALLBOX_RAY_ADDRESS", f"127.0.0.1:{closed_port}")
    monkeypatch.setenv("CALLBOX_RAY_TOKEN_FILE", str(tok))
    code, err, _ = run_cli(capsys, ["sandbox", "snapshots"])
    assert code == 125 and err.startswith(f"callbox: no Ray cluster answers at 127.0.0.1:{closed_port}"), err


def test_run_against_a_silent_peer_ends_within_the_bound(capsys: pytest.CaptureFixture[str], transcript: Path,
                                                        tok: Path) -> None:
    with silent_listener() as port:
        code, err, took = run_cli(capsys, ["run", str(transcript), "--engine", "ray", "--ray-address",
                                           f"127.0.0.1:{port}", "--ray-token-file", str(tok)])
    assert code == 125
    assert took < BOUND_S
    assert f"the Ray cluster at 127.0.0.1:{port} did not answer within 5 s" in err
