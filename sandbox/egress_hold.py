"""Holding a connection to an ``ask`` destination until a person answers (egress proxy side).

Standard library only, like ``sandbox/egress.py``, which calls :meth:`Holds.ask` when the
first allowlist entry naming a destination is an ``ask`` entry. The channel to the harness
is the proxy's directory (mounted from the host; the harness writes, the proxy reads):

1. the proxy appends a ``hold`` line to its JSON log (the one the harness reads)::

       {"ts": 1.0, "event": "hold", "sandbox_id": "...", "hold": "h3f9...", "method": "CONNECT",
        "host": "api.example.com", "port": 443, "client": "10.0.0.2", "timeout_s": 120.0}

2. the harness, which watches that log while a call runs, creates an approval and, once a
   person (or the clock) answers, writes ``answer-<hold>.json`` into the directory::

       {"decision": "allow" | "deny", "approval": "k3m...", "by": "cli:alice", "scope": "once" | "sandbox" |
        "timeout", "reason": null | "..."}

   and, for an answer that holds for the whole sandbox, first adds the destination to
   ``approved.json`` (``{"allow": ["api.example.com:443", ...]}``), which every later ask
   reads first, so later connections go through without a hold;

3. the proxy takes the answer (and removes the file), logs an ``answer`` line and lets the
   connection proceed or refuses it (403, naming the approval and the decision).

No answer within ``timeout_s`` (the policy's ``ask_timeout``): the harness refuses it,
naming the approval (earlier when the call it came during ends first). The proxy's own clock
is the fallback when no harness answers (no call was running): it refuses a little later
(:data:`GRACE_SHARE` of the timeout, at most ``GRACE_MAX_S``), so the harness's refusal,
which is audited, is normally the one given. A client that closes its connection
while it waits ends the hold (``abandoned``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

__all__ = ["ANSWER_PREFIX", "APPROVED_FILE", "Answer", "Holds", "answer_path"]

APPROVED_FILE = "approved.json"
ANSWER_PREFIX = "answer-"
_HOLD_ID = re.compile(r"h[0-9a-f]{16}")

LogSink = Callable[[dict[str, object]], None]
GRACE_SHARE = 0.1
GRACE_MAX_S = 2.0


def answer_path(directory: str, hold: str) -> str:
    """Where the harness writes the answer to ``hold`` (a hold id the proxy made)."""
    if not _HOLD_ID.fullmatch(hold):
        raise ValueError(f"not a hold id: {hold!r}")
    return os.path.join(directory, f"{ANSWER_PREFIX}{hold}.json")


@dataclass(frozen=True)
class Answer:
    """What became of a held connection: ``refusal`` is None when it may proceed, else the
    text of its 403; ``note`` says who let it through (for the proxy's decision line)."""

    refusal: str | None
    note: str | None = None


class Holds:
    """The proxy's held connections. ``directory`` None: nobody can answer, so every ask is
    refused at once (said in the refusal)."""

    def __init__(self, directory: str | None, log: LogSink, sandbox_id: str, timeout: float,
                 poll_s: float = 0.01) -> None:
        self.directory, self.log, self.sandbox_id = directory, log, sandbox_id
        self.timeout, self.poll_s = timeout, poll_s

    def approved(self, host: str, port: int) -> bool:
        """Whether a person allowed ``host:port`` for the whole sandbox (``approved.json``)."""
        if self.directory is None:
            return False
        try:
            with open(os.path.join(self.directory, APPROVED_FILE), encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return False
        listed = data.get("allow") if isinstance(data, dict) else None
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return isinstance(listed, list) and target in listed

    def ask(self, conn: socket.socket, method: str, host: str, port: int, client: str) -> Answer:
        """Hold the connection ``conn`` (to ``host:port``) until an answer, the timeout or the
        client's going; whether it may proceed."""
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.approved(host, port):
            return Answer(None, "allowed for this sandbox by a person's earlier answer")
        if self.directory is None:
            return Answer("an ask entry names it, but this proxy has no one to ask (no rules directory)")
        hold = "h" + secrets.token_hex(8)
        base = {"sandbox_id": self.sandbox_id, "hold": hold, "method": method, "host": host, "port": port,
                "client": client}
        self.log({"ts": time.time(), "event": "hold", **base, "timeout_s": self.timeout})
        path = answer_path(self.directory, hold)
        deadline = time.monotonic() + self.timeout + min(GRACE_MAX_S, self.timeout * GRACE_SHARE)
        watch_client = True
        while True:
            answer = _read_answer(path)
            if answer is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                answer = {"decision": "deny", "scope": "timeout", "approval": None, "by": "callbox",
                          "reason": f"no answer within {self.timeout:g} s"}
                break
            wait = min(self.poll_s, left)
            if watch_client and _client_gone(conn, wait):
                answer = {"decision": "deny", "scope": "abandoned", "approval": None, "by": "client",
                          "reason": "the client closed its connection while it waited"}
                break
            if not watch_client:
                time.sleep(wait)
            watch_client = watch_client and not _client_sent(conn)
        self.log({"ts": time.time(), "event": "answer", **base, **{k: answer.get(k) for k in
                                                                 ("decision", "scope", "approval", "by", "reason")}})
        approval = f"approval {answer.get('approval')}" if answer.get("approval") else "no approval"
        who = answer.get("by") or "?"
        why = f": {answer['reason']}" if answer.get("reason") else ""
        if answer.get("decision") == "allow":
            scope = "for this sandbox" if answer.get("scope") == "sandbox" else "once"
            return Answer(None, f"{approval}: allowed {scope} by {who}")
        return Answer(f"{approval}: {target} denied by {who}{why}")


def _read_answer(path: str) -> dict[str, object] | None:
    """The answer in ``path`` (then removed), or None while there is none. An answer the
    proxy cannot read or parse refuses (fail closed)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"decision": "deny", "by": "callbox", "reason": f"the answer could not be read ({exc})"}
    with suppress(OSError):
        os.unlink(path)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("decision") not in ("allow", "deny"):
        return {"decision": "deny", "by": "callbox", "reason": "the answer was malformed"}
    return data


def _client_gone(conn: socket.socket, wait: float) -> bool:
    """Wait up to ``wait`` seconds; whether the client closed its side meanwhile."""
    try:
        readable, _, _ = select.select([conn], [], [], wait)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _client_sent(conn: socket.socket) -> bool:
    """Whether bytes wait to be read (a request body): then the socket stays readable, and
    the hold sleeps instead of watching it."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (OSError, ValueError):
        return False
