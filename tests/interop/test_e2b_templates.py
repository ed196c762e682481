"""The e2b SDK's template builder, unmodified, against ``callbox serve --e2b``: built offline, cached, used.

A template is built from steps as E2B's docs show them (a file copied in, a command run, an
environment variable, a start command that serves HTTP with its ready check), then a sandbox
is made from it: the copied file is in its home, what the command made is in the image, the
start command serves HTTP, fetched through the door as a program written for E2B fetches it:
the host name ``get_host(port)`` returns, sent to the server with the sandbox's traffic access
token (the policy allows ``port_forward``). The second build of the same template comes
from the cache, and ``get_tags`` lists the current build under its tag; a base image that is
not on the host is refused naming it; ``AsyncTemplate`` builds too; a client does not see
another client's template, and sees the operator's.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import AsyncTemplate, Sandbox, Template, wait_for_url
from e2b.exceptions import BuildException, SandboxException

from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b
from tests.support.template_store import template_store

pytestmark = [pytest.mark.docker, pytest.mark.interop]

PORT = 8000
POLICY = policy_text('[actions.port_forward]\ndecision = "allow"\n')
"""The test image, and sandbox ports reachable through the door (``get_host``)."""
TRAFFIC = "e2b-traffic-access-token"


@pytest.fixture(scope="module", name="template_dir")
def template_dir_fixture(engine: Any) -> Iterator[Path]:
    """A template store of this module's own; the images its builds made are removed at the end."""
    with template_store(engine.client) as directory:
        yield directory


@pytest.fixture(scope="module", name="server")
def server_fixture(engine: Any, template_dir: Path) -> Iterator[E2bServer]:
    with serve_e2b(engine, policy=POLICY) as server:
        yield server


@pytest.fixture(name="context")
def context_fixture(tmp_path: Path) -> Path:
    """The template's directory: one file to copy, with content of this run's own."""
    (tmp_path / "hello.txt").write_text(f"hello from the template {secrets.token_hex(8)}\n")
    return tmp_path


def _template(context: Path) -> Any:
    return (
        Template(file_context_path=str(context))
        .from_base_image()
        .copy("hello.txt", "/home/user/")
        .run_cmd("mkdir -p /srv/site && cp /home/user/hello.txt /srv/site/index.html")
        .set_envs({"GREETING": "hi"})
        .set_start_cmd(f"cd /srv/site && python3 -m http.server {PORT}", wait_for_url(f"http://localhost:{PORT}/"))
    )


def test_a_template_built_from_steps_serves_http_and_its_second_build_is_cached(server: E2bServer,
                                                                                 context: Path) -> None:
    template = _template(context)
    expected = (context / "hello.txt").read_text()
    logs: list[str] = []
    with sdk_environment(server):
        info = Template.build(template, "web-demo", on_build_logs=lambda entry: logs.append(str(entry.message)))
        assert info.name == "web-demo"
        assert any("Step" in line for line in logs), logs
        assert Template.exists("web-demo")
        assert not Template.exists("no-such-template")

        tags = Template.get_tags("web-demo")
        assert [(tag.tag, tag.build_id) for tag in tags] == [("default", info.build_id)]

        again: list[str] = []
        tagged = Template.build(template, "web-demo:v2", on_build_logs=lambda entry: again.append(str(entry.message)))
        assert any(line.startswith("cached:") for line in again), again
        assert not any(line.startswith("Step ") for line in again), again
        # The current build is the second one, under the tag it was built with (Harbor finds its builds so).
        assert [(tag.tag, tag.build_id) for tag in Template.get_tags("web-demo")] == [("v2", tagged.build_id)]
        # A tag it was not built under names nothing, never silently the current build.
        assert Template.exists("web-demo:v2") and not Template.exists("web-demo:v1")
        with pytest.raises(SandboxException, match="template 'web-demo:v1' not found"):
            Sandbox.create("web-demo:v1")

        sandbox = Sandbox.create("web-demo")
        try:
            assert sandbox.files.read("/home/user/hello.txt") == expected
            served = httpx.get(f"{server.url}/index.html", timeout=30,
                               headers={"Host": sandbox.get_host(PORT), TRAFFIC: sandbox.traffic_access_token or ""})
            assert (served.status_code, served.text) == (200, expected)
            assert sandbox.commands.run("echo $GREETING").stdout.strip() == "hi"
        finally:
            sandbox.kill()


def test_a_base_image_not_on_the_host_is_refused_naming_it(server: E2bServer, context: Path) -> None:
    template = Template(file_context_path=str(context)).from_image("callbox-test/not-here:1").run_cmd("true")
    with sdk_environment(server), pytest.raises(BuildException, match=r"not-here:1.*not on this host"):
        Template.build(template, "missing-base")


def test_async_template_builds_and_other_clients_do_not_see_it(server: E2bServer, context: Path) -> None:
    template = (AsyncTemplate(file_context_path=str(context)).from_base_image()
                .run_cmd("echo built > /opt/built.txt"))
    logs: list[str] = []
    with sdk_environment(server):
        # The sizes a build asks are its sandboxes', within the policy's (1 CPU, 512 MiB here).
        asyncio.run(AsyncTemplate.build(template, "async-demo", cpu_count=4, memory_mb=256,
                                        on_build_logs=lambda entry: logs.append(str(entry.message))))
        assert asyncio.run(AsyncTemplate.exists("async-demo"))
        assert "cpu_count 4: this template's sandboxes get 1 CPU (the policy's sandbox.cpus is 1)" in logs, logs
        assert "memory_mb 256: this template's sandboxes get 256 MiB" in logs, logs
        sandbox = Sandbox.create("async-demo")
        try:
            info = sandbox.get_info()
            assert (info.cpu_count, info.memory_mb) == (1, 256)
            assert sandbox.commands.run("cat /opt/built.txt").stdout.strip() == "built"
        finally:
            sandbox.kill()
    with sdk_environment(server, "bob"):
        assert not Template.exists("async-demo")
