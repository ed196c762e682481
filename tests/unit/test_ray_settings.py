"""The Ray engine's settings: the address, the token file's checks, the loosening, anchoring."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.engine.ray.settings import RaySettings, split_address


def token(tmp_path: Path, mode: int = 0o600, name: str = "ray-token") -> Path:
    path = tmp_path / name
    path.write_text("f" * 64)
    path.chmod(mode)
    return path


def problem(**fields: object) -> str:
    with pytest.raises(ValidationError) as raised:
        RaySettings.model_validate(fields)
    return str(raised.value.errors(include_url=False)[0]["msg"]).removeprefix("Value error, ")


@pytest.mark.parametrize(("address", "expected"), [
    ("10.0.0.1:6379", ("10.0.0.1", 6379)),
    ("head.cluster.local:1", ("head.cluster.local", 1)),
    ("[fd00::1]:65535", ("fd00::1", 65535)),
])
def test_addresses_split_into_host_and_port(address: str, expected: tuple[str, int], tmp_path: Path) -> None:
    assert split_address(address) == expected
    assert RaySettings(address=address, token_file=token(tmp_path)).gcs == expected


@pytest.mark.parametrize(("address", "says"), [
    ("10.0.0.1", "is not HOST:PORT"),
    ("10.0.0.1:", "is not HOST:PORT"),
    (":6379", "is not HOST:PORT"),
    ("10.0.0.1:0", "port 0 is not between 1 and 65535"),
    ("10.0.0.1:70000", "port 70000 is not between 1 and 65535"),
    ("fd00::1:6379", "write an IPv6 address in brackets"),
    ("[nope]:6379", "[nope] is not an IPv6 address"),
    ("bad_host!:6379", "is not a host name or IPv4 address"),
    ("ray://10.0.0.1:10001", "is a URL (ray:// is Ray Client's)"),
])
def test_a_bad_address_says_the_form_it_wants(address: str, says: str, tmp_path: Path) -> None:
    assert says in problem(address=address, token_file=token(tmp_path))


def test_auto_means_the_cluster_of_this_machine(tmp_path: Path) -> None:
    settings = RaySettings(address="auto", token_file=token(tmp_path))
    assert settings.gcs is None
    assert settings.address == "auto"


def test_defaults_and_the_other_fields_are_checked(tmp_path: Path) -> None:
    settings = RaySettings(address="10.0.0.1:6379", token_file=token(tmp_path))
    assert (settings.namespace, settings.relay_port, settings.image, settings.node_ip) == (
        "callbox", 7395, "callbox-sandbox:latest", None)
    good = {"address": "10.0.0.1:6379", "token_file": token(tmp_path)}
    assert "greater than or equal to 1" in problem(**good, relay_port=0)
    assert "less than or equal to 65535" in problem(**good, relay_port=65536)
    assert "is not an IP address" in problem(**good, node_ip="w1.local")
    assert RaySettings.model_validate({**good, "node_ip": "10.250.0.1"}).node_ip == "10.250.0.1"
    assert "1 to 64 of letters" in problem(**good, namespace="my namespace")
    assert "String should match pattern" in problem(**good, image="callbox sandbox")
    assert "Extra inputs are not permitted" in problem(**good, port=6379)


def test_settings_are_frozen(tmp_path: Path) -> None:
    settings = RaySettings(address="10.0.0.1:6379", token_file=token(tmp_path))
    with pytest.raises(ValidationError):
        settings.address = "10.0.0.2:6379"


def test_a_token_is_required_unless_the_loosening_is_written(tmp_path: Path) -> None:
    says = problem(address="10.0.0.1:6379")
    assert says.startswith("token_file is required")
    assert "allow_unauthenticated = true" in says
    loose = RaySettings(address="10.0.0.1:6379", allow_unauthenticated=True)
    assert loose.token_file is None
    assert loose.auth_environment() == {}
    (note,) = loose.loosened()
    assert note.startswith("ray.allow_unauthenticated = true: ")
    assert "root on its nodes" in note


def test_a_token_file_with_the_loosening_too_is_no_loosening(tmp_path: Path) -> None:
    settings = RaySettings(address="10.0.0.1:6379", token_file=token(tmp_path), allow_unauthenticated=True)
    assert settings.loosened() == []


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_an_owner_only_token_file_is_taken(tmp_path: Path, mode: int) -> None:
    path = token(tmp_path, mode)
    settings = RaySettings(address="10.0.0.1:6379", token_file=path)
    assert settings.auth_environment() == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
    assert settings.loosened() == []


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o606])
def test_a_token_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = token(tmp_path, mode)
    says = problem(address="10.0.0.1:6379", token_file=path)
    assert f"is accessible by group or others (mode {mode:04o})" in says
    assert f"run `chmod 600 {path}`" in says


def test_a_missing_or_odd_token_file_is_refused(tmp_path: Path) -> None:
    assert "does not exist" in problem(address="10.0.0.1:6379", token_file=tmp_path / "nope")
    folder = tmp_path / "dir"
    folder.mkdir(mode=0o700)
    assert "is not a regular file" in problem(address="10.0.0.1:6379", token_file=folder)
    # By its mode, whoever runs this (root could read it anyway).
    assert "not readable by its owner" in problem(address="10.0.0.1:6379", token_file=token(tmp_path, 0o200))


def test_a_relative_token_file_is_checked_once_anchored(tmp_path: Path) -> None:
    token(tmp_path, name="tok")
    relative = RaySettings(address="10.0.0.1:6379", token_file=Path("tok"))  # not checked against the cwd
    anchored = relative.anchored(tmp_path)
    assert anchored.token_file == tmp_path / "tok"
    with pytest.raises(ValueError, match=r"^ray\.token_file '.*/elsewhere/tok' does not exist"):
        relative.anchored(tmp_path / "elsewhere")
    token(tmp_path, 0o644, name="open")
    with pytest.raises(ValueError, match=r"chmod 600"):
        RaySettings(address="10.0.0.1:6379", token_file=Path("open")).anchored(tmp_path)
    absolute = RaySettings(address="10.0.0.1:6379", token_file=tmp_path / "tok")
    assert absolute.anchored(Path("/nowhere")) == absolute


def test_describe_names_the_cluster_and_the_token(tmp_path: Path) -> None:
    path = token(tmp_path)
    assert RaySettings(address="10.0.0.1:6379", token_file=path).describe() == (
        f"Ray cluster 10.0.0.1:6379 (namespace callbox, token {path})")
    assert "no token" in RaySettings(address="auto", allow_unauthenticated=True).describe()
