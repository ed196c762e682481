"""The E2B JavaScript SDK (``e2b`` from npm, unmodified, the version pinned in
scripts/npm-tools/package-lock.json, installed under .cache/npm with Node 22 by
scripts/setup-npm-tools.sh, which ``make test`` runs) runs the docs' example against
``callbox serve --e2b``.

The SDK speaks the Connect protocol with JSON (``useBinaryFormat: false``) through Node's
``fetch``, over HTTP/1.1 for ``http://`` URLs: what the door serves. It finds the server by
``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY``, as the Python SDK does. Without the
installed tools the test skips with the reason (fails under CI=true).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.interop.conftest import ROOT
from tests.interop.e2b_server import E2bServer, e2b_server_fixture  # noqa: F401 - the module's server

pytestmark = [pytest.mark.interop, pytest.mark.docker]

NPM = ROOT / ".cache" / "npm"
EXAMPLE = Path(__file__).with_name("e2b_example.mjs")
TIMEOUT_S = 120


def test_the_js_sdk_runs_the_docs_example(e2b_server: E2bServer) -> None:
    node = NPM / "node_modules" / ".bin" / "node"
    if not (node.exists() and (NPM / "node_modules" / "e2b" / "package.json").exists()):
        unavailable("the E2B JavaScript SDK is not installed under .cache/npm (run scripts/setup-npm-tools.sh or "
                    "`make test`; it needs npm)")
    # Node resolves `import ... from 'e2b'` from the script's directory up: run a copy under .cache/npm.
    directory = Path(tempfile.mkdtemp(prefix="e2b-js-", dir=NPM))
    try:
        script = directory / EXAMPLE.name
        shutil.copyfile(EXAMPLE, script)
        done = subprocess.run([str(node), str(script)], env=e2b_server.child_env(), capture_output=True, text=True,
                              cwd=directory, timeout=TIMEOUT_S, check=False)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nserver:\n{e2b_server.log()}"
    assert done.stdout.splitlines() == [
        "Hello from Linux",
        "Hello, file!",
        "/home/user",
        "13 bytes",
        "listed: true",
        "killed: true",
    ], done.stdout
