"""The console's live view of a desktop sandbox: noVNC in the page, a WebSocket to the console,
and from there a Ports tunnel of the sandbox's agent to its VNC server (x11vnc on the
sandbox's loopback, port :data:`~harness.engine.desktop.VNC_PORT`, started with the display). No sandbox network is
involved.

**View-only unless taken over.** What the viewer sends goes through an
:class:`~harness.doors.http.rfb.RfbInputFilter`: keyboard, pointer and clipboard reach the
sandbox only from a connection of the operator who holds the sandbox's control
(:class:`ControlDesk`), checked at each message, so giving control back (or another
operator taking it) stops that input at once. A client's connection never sends input.

**Audited.** Taking over and giving back are recorded in the sandbox's run, as the sandbox
actions are: a record of the tool ``sandbox.take_over`` or ``sandbox.give_back`` with the
call id ``action-<hex>``, ``actor`` ``console:NAME`` in its arguments, allowed by the rule
``console operator`` (not counted in the run's tool-call budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from harness.audit.records import ACTION_CALL_PREFIX, ACTION_TOOL_PREFIX
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ToolResult
from harness.core.errors import CallboxError
from harness.doors.http.rfb import RfbError, RfbInputFilter
from harness.engine.ports import Tunnel

__all__ = ["CONTROL_RULE", "GIVE_BACK", "TAKE_OVER", "ControlDesk", "Holder", "relay_vnc"]

log = logging.getLogger("callbox.http")

TAKE_OVER = "take_over"
GIVE_BACK = "give_back"
CONTROL_RULE = "console operator"
"""The rule named in the audit for a take-over: the console lets only operators take over."""
QUEUE_CHUNKS = 64
"""Chunks of the VNC server's output waiting for the browser before the tunnel's reader waits."""


@dataclass(frozen=True)
class Holder:
    """Who controls a sandbox's desktop: an operator's login (or bearer token) and its name."""

    key: str
    """The login session's id, or ``bearer:NAME`` for a script's token."""
    client: str
    since: float


class ControlDesk:
    """Which operator controls each sandbox's desktop, recording each change in the audit store."""

    def __init__(self, audit: AuditStore) -> None:
        self.audit = audit
        self._lock = threading.Lock()
        self._holders: dict[str, Holder] = {}

    def holder(self, sandbox_id: str) -> Holder | None:
        with self._lock:
            return self._holders.get(sandbox_id)

    def in_control(self, sandbox_id: str, key: str) -> bool:
        with self._lock:
            held = self._holders.get(sandbox_id)
        return held is not None and held.key == key

    def take(self, sandbox_id: str, *, key: str, client: str) -> str:
        """``client`` (an operator) takes the mouse and keyboard of ``sandbox_id``, from whoever
        held them; recorded. A sentence saying what was done."""
        with self._lock:
            before = self._holders.get(sandbox_id)
            self._holders[sandbox_id] = Holder(key, client, time.time())
        taken_from = f"console:{before.client}" if before is not None and before.key != key else None
        self._record(sandbox_id, TAKE_OVER, client, {"taken_from": taken_from} if taken_from else {})
        return (f"you control the mouse and keyboard of sandbox {sandbox_id}"
                f"{f' (taken from {taken_from})' if taken_from else ''}; "
                "give them back when you are done")

    def give_back(self, sandbox_id: str, *, key: str, client: str) -> str:
        """Give back control of ``sandbox_id`` (held by ``key``); recorded. A sentence."""
        with self._lock:
            held = self._holders.get(sandbox_id)
            if held is None or held.key != key:
                who = f"console:{held.client}" if held is not None else "nobody"
                return f"you do not control sandbox {sandbox_id} ({who} does): nothing to give back"
            del self._holders[sandbox_id]
        self._record(sandbox_id, GIVE_BACK, client, {"held_s": round(time.time() - held.since, 3)})
        return f"the live view of sandbox {sandbox_id} is view-only again"

    def forget(self, live: set[str]) -> None:
        """Drop the holders of sandboxes no longer live (their run ended with them)."""
        with self._lock:
            for gone in set(self._holders) - live:
                del self._holders[gone]

    def _record(self, sandbox_id: str, event: str, client: str, detail: dict[str, Any]) -> None:
        actor = f"console:{client}"
        call_id = f"{ACTION_CALL_PREFIX}{uuid.uuid4().hex}"
        tool = ACTION_TOOL_PREFIX + event
        decision = Decision(Action.ALLOW, CONTROL_RULE)
        self.audit.start_run(sandbox_id, {"kind": "sandbox"})
        self.audit.claim_call(sandbox_id, call_id, tool, {"actor": actor})
        self.audit.record_decision(sandbox_id, call_id, decision)
        text = f"{tool}: done"
        result = ToolResult(call_id=call_id, text=text, structured=detail or None,
                            meta={"decision": "allow", "rule": CONTROL_RULE, "actor": actor})
        self.audit.finish_call(sandbox_id, call_id, result, decision=decision, exit_code=None, duration_ms=0.0,
                               bytes_out=len(text), truncated=False)
        log.info("console: %s %s sandbox %s", actor, event.replace("_", " "), sandbox_id)


async def relay_vnc(websocket: WebSocket, tunnel: Tunnel, may_send_input: Callable[[], bool]) -> None:
    """Relay an accepted WebSocket and a tunnel to the VNC server until either side ends:
    the server's bytes as binary messages, the viewer's through the input filter."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_CHUNKS)

    ended = threading.Event()

    def hand_over(item: bytes | None) -> bool:
        """Queue ``item`` for the browser, waiting while the queue is full; False once the relay ended."""
        pending = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
        while not ended.is_set():
            with contextlib.suppress(TimeoutError):
                pending.result(timeout=0.5)
                return True
        pending.cancel()
        return False

    def read_tunnel() -> None:
        try:
            for data in tunnel.recv():
                if not hand_over(data):
                    return
        except (CallboxError, RuntimeError, asyncio.CancelledError) as error:
            log.debug("live view: the VNC tunnel ended: %s", error)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                hand_over(None)

    async def downstream() -> None:
        while (data := await queue.get()) is not None:
            await websocket.send_bytes(data)

    async def upstream() -> None:
        viewer = RfbInputFilter(may_send_input)
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is None:
                raise RfbError("the live view carries binary messages only")
            passed = viewer.feed(data)
            if passed:
                await asyncio.to_thread(tunnel.send, passed)

    reader = threading.Thread(target=read_tunnel, name="console-vnc", daemon=True)
    reader.start()
    tasks = [asyncio.ensure_future(downstream()), asyncio.ensure_future(upstream())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            error = task.exception()
            if isinstance(error, RfbError):
                log.warning("live view: a viewer's connection ended: %s", error)
                with contextlib.suppress(Exception):
                    await websocket.close(code=1008, reason=str(error)[:120])
            elif error is not None and not isinstance(error, (WebSocketDisconnect, BrokenPipeError, OSError)):
                raise error
    finally:
        ended.set()
        for task in tasks:
            task.cancel()
        tunnel.close()
        with contextlib.suppress(Exception):
            await websocket.close()
        await asyncio.to_thread(reader.join, 5.0)
