"""A paused E2B sandbox survives a restart of ``callbox serve --e2b`` (``[service]
keep_sandboxes``, as a service runs it), as the ``e2b`` SDK (unmodified) sees it.

Two sandboxes with ``lifecycle.on_timeout = "pause"``, one also ``auto_resume``, are paused
(``Sandbox.pause()``) with a file each; the server stops and a new one starts on the same
address and audit store. Both are still paused there; the auto-resume one resumes on the
next command of the ``Sandbox`` object made before the restart, the other stays paused until
``Sandbox.connect(id)`` resumes it, and each has its file. A running sandbox of the code
interpreter's template (``code-interpreter-v1``, the door's own) is adopted too.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from e2b import Sandbox, SandboxState

from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from tests.interop.e2b_server import keeping, owned_containers, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

NOTE = "/home/user/note.txt"
PAUSE_ON_TIMEOUT: Any = {"on_timeout": "pause"}
AUTO_RESUME: Any = {"on_timeout": "pause", "auto_resume": True}
GONE_WAIT_S = 60.0


def state_of(sandbox_id: str) -> SandboxState:
    return Sandbox.get_info(sandbox_id).state


def test_paused_sandboxes_survive_a_restart_and_resume(engine: Any) -> None:
    suite = f"e2b-paused-restart-{uuid.uuid4().hex[:8]}"
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    with keeping() as first:
        restart_args = ("--config", str(first.directory / "callbox.toml"))
        first_pid = first.pid
        try:
            with sdk_environment(first):
                paused = Sandbox.create(timeout=600, lifecycle=PAUSE_ON_TIMEOUT, metadata={"suite": suite})
                auto = Sandbox.create(timeout=600, lifecycle=AUTO_RESUME, metadata={"suite": suite})
                paused.files.write(NOTE, "paused, then connected\n")
                auto.files.write(NOTE, "paused, then resumed by a command\n")
                interpreter = Sandbox.create("code-interpreter-v1", timeout=600, metadata={"suite": suite})
                assert paused.pause() is True
                assert auto.pause() is True
                assert state_of(paused.sandbox_id) == state_of(auto.sandbox_id) == SandboxState.PAUSED
            first.served.stop()
            assert first.served.proc.returncode == 0, first.log()
            assert len(owned_containers(engine, first_pid)) == 3, first.log()  # kept between the servers

            with serve_e2b(engine, after=first, args=restart_args) as second, sdk_environment(second):
                assert state_of(paused.sandbox_id) == SandboxState.PAUSED, second.log()
                assert state_of(auto.sandbox_id) == SandboxState.PAUSED, second.log()
                assert Sandbox.get_info(auto.sandbox_id).lifecycle == AUTO_RESUME

                # auto_resume: the next command of the object made before the restart resumes it
                ran = auto.commands.run(f"cat {NOTE}")
                assert ran.exit_code == 0 and ran.stdout == "paused, then resumed by a command\n"
                assert state_of(auto.sandbox_id) == SandboxState.RUNNING
                assert state_of(paused.sandbox_id) == SandboxState.PAUSED  # untouched by the other's resume

                # without auto_resume: connect resumes it
                again = Sandbox.connect(paused.sandbox_id)
                assert state_of(paused.sandbox_id) == SandboxState.RUNNING
                assert again.files.read(NOTE) == "paused, then connected\n"
                assert again.commands.run("echo resumed").stdout == "resumed\n"
                assert Sandbox.get_info(paused.sandbox_id).lifecycle == {**PAUSE_ON_TIMEOUT, "auto_resume": False}

                # the code interpreter's template is there before the sandboxes are adopted
                assert Sandbox.connect(interpreter.sandbox_id).get_info().template_id == "code-interpreter-v1"

                assert Sandbox.kill(interpreter.sandbox_id) is True
                assert Sandbox.kill(paused.sandbox_id) is True
                assert Sandbox.kill(auto.sandbox_id) is True
                deadline = time.monotonic() + GONE_WAIT_S
                while owned_containers(engine, first_pid):
                    assert time.monotonic() < deadline, "the killed sandboxes' containers stayed"
                    time.sleep(0.1)
        finally:
            first.served.stop()
            for container in owned_containers(engine, first_pid):  # a failed run's leftovers
                with contextlib.suppress(Exception):
                    engine.client.api.remove_container(container, force=True)
