"""The MCP door: callbox's built-in tools as a Model Context Protocol server.

Built on the official ``mcp`` SDK's low-level ``Server`` (full control of ``inputSchema``,
``annotations`` and ``isError``). Three layers, so the transports know nothing about tools:

* tool logic, no MCP wire types (:mod:`harness.doors.mcp.service`):
  :class:`~harness.doors.mcp.service.McpToolService` holds the registry, the policy and the
  audit store shared by every session; an :class:`~harness.doors.mcp.service.McpSession` is
  one MCP session: a :class:`~harness.core.session.Session` (its own run in the audit store,
  the same validation, policy, approvals, budgets and at-most-once as every other door) and
  the sandbox that run starts lazily.
* protocol (:mod:`harness.doors.mcp.protocol`): ``tools/list`` and ``tools/call`` on a
  low-level ``Server``, mapping results to ``CallToolResult`` and output to progress
  notifications (:mod:`harness.doors.mcp.progress`).
* transports: :func:`run_mcp_stdio` (``callbox mcp``, :mod:`harness.doors.mcp.stdio`),
  :func:`serve_mcp_http` / :func:`run_mcp_http` (``callbox serve --mcp-http ADDR``,
  streamable HTTP on ``/mcp``, :mod:`harness.doors.mcp.http`).

This module is the door's entry point: it re-exports the transports' entry points.

Cancellation
    A call the client cancels (``notifications/cancelled``), or one still running when its
    session ends (the client closed stdin, sent ``DELETE`` or went idle; the server stops),
    has its agent RPCs cancelled (its :class:`~harness.engine.cancel.CallScope`, passed to
    ``Session.call``, the same mechanism as the gRPC door's cancelled ``CallTool``): the
    agent then kills the command's whole process tree (a ``bash`` call's shell with it,
    which the next ``bash`` call reports). The call ends with an error result
    in the audit log; a cancelled request gets no response, as the spec says.

Sessions and sandboxes
    One ``McpSession`` per MCP session, one sandbox per session, started by the first
    tool call that needs it (a rejected, denied or pending call starts none) and reused by
    later calls, so files written by one call are there for the next. It is destroyed when
    the session ends:

    * stdio: the server process is the session (one client per process, in either protocol
      era); it ends when stdin closes (the client's shutdown), or on SIGTERM/SIGINT.
    * streamable HTTP: a session is an ``Mcp-Session-Id`` (the ``initialize`` handshake,
      protocol versions up to 2025-11-25). It ends on the client's ``DELETE``, after
      ``idle_timeout_s`` (default 30 minutes) with no request in flight and no open GET
      stream, or when the server shuts down. The 2026-07-28 protocol has no sessions, so the
      HTTP server answers ``server/discover`` advertising only the handshake versions (SDK
      clients in ``auto`` mode then use the handshake), and refuses a 2026-07-28 request with
      ``-32022`` (unsupported protocol version) naming the versions it serves.

    With the policy's ``[pool]``, every session of the server shares one engine whose warm
    pool of the policy's ``[sandbox]`` spec fills from the server's start, so a session's
    first sandbox is a claim of a pre-started one (over stdio too: the pool fills while the
    client initializes); the pooled sandboxes go when the server stops.

    A call still running when its session ends is cut off: its processes are killed, the
    sandbox goes, and the call ends with an error result in the audit log. A server killed with SIGKILL leaves its
    sandboxes behind; ``callbox gc`` (and every engine start) reaps them, their owner being
    dead. A session that outlives the policy's ``sandbox.ttl_seconds`` may have its sandbox
    reaped as expired.

Errors
    Everything the model got wrong or may not do (invalid arguments, denied, over budget,
    non-zero exit, timed out, pending approval, ...) is a result with ``isError: true`` and
    readable text, recorded in the audit log. An unknown tool, or one the policy's
    ``allowed_tools`` does not expose (it is not in ``tools/list`` either), is the protocol
    error the MCP spec prescribes for unknown tools: JSON-RPC ``-32602`` (invalid params)
    with the message ``Unknown tool: NAME; the available tools are: ...``; the call is still
    recorded in the audit log. A call over one of its client's quotas (calls per minute, the
    session's sandbox over live sandboxes, CPUs, memory or sandboxes per hour, more calls at
    once than the client's share) is a result with ``isError: true`` naming the quota and when
    it frees up (``_meta``: ``callbox/error = limit_reached``, ``callbox/quota``,
    ``callbox/retry_after_s``); nothing ran, and it is not recorded.

Call ids and approvals
    MCP has no call id, so the server assigns one per call: ``mcp-000001``, ``mcp-000002``,
    ... within the session's run (see ``callbox audit --run RUN``). A call whose policy
    decision is ``ask`` returns an error result that names its approval id and says how to
    resolve it (``callbox approvals approve ID`` or ``deny ID``); the session remembers the
    pending call under (tool, canonical arguments). When the client sends exactly the same
    call again in the same session, it gets the same call id, so the harness resumes that
    call instead of asking again: still pending (the same approval id), denied (the
    denial, once), or approved (it runs, exactly once, even if resent concurrently). Once
    it has a final result the next identical call is a new call. A client that wants its
    own idempotency key can put ``"callbox/call_id": "ID"`` in the request's ``_meta``: a
    retry with the same id returns the recorded result instead of running again (unless
    that result is a failure from before the command started, such as an unreachable
    engine: then the retry runs it).

Progress
    When the request carries a ``progressToken``, ``notifications/progress`` follow while
    the tool runs: at most every 0.1 s while output arrives (``message`` is the new output
    text, at most 4 KiB of it), and every 5 s when there is none (a heartbeat: ``message``
    says how long it has run). ``progress`` is the seconds elapsed, strictly increasing;
    there is no ``total``. The server sends no log notifications (it does not declare the
    logging capability); its own logs go to stderr, so stdout stays clean for JSON-RPC.

``structuredContent`` (exit code, truncation, file metadata, ...) also holds the result's
text under ``"text"``: clients such as Pydantic AI's (FastMCP) hand the model the structured
content instead of the text blocks when there is some.

Results carry ``_meta`` with ``callbox/run_id``, ``callbox/call_id``, ``callbox/sandbox_id``
(once the session's sandbox exists), and for errors ``callbox/error`` (the error code) and,
when pending, ``callbox/approval_id``.
"""
