"""``e2b_code_interpreter`` (unmodified) on a ``callbox serve --e2b`` whose policy keeps a
code-interpreter sandbox ready (``[pool] code_interpreter = 1``): ``Sandbox.create()`` claims
the pooled one, whose server is already running before the first request, and its first
``run_code`` answers; one created with ``envs`` of its own has its kernel see them (the
pooled server, started with the template's env, is replaced). One server, two claims.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b_code_interpreter import Sandbox

from harness.engine.docker.pool import POOL_OWNER
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import VARIANTS, build_variant
from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

FILL_WAIT_S = 180.0
"""How long the test waits for the pool to hold its prepared sandbox (a container, the
server and its kernel, on a busy host)."""


def pooled(engine: Any, server: E2bServer) -> list[str]:
    """The sandboxes of the code-interpreter image held by ``server``'s warm pool, ready (their
    lifetime record is written once their server and kernel are up)."""
    image = VARIANTS["code-interpreter"].tag
    return [info.sandbox_id for info in engine.list_sandboxes(stats=False)
            if info.owner == POOL_OWNER and info.image == image and f"/{server.pid}/" in info.process]


def wait_pooled(engine: Any, server: E2bServer) -> None:
    deadline = time.monotonic() + FILL_WAIT_S
    while not pooled(engine, server):
        assert time.monotonic() < deadline, "the pool held no code-interpreter sandbox"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    with serve_e2b(engine, policy=policy_text("[pool]\ncode_interpreter = 1")) as served:
        wait_pooled(engine, served)
        yield served


def test_a_pooled_code_interpreter_sandbox_answers_its_first_run_code(server: E2bServer, engine: Any) -> None:
    wait_pooled(engine, server)
    with sdk_environment(server):
        sandbox = Sandbox.create(timeout=300)
        try:
            # The server was started by the pool, before any request of the claimer's.
            tags = [p.tag for p in sandbox.commands.list()]
            assert any(tag and tag.startswith("code-interpreter@") for tag in tags), tags
            first = sandbox.run_code("1+1")
            assert first.error is None, first.error
            assert first.text == "2"
            assert first.execution_count == 1  # the pool ran no cell of its own
            assert sandbox.run_code("import os; os.getcwd()").text == "'/home/user'"
        finally:
            sandbox.kill()
    assert "the warm pool" not in server.log()  # no warning of the pool's


def test_a_claim_with_envs_of_its_own_has_its_kernel_see_them(server: E2bServer, engine: Any) -> None:
    wait_pooled(engine, server)
    with sdk_environment(server):
        sandbox = Sandbox.create(timeout=300, envs={"GREETING": "from the claimer"})
        try:
            assert sandbox.run_code("import os; os.environ.get('GREETING')").text == "'from the claimer'"
        finally:
            sandbox.kill()
