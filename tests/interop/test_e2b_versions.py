"""The door against several ``e2b`` SDK versions, each unmodified in its own cached virtualenv
(:mod:`tests.interop.e2b_versions`): the oldest measured, the OpenAI Agents SDK's pin, and the
pinned one. The whole matrix runs by hand (``python -m tests.interop.e2b_versions``) and is
recorded in docs/doors/e2b.md.

SDKs before 2.51 send ``allow_internet_access=true`` by default, which the default server
grants as the policy's network: their default create must succeed too.

``e2b_code_interpreter`` before 2.10.4 reaches its kernel only at ``https://49999-ID.DOMAIN``
(``get_host``), whatever ``E2B_SANDBOX_URL`` says: on a server without a sandbox domain the
Agents SDK's pin must fail in the client, before anything is sent, never reach elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from tests.interop.e2b_conformance import FALLBACK, INTERPRETER_STEPS, STEPS
from tests.interop.e2b_server import E2bServer, e2b_server_fixture  # noqa: F401 - the module's server
from tests.interop.e2b_versions import AGENTS_SDK_PINS, SUITE_VERSIONS, python_for, run_program

pytestmark = [pytest.mark.interop, pytest.mark.docker]


@pytest.mark.parametrize("version", SUITE_VERSIONS)
def test_an_sdk_version_runs_the_conformance_program(version: str, e2b_server: E2bServer) -> None:
    report = run_program(python_for(version), e2b_server.child_env())
    results = report["results"]
    assert report["version"] == version
    assert FALLBACK not in results, results  # the default create was not refused
    assert results == dict.fromkeys(STEPS, "ok"), results


def test_an_old_code_interpreter_fails_in_the_client_without_a_sandbox_domain(engine: Any,
                                                                              e2b_server: E2bServer) -> None:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    e2b, interpreter = AGENTS_SDK_PINS
    report = run_program(python_for(e2b, interpreter), e2b_server.child_env(), interpreter=True)
    results = report["results"]
    assert (report["version"], report["code_interpreter"]) == AGENTS_SDK_PINS
    assert (results["create"], results["kill"]) == ("ok", "ok"), results
    for step in INTERPRETER_STEPS[1:-1]:  # the .invalid domain's too-long label: refused before any lookup
        assert results[step].startswith("UnicodeError") and "idna" in results[step], results
