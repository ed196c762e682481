"""The server configuration's engine and [ray]: how they validate, anchor, render in ``config
check`` (with what the policies say), reach the served policies, and what a reload says."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.cli.serve_doors import door_engine
from harness.cli.serve_quotas import profile_policies
from harness.cli.serve_reload import reload
from harness.cli.server_config import (
    ConfigError,
    apply_config,
    engine_notes,
    load_config,
    parse_config,
    render_toml,
    served_policy,
)
from harness.engine.select import DOCKER

TOKENS = "alice:" + "a" * 32 + "\nbuilder:" + "b" * 32 + "\n"
GRPC = '[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "tokens"\n'
RAY = '[ray]\naddress = "10.0.0.1:6379"\ntoken_file = "ray-token"\n'
RAY_POLICY = 'engine = "ray"\n[ray]\naddress = "10.0.0.7:6379"\ntoken_file = "ray-token"\nnamespace = "pol"\n'


def write(tmp_path: Path, text: str, *, top: str = "") -> Path:
    """A configuration of ``top`` (top-level keys), the gRPC door and ``text``, beside a token
    file, Ray's token and two policies."""
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    ray_token = tmp_path / "ray-token"
    ray_token.write_text("f" * 64)
    ray_token.chmod(0o600)
    (tmp_path / "ray-policy.toml").write_text(RAY_POLICY)
    (tmp_path / "docker-policy.toml").write_text('engine = "docker"\n')
    path = tmp_path / "callbox.toml"
    path.write_text(top + GRPC + text)
    return path


def test_engine_ray_with_its_table_loads_and_anchors_the_token(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, RAY, top='engine = "ray"\n'))
    assert config.engine == "ray"
    assert config.ray is not None and config.ray.token_file == tmp_path / "ray-token"
    choice = config.engine_choice()
    assert choice is not None and choice.ray == config.ray
    assert load_config(write(tmp_path, "")).engine_choice() is None


@pytest.mark.parametrize(("top", "text", "says"), [
    ("", RAY, "key 'ray': [ray] is set but engine is not set; add engine = \"ray\" (a top-level key, above every "
              "table) to run the sandboxes on that cluster, or remove [ray]"),
    ('engine = "docker"\n', RAY, "key 'ray': [ray] is set but engine is \"docker\""),
    ('engine = "ray"\n', "", "key 'ray': engine = \"ray\" needs a [ray] table: address = \"HOST:PORT\""),
    ('engine = "swarm"\n', "", "key 'engine' must be 'docker' or 'ray', got 'swarm'"),
    ('engine = "ray"\n', RAY + "adress = \"x\"\n", "unexpected key 'ray.adress' (allowed: address, namespace, "
                                                   "token_file, allow_unauthenticated, node_ip, relay_port, image)"),
    ('engine = "ray"\n', '[ray]\naddress = "10.0.0.1"\ntoken_file = "ray-token"\n',
     "key 'ray.address': '10.0.0.1' is not HOST:PORT"),
    ('engine = "ray"\n', '[ray]\naddress = "10.0.0.1:6379"\n', "key 'ray': token_file is required"),
    ('engine = "ray"\n', '[ray]\naddress = "10.0.0.1:6379"\ntoken_file = "nope"\n',
     "ray.token_file '{dir}/nope' does not exist"),
])
def test_problems_are_named_by_their_key_with_the_fix(tmp_path: Path, top: str, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, text, top=top))
    assert says.format(dir=tmp_path) in raised.value.message
    assert raised.value.message.startswith(f"config file {tmp_path / 'callbox.toml'}")
    assert raised.value.exit_code == 2


def test_an_open_ray_token_file_is_refused_naming_chmod(tmp_path: Path) -> None:
    path = write(tmp_path, RAY, top='engine = "ray"\n')
    (tmp_path / "ray-token").chmod(0o640)
    with pytest.raises(ConfigError, match=r"ray\.token_file '.*ray-token' is accessible by group or others "
                                          r"\(mode 0640\).*chmod 600"):
        load_config(path)


def test_config_check_renders_the_engine_first_and_round_trips(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, RAY + 'node_ip = "10.0.0.2"\n', top='engine = "ray"\n'))
    text = render_toml(config.effective())
    assert text.startswith('engine = "ray"\n\n[doors.grpc]\n')
    assert (f'[ray]\naddress = "10.0.0.1:6379"\nnamespace = "callbox"\ntoken_file = "{tmp_path}/ray-token"\n'
            'allow_unauthenticated = false\nnode_ip = "10.0.0.2"\nrelay_port = 7395\n'
            'image = "callbox-sandbox:latest"\n') in text
    assert parse_config(text, source="rendered", base=tmp_path).effective() == config.effective()


