"""The desktop of a sandbox of the desktop image variant, seen from the host.

The image's one implementation of the desktop (``/opt/callbox/desktop/computer.py``) starts its
display stack (Xvfb, openbox, Chromium) with the action ``start_display``. It is run here as a
sandbox job that leaves its processes running (a command's processes end with the command), and
waited for: the display is up when the job ends with exit 0. The ``computer`` tool starts it on
the first action that finds it down; a warm pool starts it before a sandbox is pooled
(:func:`pool_prepare`), and waits for Chromium's window too, so a claimer's first screenshot
does not wait for Xvfb or compete with Chromium's start (about a second of CPU on its own).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from harness.core.errors import AgentCallError, CallboxError
from harness.engine.agent_client import AgentClient
from harness.engine.base import LivingSandbox
from harness.engine.exec_result import collect
from harness.engine.jobs import JobChunk, JobEnded

__all__ = ["DESKTOP_IMAGE", "DESKTOP_SCRIPT", "DISPLAY_JOB_TAG", "DISPLAY_START_TIMEOUT_S", "VNC_PORT",
           "has_desktop", "pool_prepare", "start_display"]

DESKTOP_SCRIPT = "/opt/callbox/desktop/computer.py"
DESKTOP_IMAGE = "callbox-sandbox-desktop:latest"
DISPLAY_JOB_TAG = "callbox-desktop-display"
VNC_PORT = 5900
"""Where the desktop's x11vnc listens, on the sandbox's loopback (started with the display)."""
DISPLAY_START_TIMEOUT_S = 30.0
BROWSER_WINDOW_TIMEOUT_S = 30.0


def has_desktop(agent: AgentClient) -> bool:
    """Whether the sandbox's image has the desktop (its script is there; asked with ``test -f``)."""
    try:
        return collect(agent.exec_buffered(["test", "-f", DESKTOP_SCRIPT], timeout_ms=10_000)).exit_code == 0
    except AgentCallError as error:
        if error.reason == "SPAWN_FAILED":  # an image without even `test` has no desktop either
            return False
        raise


def start_display(agent: AgentClient, env: Mapping[str, str] | None = None,
                  argv: Sequence[str] | None = None) -> str | None:
    """Start the desktop's display as a job whose processes outlive it (a no-op when it is up
    already; ``argv``: another command of the image that starts it, such as the browser's, which
    also starts Chromium when the display runs without it); None once it answers, else why not."""
    argv = list(argv or ["python3", "-I", DESKTOP_SCRIPT, json.dumps({"action": "start_display"})])
    try:
        info = agent.jobs.start(argv, tag=DISPLAY_JOB_TAG, keep_leftovers=True, env=dict(env or {}))
        output = bytearray()
        for event in agent.jobs.attach(info.pid, follow=True, timeout=DISPLAY_START_TIMEOUT_S):
            if isinstance(event, JobChunk):
                output.extend(event.data)
            elif isinstance(event, JobEnded):
                if event.info.exit_code == 0:
                    return None
                return output.decode("utf-8", errors="replace").strip()[-500:] or f"exit {event.info.exit_code}"
    except AgentCallError as error:
        return error.message
    return "the display's start did not finish"


def pool_prepare(box: LivingSandbox) -> None:
    """A warm pool's ``prepare`` for any spec: in a sandbox whose image has the desktop, start its
    display before the sandbox is pooled (other images: nothing, one ``test -f``)."""
    if not has_desktop(box.agent):
        return
    problem = start_display(box.agent, box.spec.env)
    if problem is not None:
        raise CallboxError(f"the desktop's display did not start in a pooled sandbox: {problem}")
    window = collect(box.agent.exec_buffered(["xdotool", "search", "--sync", "--onlyvisible", "--class", "chromium"],
                                             env={"DISPLAY": ":1"}, timeout_ms=int(BROWSER_WINDOW_TIMEOUT_S * 1000)))
    if window.exit_code != 0:
        raise CallboxError(f"Chromium's window did not show within {BROWSER_WINDOW_TIMEOUT_S:g} s in a pooled "
                           f"desktop sandbox: {window.stderr.data().decode('utf-8', 'replace').strip()[-300:]}")
