"""CreateSandbox overrides only ever tighten the server's policy (harness.doors.grpc.service.sandbox_policy)."""

from __future__ import annotations

import grpc
import pytest

from harness.core.policy import parse_policy
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.overrides import MountRequest, SandboxOverrides, sandbox_policy
from harness.v1 import executor_pb2

EXPOSED = ["shell", "bash", "read_file"]


@pytest.fixture
def roots(tmp_path):
    (tmp_path / "root" / "data").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path


def _policy(roots=None, extra=""):  # type: ignore[no-untyped-def]
    text = '[sandbox]\nmemory = "512m"\ncpus = 2\npids = 128\nttl_seconds = 600\n'
    if roots is not None:
        text += f'allowed_mount_roots = ["{roots / "root"}"]\n'
        text += f'[[sandbox.mounts]]\nsource = "{roots / "root" / "data"}"\ntarget = "/base"\n'
    return parse_policy(text + extra)


def _refused(policy, **fields) -> ServiceError:  # type: ignore[no-untyped-def]
    with pytest.raises(ServiceError) as info:
        sandbox_policy(policy, SandboxOverrides(**fields), EXPOSED)
    return info.value


def test_nothing_asked_keeps_the_policy():
    policy = _policy()
    assert sandbox_policy(policy, SandboxOverrides(), EXPOSED) is policy


def test_tighter_values_are_applied():
    tightened = sandbox_policy(
        _policy(),
        SandboxOverrides(memory_bytes=256 << 20, cpus=0.5, pids=64, network="none", ttl_seconds=60,
                         env={"A": "1"}, allowed_tools=("shell", "shell")),
        EXPOSED,
    )
    spec = tightened.sandbox_spec()
    assert (spec.memory, spec.cpus, spec.pids, spec.ttl_seconds, spec.env) == (256 << 20, 0.5, 64, 60, {"A": "1"})
    assert tightened.allowed_tools == ("shell",)
    assert tightened.tool_allowed("shell") and not tightened.tool_allowed("bash")


@pytest.mark.parametrize(
    ("fields", "lead"),
    [
        ({"memory_bytes": 1 << 30}, "memory_bytes: 1073741824 (1g) is above this server's limit of 536870912 (512m)"),
        ({"cpus": 3.0}, "cpus: 3 is above this server's limit of 2"),
        ({"pids": 129}, "pids: 129 is above"),
        ({"ttl_seconds": 601}, "ttl_seconds: 601 is above"),
        ({"network": "open"}, "network: 'open' is looser"),
        ({"network": "allowlist"}, "network:"),
        ({"allowed_tools": ("shell", "docker")}, "allowed_tools: 'docker' is not a tool this server exposes"),
    ],
)
def test_looser_is_permission_denied_naming_the_field(fields, lead):
    error = _refused(_policy(), **fields)
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert error.reason == executor_pb2.ERROR_REASON_PERMISSION_DENIED and not error.retryable
    assert error.message.startswith(lead)


@pytest.mark.parametrize(
    "fields", [{"cpus": 0.0}, {"cpus": float("nan")}, {"memory_bytes": 1 << 20}, {"pids": 1},
               {"ttl_seconds": 1}, {"env": {"BAD NAME": "x"}}],
)
def test_out_of_range_is_invalid_argument(fields):
    error = _refused(_policy(), **fields)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error.message


def test_mounts_only_under_the_allowed_roots(roots):
    policy = _policy(roots)
    root = roots / "root"
    ok = sandbox_policy(policy, SandboxOverrides(mounts=(MountRequest(str(root / "data"), "/data", True),)), EXPOSED)
    mounts = ok.sandbox_spec().mounts
    assert [(m.target, m.read_only) for m in mounts] == [("/base", True), ("/data", False)]
    assert ok.loosened()  # the rw mount is noted (and logged)

    no_roots = _refused(_policy(), mounts=(MountRequest(str(root), "/data"),))
    assert no_roots.code == grpc.StatusCode.PERMISSION_DENIED and "allowed_mount_roots" in no_roots.message
    for source in (str(roots / "outside"), "/etc", f"{root}/../outside", "/definitely/not/here"):
        error = _refused(policy, mounts=(MountRequest(source, "/data"),))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED, source
        assert error.message.startswith("mounts[0].source") and "outside" in error.message
        assert "does not exist" not in error.message  # nothing is said about paths outside the roots


def test_a_symlink_out_of_the_roots_is_denied(roots):
    (roots / "root" / "link").symlink_to(roots / "outside")
    error = _refused(_policy(roots), mounts=(MountRequest(str(roots / "root" / "link"), "/data"),))
    assert error.code == grpc.StatusCode.PERMISSION_DENIED and "outside" in error.message


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (MountRequest("relative/path", "/data"), "absolute"),
        (MountRequest("ROOT/data", "/proc/x"), "would cover"),
        (MountRequest("ROOT/data", "/base"), "already mounted"),
        (MountRequest("ROOT/missing", "/data"), "does not exist"),
    ],
)
def test_bad_mounts_are_invalid_argument(roots, request_, words):
    source = request_.source.replace("ROOT", str(roots / "root"))
    error = _refused(_policy(roots), mounts=(MountRequest(source, request_.target),))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and words in error.message, error.message


def test_overrides_from_a_request_keep_unset_fields_unset():
    request = executor_pb2.CreateSandboxRequest(pids=10, allowed_tools=["shell"])
    overrides = SandboxOverrides.from_request(request)
    assert overrides.pids == 10 and overrides.memory_bytes is None and overrides.cpus is None
    assert overrides.allowed_tools == ("shell",) and overrides.mounts == ()


def test_an_allowlist_server_may_be_asked_for_no_network_but_nothing_looser():
    policy = _policy(extra='network = "allowlist"\nallow_hosts = ["pypi.org:443"]\n')
    assert policy.sandbox_spec().allow_hosts == ("pypi.org:443",)
    same = sandbox_policy(policy, SandboxOverrides(network="allowlist"), EXPOSED).sandbox_spec()
    assert (same.network, same.allow_hosts) == ("allowlist", ("pypi.org:443",))
    tighter = sandbox_policy(policy, SandboxOverrides(network="none"), EXPOSED).sandbox_spec()
    assert (tighter.network, tighter.allow_hosts) == ("none", ())
    error = _refused(policy, network="open")
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert error.message.startswith("network: 'open' is looser than this server allows; only 'allowlist' or 'none'")
