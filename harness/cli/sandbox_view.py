"""``callbox sandbox view ID``: the console's URL of a server's desktop sandbox's live view.

The live view is the console's (``callbox serve --http``): noVNC drawing the sandbox's
desktop, view-only unless an operator takes over (:mod:`harness.doors.http.live_view`). This
verb finds the sandbox on the engine, checks that it has a desktop whose VNC server answers
(the one check the console makes too), and prints
``CONSOLE/sandboxes/RUN/view``, where RUN is the sandbox's E2B or gRPC id: the console lists
the sandboxes of its server's doors by that id. ``--open`` also opens it in a browser. The
console's address is ``--console``, else ``$CALLBOX_CONSOLE_URL``, else
``http://127.0.0.1:9464`` (the ``[http] listen`` of the example server configuration).
"""

from __future__ import annotations

import argparse
import os
import webbrowser
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

from harness.cli.sandbox_common import connect, opened, print_json, run_of
from harness.core.errors import CallboxError, ErrorCode, UsageError

DEFAULT_CONSOLE = "http://127.0.0.1:9464"
CONSOLE_ENV = "CALLBOX_CONSOLE_URL"


def add_verbs(verbs: Any) -> None:
    view = verbs.add_parser("view", help="print the console's URL of a desktop sandbox's live view")
    view.add_argument("name", help="a server's sandbox: its E2B or gRPC id, its container's id or name")
    view.add_argument("--console", metavar="URL", default=None,
                      help=f"the console's base URL (default ${CONSOLE_ENV}, else {DEFAULT_CONSOLE})")
    view.add_argument("--open", action="store_true", help="also open the URL in a browser")
    view.add_argument("--json", action="store_true", help="print {sandbox, sandbox_id, run_id, url}")


def _console_base(given: str | None) -> str:
    base = (given or os.environ.get(CONSOLE_ENV) or DEFAULT_CONSOLE).rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"the console's URL {base!r} is not an http(s) URL such as {DEFAULT_CONSOLE}")
    return base


def _view(args: argparse.Namespace) -> int:
    from harness.core.errors import AgentCallError
    from harness.engine.desktop import VNC_PORT

    base = _console_base(args.console)
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        run_id = run_of(sandbox)
        if run_id == sandbox.id:
            raise CallboxError(f"sandbox {sandbox.label} is not a server's sandbox: the console shows the live "
                               "sandboxes of `callbox serve`'s gRPC and E2B doors (create it through one of them)",
                               code=ErrorCode.NOT_SUPPORTED)
        try:
            sandbox.agent.ports.connect(VNC_PORT).close()
        except AgentCallError as error:
            if error.reason != "CONNECTION_REFUSED":
                raise
            raise CallboxError(f"sandbox {sandbox.label} has no desktop to view: nothing listens on its VNC port "
                               f"{VNC_PORT} (its image is not the desktop image, callbox-sandbox-desktop, or its "
                               "display has not started: it starts with the first computer call)",
                               code=ErrorCode.NOT_SUPPORTED) from None
        url = f"{base}/sandboxes/{quote(run_id, safe='')}/view"
        if args.json:
            print_json({"sandbox": sandbox.label, "sandbox_id": sandbox.id, "run_id": run_id, "url": url})
        else:
            print(url)
    if args.open:
        webbrowser.open(url)
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"view": _view}
