"""Shared fixtures. Docker tests use the real engine and the real image.

Outside CI a missing engine or image skips the Docker tests with the reason; with
CI=true it fails them, because in CI every Docker and security test must run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

# As in the agent: nothing here forks without exec once gRPC runs, except the agent's process
# spawner in unit tests, whose children gRPC's fork handlers (inherited through the fork of this
# threaded process) would abort.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = ["tests.support.foreign_fixtures", "tests.ray.fixtures"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
IMAGE = os.environ.get("CALLBOX_TEST_IMAGE", "callbox-sandbox:latest")
DESKTOP_TEST_IMAGE = os.environ.get("CALLBOX_TEST_DESKTOP_IMAGE", "callbox-sandbox-desktop:latest")
"""The desktop image the ``computer`` and ``browser_*`` tests run on (a tag of one's own while the
desktop variant's files change)."""
RUNTIME = os.environ.get("CALLBOX_TEST_RUNTIME", "runc")
"""The OCI runtime the sandboxes of the Docker tests run under: ``runc`` (default) or
``runsc`` (gVisor; ``make test`` runs tests/security a second time with it)."""
if RUNTIME not in ("runc", "runsc"):
    raise pytest.UsageError(f"CALLBOX_TEST_RUNTIME={RUNTIME!r}: use runc or runsc")
ENGINE = os.environ.get("CALLBOX_TEST_ENGINE", "docker")
"""Where the sandboxes of the ``engine`` fixture run: ``docker`` (default, this machine's engine)
or ``ray`` (the three-node Ray test cluster of tests/ray/cluster.py: ``make test`` runs
tests/ray and tests/security that way, as root)."""
if ENGINE not in ("docker", "ray"):
    raise pytest.UsageError(f"CALLBOX_TEST_ENGINE={ENGINE!r}: use docker or ray")
if ENGINE == "ray" and RUNTIME != "runc":
    raise pytest.UsageError("CALLBOX_TEST_ENGINE=ray runs under runc only: the test cluster's dockerds have no "
                            f"runtime {RUNTIME} (unset CALLBOX_TEST_RUNTIME)")


def unavailable(reason: str, *, module: bool = False) -> None:
    """Skip with ``reason`` (the whole module if ``module``); under CI=true fail instead,
    because in CI every Docker and security test must run."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


@pytest.fixture(scope="session")
def engine(request):  # type: ignore[no-untyped-def]
    if ENGINE == "ray":
        return request.getfixturevalue("ray_engine")
    from harness.core.errors import EngineUnavailable
    from harness.engine.docker.engine import DockerEngine

    try:
        eng = DockerEngine.connect()
    except EngineUnavailable as exc:
        unavailable(f"no Docker engine: {exc.message} (run `make test`, which starts one)")
    try:
        eng.client.images.get(IMAGE)
    except Exception:
        unavailable(f"image {IMAGE} is missing (run `make image`)")
    if RUNTIME != "runc" and RUNTIME not in (eng.client.info().get("Runtimes") or {}):
        unavailable(f"CALLBOX_TEST_RUNTIME={RUNTIME} but the Docker engine has no runtime {RUNTIME} (run `make runsc`)")
    return eng


@pytest.fixture
def make_sandbox(engine) -> Iterator[Callable[..., object]]:  # type: ignore[no-untyped-def]
    """Factory: ``make_sandbox(**spec_fields)``; every sandbox is destroyed afterwards."""
    from harness.engine.spec import SandboxSpec

    created = []

    def make(**fields: object) -> object:
        fields.setdefault("image", IMAGE)
        fields.setdefault("runtime", RUNTIME)
        box = engine.create(SandboxSpec(**fields))
        created.append(box)
        return box

    try:
        yield make
    finally:
        for box in created:
            box.destroy()


@pytest.fixture
def sandbox(make_sandbox):  # type: ignore[no-untyped-def]
    return make_sandbox()


@pytest.fixture(scope="module")
def module_sandbox(engine) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """One default sandbox shared by a module's tests; use it through ``clean_sandbox``.

    A sandbox costs about a second to start (more under gVisor or on the Ray cluster), so a
    module whose tests only need a default sandbox with empty scratch directories shares one.
    A test that needs more (its own spec, a mount, a container of its own to kill, a second
    sandbox to tell apart) keeps ``sandbox``/``make_sandbox``."""
    from harness.engine.spec import SandboxSpec

    box = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    try:
        yield box
    finally:
        box.destroy()


SCRATCH_DIRS = ("/workspace", "/tmp")
"""The directories a sandbox's tool processes may write to; ``clean_sandbox`` empties them."""


@pytest.fixture
def clean_sandbox(module_sandbox):  # type: ignore[no-untyped-def]
    """The module's shared sandbox, reset before the test to what a test can tell from a fresh
    one: no persistent shell session (the ``bash`` tool's, with its processes, is killed and
    forgotten, so the next call starts one as in a new sandbox) and empty scratch directories
    (emptied as the tool user, who made everything in them). Other processes a test starts are
    its own to end."""
    from harness.engine.exec_result import collect

    module_sandbox.agent.shell_close("default")
    dirs = " ".join(SCRATCH_DIRS)
    script = f"find {dirs} -mindepth 1 -delete && test -z \"$(find {dirs} -mindepth 1 -print -quit)\""
    result = collect(module_sandbox.agent.exec(script))
    assert result.exit_code == 0, f"could not reset the shared sandbox: {result.stderr.data()!r}"
    return module_sandbox


@pytest.fixture(scope="session")
def destination():  # type: ignore[no-untyped-def]
    """Servers in a network namespace this test session owns (see tests/netdest.py): the
    only place network tests may send traffic to."""
    from tests.netdest import Destination

    if os.geteuid() != 0:
        unavailable("network tests need root (a network namespace and callbox's packet filter)")
    with Destination() as dest:
        yield dest


DEST_HOSTS = {"dest.callbox.test": "198.18.77.2", "api.callbox.test": "198.18.77.2"}
"""Names the egress proxy of ``net_engine`` resolves to the test destination."""


@pytest.fixture(scope="session")
def net_engine(engine, destination):  # type: ignore[no-untyped-def]
    """An engine whose egress proxies may reach the test destination's network, and only
    that private network (the documented test-only override)."""
    from harness.engine.docker.engine import DockerEngine

    return DockerEngine(engine.client, run_root=engine.run_root, reap_on_start=False,
                        egress_test_network=destination.network, egress_test_hosts=DEST_HOSTS)


@pytest.fixture
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets this process's local time zone (a ``TZ`` value such as ``UTC`` or ``CET-1``) for
    the test; the zone it had comes back after it."""

    def use(zone: str) -> None:
        monkeypatch.setenv("TZ", zone)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def utc_zone(local_zone: Callable[[str], None]) -> None:
    """Local time is UTC for the test (callbox shows moments in local time with their zone)."""
    local_zone("UTC")
