"""The door against several ``e2b`` SDK versions, each unmodified in its own cached virtualenv
(:mod:`tests.interop.e2b_versions`): the oldest measured, the one whose defaults differ, and
the pinned one. The whole matrix runs by hand (``python -m tests.interop.e2b_versions``) and
is recorded in docs/doors/e2b.md.

SDKs before 2.51 send ``allow_internet_access=true`` by default, which the default server
grants as the policy's network: their default create must succeed too.
"""

from __future__ import annotations

import pytest

from tests.interop.e2b_conformance import FALLBACK, STEPS
from tests.interop.e2b_server import E2bServer, e2b_server_fixture  # noqa: F401 - the module's server
from tests.interop.e2b_versions import SUITE_VERSIONS, python_for, run_program

pytestmark = [pytest.mark.interop, pytest.mark.docker]


@pytest.mark.parametrize("version", SUITE_VERSIONS)
def test_an_sdk_version_runs_the_conformance_program(version: str, e2b_server: E2bServer) -> None:
    report = run_program(python_for(version), e2b_server.child_env())
    results = report["results"]
    assert report["version"] == version
    assert FALLBACK not in results, results  # the default create was not refused
    assert results == dict.fromkeys(STEPS, "ok"), results
