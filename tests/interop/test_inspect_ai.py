"""Inspect AI (``inspect-ai`` with ``inspect-sandboxes``' E2B provider) runs its evals on callbox.

Inspect needs Python >= 3.12, so it runs in a virtualenv of its own
(tests/interop/requirements/inspect-ai.txt) as a driver program,
tests/interop/inspect_ai_evals.py, written as Inspect's docs write an eval: tasks with
``sandbox="e2b"``, its ``mockllm/model`` scripted with ``ModelOutput.for_tool_call`` (no API
key). The program points at one ``callbox serve --e2b`` by E2B's three variables, under the
policy docs/use-from/inspect-ai.md gives Inspect's users. It runs two evals:

* ``sandbox="e2b"`` alone: ``python()`` and ``bash()`` (which runs as root, as
  inspect-sandboxes runs every command), and a scorer that reads the file bash wrote;
* a Dockerfile ``FROM`` the test image, built through the E2B template build API: Inspect
  copies its ``inspect-sandbox-tools`` into ``/var/tmp`` and starts their server, then
  ``text_editor()`` edits the file the image holds and ``bash_session()`` runs it; the
  scorer reads the edited file.

The eval logs' status, scores and each tool result the model received are checked. The
template's image is removed when the module ends (a template store of its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.interop.e2b_server import E2bServer, policy_text, serve_e2b
from tests.interop.harness_venvs import run_driver
from tests.support.template_store import template_store

pytestmark = [pytest.mark.interop, pytest.mark.docker, pytest.mark.inspect_ai]

HARNESS = "inspect-ai"
DRIVER = Path(__file__).with_name("inspect_ai_evals.py")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "use-from" / "inspect-ai.md"
POLICY = """\
root_commands = true         # inspect-sandboxes runs every command and file operation as root
memory = "1g"                # what Inspect asks of its templates (1024 MB)
scratch_dirs = ["/var/tmp"]  # Inspect copies its sandbox tools (32 MiB) there
"""
"""The ``[sandbox]`` keys the docs page tells Inspect's users to set (the test adds the image)."""
APP = "/home/user/app/greet.py"
DRIVER_TIMEOUT_S = 300


@pytest.fixture(scope="module", name="server")
def server_fixture(engine: Any) -> Iterator[E2bServer]:
    with template_store(engine.client, prefix="cbx-tpl-inspect-"), \
            serve_e2b(engine, policy=policy_text(POLICY)) as server:
        yield server


def test_inspect_evals_run_on_callbox_sandboxes(server: E2bServer, tmp_path: Path) -> None:
    context = tmp_path / "greeting"
    context.mkdir()
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(f"FROM {IMAGE}\n"
                          f"RUN mkdir -p /home/user/app && printf 'print(\"hello\")\\n' > {APP}\n")
    report = run_driver(HARNESS, DRIVER, [str(tmp_path / "logs"), str(dockerfile)], env=server.child_env(),
                        timeout=DRIVER_TIMEOUT_S)
    hello, greeting = report["hello_e2b"], report["fix_greeting"]
    log = server.log()

    assert hello["status"] == "success", f"{HARNESS}: the sandbox=\"e2b\" eval failed: {hello['error']}\n{log}"
    assert hello["accuracy"] == 1.0 and hello["score"] == {"file_holds": ["C", "42\n"]}, hello
    assert [(r["tool"], r["text"], r["error"]) for r in hello["tool_results"]] == [
        ("python", "42\n", None), ("bash", "root\n", None)]

    assert greeting["status"] == "success", f"{HARNESS}: the Dockerfile eval failed: {greeting['error']}\n{log}"
    assert greeting["accuracy"] == 1.0 and greeting["score"] == {"file_holds": ["C", 'print("bonjour")\n']}
    (editor, session) = greeting["tool_results"]
    assert (editor["tool"], editor["error"]) == ("text_editor", None), editor
    assert f"The file {APP} has been edited" in editor["text"] and '1\tprint("bonjour")' in editor["text"]
    assert (session["tool"], session["error"]) == ("bash_session", None), session
    assert "user@sandbox:/home/user$ bonjour\n" in session["text"], session  # its server outlived its start


def test_the_docs_page_gives_the_tested_policy() -> None:
    page = DOCS.read_text()
    assert f"```toml\n[sandbox]\n{POLICY}```" in page, f"{DOCS.name} must show the policy this module serves with"
