"""The HTTP endpoint of ``callbox serve`` (``[http] listen = "HOST:PORT"``, ``--http``):
Prometheus metrics, a health check, and the web console for operators.

* ``GET /metrics``: the Prometheus text of :mod:`harness.telemetry.metrics`. No token.
* ``GET /healthz``: 200 ``{"status": "ok"}`` when the Docker engine answers a ping, 503 with
  the reason when it does not. No token.
* ``/``: the console, server-rendered pages with no script and one local stylesheet
  (``/static/console.css``; nothing from another origin):

  - ``/``: calls waiting for approval, with the tool, its arguments, the rule that asked, the
    run (its door, its client, its earlier calls); approve, or deny with a reason the model
    reads;
  - ``/sandboxes``: the live sandboxes of the server's executor (the gRPC and E2B doors'),
    with owner, age, expiry, CPU and memory; a kill button;
  - ``/runs`` and ``/runs/RUN``: recent runs, and a run's calls in order with their results;
  - ``/egress``: what the egress proxies allowed and refused.

**Who may use the console.** The console is for the server's operators: any token of the
server's token file (the tokens of the gRPC and E2B doors) logs in, and every holder sees
every client's runs, approvals and sandboxes, and may approve, deny and kill. callbox has no
notion of an administrator client, so this is the one rule; give operators a line of their
own in the token file (for example ``operator:TOKEN``) rather than sharing an agent's token,
so what they do is recorded under their name (``console:operator``). A server whose agents'
tokens must not reach the console should not serve ``[http]`` on an address those agents can
reach. See :mod:`harness.doors.http.auth` for the login, the cookie and the cross-site rules.

Modules: :mod:`~harness.doors.http.server` (binding, TLS, the thread), :mod:`~.app` (routes),
:mod:`~.auth` (tokens, sessions, CSRF), :mod:`~.console` (what the pages show and the actions),
:mod:`~.pages` (the HTML).
"""

from harness.doors.http.server import HttpServer, serve_http

__all__ = ["HttpServer", "serve_http"]