def test_config_check_says_what_applies_when_no_engine_is_set(tmp_path: Path) -> None:
    text = render_toml(load_config(write(tmp_path, "")).effective())
    assert text.startswith("[doors.grpc]\n")  # nothing above the first table
    assert text.endswith('# engine: not set (the policy\'s engine, else "docker": this machine\'s Docker engine)\n'
                         '# [ray]: no Ray cluster (it goes with engine = "ray")\n')
    assert parse_config(text, source="rendered", base=tmp_path).engine is None


def test_the_files_engine_wins_over_its_policies_and_check_says_so(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[policy]\nfile = "ray-policy.toml"\n', top='engine = "docker"\n'))
    (note,) = engine_notes(config)
    assert note == ('engine: policy.file sets engine = "ray" (the Ray cluster 10.0.0.7:6379 (namespace pol, token '
                    f'{tmp_path}/ray-token)), but a server runs every door and profile on one engine: the Docker '
                    'engine of this machine, set by this file, wins')
    served = served_policy(config.policy.file, config)
    assert (served.engine, served.ray) == ("docker", None)


def test_the_policys_engine_applies_when_the_file_sets_none(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[policy]\nfile = "ray-policy.toml"\n'))
    (note,) = engine_notes(config)
    assert note.startswith('engine: not set here; policy.file sets engine = "ray", so the doors run on the Ray '
                           "cluster 10.0.0.7:6379")
    served = served_policy(config.policy.file, config)
    assert served.engine == "ray" and served.ray is not None and served.ray.namespace == "pol"


def test_a_profile_policy_runs_on_the_servers_engine(tmp_path: Path) -> None:
    text = ('[profiles.ci]\npolicy = "docker-policy.toml"\n[clients.builder]\nprofile = "ci"\n' + RAY)
    config = load_config(write(tmp_path, text, top='engine = "ray"\n'))
    (note,) = engine_notes(config)
    assert note.startswith('engine: profiles.ci.policy sets engine = "docker" (the Docker engine of this machine), '
                           "but a server runs every door and profile on one engine: the Ray cluster 10.0.0.1:6379")
    resolve = profile_policies(config)
    assert resolve is not None
    builder = resolve("builder")
    assert builder is not None and builder.engine == "ray" and builder.ray == config.ray
    docker_resolve = profile_policies(config, DOCKER)  # the flags' choice over the file's
    assert docker_resolve is not None
    builder = docker_resolve("builder")
    assert builder is not None and builder.engine == "docker"


def test_config_check_prints_the_notes_above_the_configuration(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[policy]\nfile = "ray-policy.toml"\n', top='engine = "docker"\n')
    assert cli.main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('# note: engine: policy.file sets engine = "ray"')
    assert '\nengine = "docker"\n\n[doors.grpc]\n' in out
    assert cli.main(["config", "check", "--json", str(path)]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert (effective["engine"], effective["ray"]) == ("docker", None)


def serve_args(path: Path, **flags: object) -> argparse.Namespace:
    values: dict[str, object] = {name: None for name in (
        "grpc", "mcp_http", "e2b", "e2b_domain", "http", "token_file", "tls_cert", "tls_key", "policy", "audit_db",
        "max_per_client", "max_sandboxes", "engine", "ray_address", "ray_token_file")}
    values.update({"insecure": False, "config": path})
    values.update(flags)
    return argparse.Namespace(**values)


def test_the_doors_engine_is_the_flags_over_the_file_over_the_policy(tmp_path: Path) -> None:
    path = write(tmp_path, '[policy]\nfile = "ray-policy.toml"\n')
    args = serve_args(path, engine="docker")
    apply_config(args)
    policy, choice = door_engine(args)
    assert choice == DOCKER and policy.engine == "docker" and policy.ray is None
    path = write(tmp_path, '[policy]\nfile = "docker-policy.toml"\n')
    args = serve_args(path)
    apply_config(args)
    policy, choice = door_engine(args)
    assert choice == DOCKER


def test_a_server_on_a_cluster_that_does_not_answer_fails_before_any_door(tmp_path: Path) -> None:
    import socket

    from harness.core.errors import EngineUnavailable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = serve_args(write(tmp_path, ""), engine="ray", ray_address=f"127.0.0.1:{port}",
                      ray_token_file=tmp_path / "ray-token")
    apply_config(args)
    with pytest.raises(EngineUnavailable, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        door_engine(args)


def test_a_reload_says_an_engine_change_waits_for_a_restart(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    command_line = serve_args(path)
    running = copy.copy(command_line)
    apply_config(running)
    path.write_text('engine = "ray"\n' + GRPC + RAY)
    notes = reload(command_line, running, [])
    assert "engine: None -> 'ray' takes effect when the server restarts; the running doors keep their engine" in notes
    assert "[ray]: changed; takes effect when the server restarts" in notes
    assert running.server_config.engine is None  # what runs stays
