"""The HTTP endpoint of ``callbox serve`` (``[http] listen = "HOST:PORT"``, ``--http``):
Prometheus metrics, a health check, and the web console for operators.

* ``GET /metrics``: the Prometheus text of :mod:`harness.telemetry.metrics`. No token.
* ``GET /healthz``: 200 ``{"status": "ok"}`` when the Docker engine answers a ping, 503 with
  the reason when it does not. No token.
* ``/``: the console, server-rendered pages with no script (but the live view's) and one
  local stylesheet (``/static/console.css``; nothing from another origin):

  - ``/overview``: the approvals waiting, the live sandboxes and the warm pool, and the last
    hour in SVG charts drawn on the server (:mod:`~.overview`); it reloads itself;
  - ``/``: calls waiting for approval, with the tool, its arguments, the rule that asked, the
    run (its door, its client, its earlier calls); approve, or deny with a reason the model
    reads; every page counts the approvals waiting in its navigation;
  - ``/history``: the resolved approvals, who resolved them, when, and why;
  - ``/sandboxes``: the live sandboxes of the server's executor (the gRPC and E2B doors'),
    with owner, age, expiry, paused time, CPU, memory and processes; the warm pool; each
    client's quota use; a kill, confirmed on ``/sandboxes/ID/kill`` first;
  - ``/sandboxes/ID/view``: a desktop sandbox's screen, live (noVNC, the page's one script),
    view-only unless an operator takes over (:mod:`~.live_view`);
  - ``/runs`` and ``/runs/RUN``: runs, and a run's calls, one row each, opening to the whole call;
    with change records, what each call changed and an operator's revert to just before it
    (:mod:`~.console_undo`, :mod:`~.undo_pages`);
  - ``/egress``: what the egress proxies allowed and refused.

  Runs, the history and the egress log are filtered by a ``GET`` form (client, tool, state,
  decision, host) and paged, 100 rows a page (:mod:`~.browse_pages`).

**Who may use the console.** Any token of the server's token file logs in; its role (see
:mod:`harness.doors.grpc.tokens`) says what it sees. An **operator** sees every client's
runs, approvals, sandboxes and egress, and approves, denies, kills and reverts (recorded as
``console:NAME``). A **client** sees its own runs, approvals, sandboxes and egress, read-only:
every action, resolving an approval of its own calls included, is 403 for it, by the form or
by a bearer ``POST``, so an approval always means a person; it watches its own desktop
sandboxes' live view but cannot take over. See :mod:`harness.doors.http.auth`
for the login, the cookie and the cross-site rules.

Modules: :mod:`~harness.doors.http.server` (binding, TLS, the thread), :mod:`~.app` (routes),
:mod:`~.auth` (tokens, sessions, CSRF), :mod:`~.console` (what the pages show and the actions),
:mod:`~.pages` (the frame, approvals, a run), :mod:`~.browse_pages` (the paged lists),
:mod:`~.sandbox_pages` (sandboxes, the kill's confirmation, the live view's page), :mod:`~.overview` and
:mod:`~.charts` (the overview's SVG), :mod:`~.live_view` (the live view's WebSocket relay and
take-over), :mod:`~.rfb` (what a viewer may send), :mod:`~.novnc_files` (noVNC from the image),
:mod:`~.console_undo` and :mod:`~.undo_pages` (a run's changes and their revert).
"""

from harness.doors.http.server import HttpServer, serve_http

__all__ = ["HttpServer", "serve_http"]
