"""The unmodified e2b SDK's network options against ``callbox serve --e2b``: create with
``network`` rules and ``update_network`` on a server whose policy is an allowlist (its egress
proxies may reach the test destination of ``tests/netdest.py``, through the documented
test-only override), the SDK's default create (``allow_internet_access=True``) against the
default network ``none``, and ``sandbox.on_internet_request = "refuse"``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox, SandboxException

from tests.conftest import DEST_HOSTS
from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b
from tests.netdest import HTTP_PORT

pytestmark = [pytest.mark.docker, pytest.mark.interop, pytest.mark.netdest]

DEST = f"dest.callbox.test:{HTTP_PORT}"
API = f"api.callbox.test:{HTTP_PORT}"
ALLOWLIST_POLICY = policy_text(f'network = "allowlist"\nallow_hosts = ["*.callbox.test:{HTTP_PORT}"]')
CURL = "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://{}/ ; true"


@pytest.fixture(scope="module")
def allowlist_server(engine: Any, destination: Any) -> Iterator[E2bServer]:
    """A server whose policy allows ``*.callbox.test:8080``, its proxies reaching the destination."""
    saved = {k: os.environ.get(k) for k in ("CALLBOX_EGRESS_TEST_NETWORK", "CALLBOX_EGRESS_TEST_HOSTS")}
    os.environ["CALLBOX_EGRESS_TEST_NETWORK"] = destination.network
    os.environ["CALLBOX_EGRESS_TEST_HOSTS"] = ",".join(f"{name}={ip}" for name, ip in DEST_HOSTS.items())
    try:
        with serve_e2b(engine, policy=ALLOWLIST_POLICY) as server:
            yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def status(sandbox: Sandbox, host: str) -> str:
    return sandbox.commands.run(CURL.format(host)).stdout.strip()


def test_network_rules_at_create_and_update_network(allowlist_server: E2bServer) -> None:
    with sdk_environment(allowlist_server):
        sandbox = Sandbox.create(network={"allow_out": [DEST], "deny_out": ["0.0.0.0/0"]})
        try:
            assert status(sandbox, DEST) == "200"
            assert status(sandbox, API) == "403"
            info = sandbox.get_info()
            assert info.network == {"allow_out": [DEST], "deny_out": ["0.0.0.0/0"]} or \
                (info.network or {}).get("allow_out") == [DEST], info
            sandbox.update_network({"allow_out": [API], "deny_out": ["0.0.0.0/0"]})
            assert status(sandbox, API) == "200"  # the first request after the call returns
            assert status(sandbox, DEST) == "403"
            sandbox.update_network({"deny_out": ["dest.callbox.test"]})
            assert (status(sandbox, API), status(sandbox, DEST)) == ("200", "403")
            sandbox.update_network({})  # every rule cleared: all the policy's allowlist
            assert (status(sandbox, API), status(sandbox, DEST)) == ("200", "200")
            with pytest.raises(SandboxException, match="allowOut"):
                sandbox.update_network({"allow_out": ["*bad*"]})
        finally:
            sandbox.kill()


def test_the_sdks_default_create_gets_the_policys_network_and_says_so(allowlist_server: E2bServer) -> None:
    with sdk_environment(allowlist_server):
        sandbox = Sandbox.create(allow_internet_access=True)
        try:
            assert status(sandbox, DEST) == "200"  # what the policy gives, and no more
            info = sandbox.get_info()
            assert (info.network or {}).get("deny_out") == ["0.0.0.0/0"], info
        finally:
            sandbox.kill()
    assert "beyond this server's policy" in allowlist_server.log()


def test_default_config_grants_none_and_refuse_refuses(engine: Any) -> None:
    with serve_e2b(engine) as server, sdk_environment(server):
        # What older SDKs (2.45) send by default, and the Agents SDK's E2B client asks for.
        sandbox = Sandbox.create(allow_internet_access=True)
        try:
            raw = sandbox.get_info()
            assert raw.network == {"deny_out": ["0.0.0.0/0"]} or (raw.network or {}).get("deny_out") == [
                "0.0.0.0/0"], raw
            with pytest.raises(SandboxException, match="no network"):
                sandbox.update_network({"allow_out": ["example.com"]})
        finally:
            sandbox.kill()
        assert "network none" in server.log() and "gives sandboxes no network" in server.log()
    with serve_e2b(engine, policy=policy_text('on_internet_request = "refuse"')) as server, sdk_environment(server):
        with pytest.raises(SandboxException, match="on_internet_request"):
            Sandbox.create(allow_internet_access=True)
        Sandbox.create(allow_internet_access=False).kill()
