"""The server configuration's service sections: http, service, log, telemetry, pool, runtime,
quotas, profiles and clients (how they validate, merge, render and reach the served policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.serve_quotas import profile_policies
from harness.cli.server_config import ConfigError, load_config, parse_config, render_toml, served_policy
from harness.doors.quotas import Quotas

TOKENS = "alice:" + "a" * 32 + "\nbuilder:" + "b" * 32 + "\n"
GRPC = '[doors.grpc]\nlisten = ""\n[auth]\ntoken_file = "tokens"\n'
POLICY_DENYING_SHELL = '[tools.shell]\ndecision = "deny"\n'


def write(tmp_path: Path, text: str) -> Path:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    (tmp_path / "ci-policy.toml").write_text(POLICY_DENYING_SHELL)
    path = tmp_path / "callbox.toml"
    path.write_text(GRPC + text)
    return path


FULL = """
[limits]
max_per_client = 6
[http]
listen = "127.0.0.1:0"
[service]
keep_sandboxes = false
[log]
format = "json"
file = "logs/callbox.log"
[telemetry]
otlp_endpoint = "http://127.0.0.1:4318/v1/traces"
[pool]
size = 2
max = 5
[runtime]
default = "runc"
[quotas]
calls_per_minute = 600
memory = "16g"
[profiles.ci]
policy = "ci-policy.toml"
[profiles.ci.quotas]
live_sandboxes = 4
calls_per_minute = 60
[clients.builder]
profile = "ci"
[clients.builder.quotas]
sandboxes_per_hour = 100
"""


def test_every_section_loads_and_paths_are_anchored(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    config = load_config(write(tmp_path, FULL))
    assert config.http is not None and config.http.listen == "127.0.0.1:0"
    assert config.service.keep_sandboxes is False
    assert config.log.format == "json" and config.log.file == tmp_path / "logs" / "callbox.log"
    assert config.telemetry.otlp_endpoint == "http://127.0.0.1:4318/v1/traces"
    assert config.pool is not None and (config.pool.size, config.pool.ceiling) == (2, 5)
    assert config.profiles["ci"].policy == tmp_path / "ci-policy.toml"


def test_quotas_merge_client_over_profile_over_default(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    config = load_config(write(tmp_path, FULL))
    assert config.client_quotas("builder") == Quotas(
        live_sandboxes=4, sandboxes_per_hour=100, memory=16 << 30, calls_per_minute=60)
    assert config.client_quotas("alice") == Quotas(live_sandboxes=6, memory=16 << 30, calls_per_minute=600)
    assert config.client_quotas("someone-else") == config.client_quotas("alice")


def test_a_profiles_policy_is_served_to_its_clients_only(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    config = load_config(write(tmp_path, FULL))
    policies = profile_policies(config)
    assert policies is not None and policies("alice") is None  # the door's own policy
    served = policies("builder")
    assert served is not None and served.tools["shell"].decision.value == "deny"
    assert (served.pool.size, served.pool.ceiling) == (2, 5)  # the config's [pool] over the policy's
    assert served_policy(None, None).pool.size == 0


def test_service_defaults_keep_sandboxes_and_leave_the_rest_off(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.service.keep_sandboxes is True
    assert config.http is None and config.pool is None and config.runtime.default is None
    assert config.log.format == "text" and config.log.file is None
    assert config.telemetry.otlp_endpoint is None


@pytest.mark.parametrize(("text", "problem"), [
    ('[clients.builder]\nprofile = "nope"\n', r"clients\.builder\.profile: no \[profiles\.nope\] \(none is defined\)"),
    ('[clients.mallory]\n',
     r"\[clients\.mallory\]: the token file .* has no client named 'mallory' \(it has alice, builder\); fix the "
     r"name"),
    ('[log]\nformat = "xml"\n', r"'log\.format' must be 'text' or 'json'"),
    ('[log]\nfile = "nodir/x.log"\n', r"\[log\] file = '.*/nodir/x.log': its directory does not exist"),
    ('[telemetry]\notlp_endpoint = "127.0.0.1:4318"\n', r"telemetry\.otlp_endpoint"),
    ('[quotas]\nmemory = "lots"\n', r"quotas\.memory"),
    ('[quotas]\ncalls_per_minute = 0\n', r"'quotas\.calls_per_minute': 0 is below the minimum of 1"),
    ('[profiles.ci]\npolicy = "missing.toml"\n', r"\[profiles\.ci\] policy = '.*/missing.toml' is not a file"),
    ('[pool]\nsize = 3\nmax = 1\n', r"pool\.max \(1\) must be at least pool\.size \(3\)"),
    ('[http]\n', r"missing required key 'http\.listen'"),
])
def test_problems_are_named_by_their_key(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        load_config(write(tmp_path, text))
    assert raised.value.exit_code == 2


def test_rendered_full_config_round_trips(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    effective = load_config(write(tmp_path, FULL)).effective()
    text = render_toml(effective)
    assert "[clients.builder.quotas]" in text
    assert "# calls_per_minute: not set (its profile's, else [quotas])" in text
    assert "# max: not set" not in text  # set in this file
    assert parse_config(text, source="rendered", base=tmp_path).effective() == effective


def test_an_unset_pool_says_what_applies_instead(tmp_path: Path) -> None:
    text = render_toml(load_config(write(tmp_path, "")).effective())
    assert "# [pool]: the policy's [pool]" in text
    assert "# [http]: not served: no /metrics, /healthz or console" in text
    assert "# [profiles.NAME]: none" in text


def test_sizes_render_as_a_user_writes_them_and_durations_with_their_unit(tmp_path: Path) -> None:
    import re

    (tmp_path / "logs").mkdir()
    config = load_config(write(tmp_path, FULL + '[clients.alice.quotas]\nmemory = 1500000\n'))
    assert config.log.max_bytes == 10 << 20 and config.quotas.memory == 16 << 30
    text = render_toml(config.effective())
    assert '\nmax_bytes = "10m"\n' in text  # the default, 10485760 bytes
    assert '[quotas]\n' in text and '\nmemory = "16g"\n' in text
    assert '\nmemory = "1500000b"\n' in text  # no whole number of KiB: bytes, said so
    assert "\npause_s = 0.05  # seconds\n" in text
    assert not re.search(r"= \d{6,}\b", text), text  # no raw byte count anywhere
    assert parse_config(text, source="rendered", base=tmp_path).effective() == config.effective()
    assert config.effective()["log"]["max_bytes"] == 10 << 20  # --json keeps numbers


def test_log_max_bytes_takes_a_size(tmp_path: Path) -> None:
    config = parse_config('[doors.grpc]\nlisten = ""\n[log]\nmax_bytes = "64k"\n', source="c", base=tmp_path)
    assert config.log.max_bytes == 64 << 10
    with pytest.raises(ConfigError, match=r"'log\.max_bytes': 1k is below the minimum of 4k"):
        parse_config('[doors.grpc]\nlisten = ""\n[log]\nmax_bytes = "1k"\n', source="c", base=tmp_path)
