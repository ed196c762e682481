"""The Sandboxes service's messages and streams: engine objects as harness.v1 messages, and the
relays between a client's RPC and the agent's.

Every relay ends the agent's side when the client's RPC ends (cancelled, deadline passed, or
done), so no agent stream or thread outlives it:

* server-streamed relays (:func:`scoped`) pull the agent's stream inside a
  :class:`~harness.engine.cancel.CallScope` that the RPC's end cancels (the agent channel
  records the streams it opens in the current scope);
* a tunnel (:class:`PortPump`) and a terminal (:class:`TerminalPump`) read the client's
  requests in a thread of their own, which ends with the client's request stream (a
  cancelled RPC's request iterator raises);
* the RPC's end closes the tunnel or terminal. Callbacks of ``context.add_callback`` run on
  the server's polling thread, so they only cancel (never wait): a terminal is detached in a
  short-lived thread, since its ``close`` lets the agent finish the input first.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TypeVar

import grpc

from harness.engine.cancel import CallScope, current_scope
from harness.engine.jobs import JobChunk, JobEnded, JobEvent, JobGap, JobInfo, JobLive, Terminal
from harness.engine.ports import Tunnel
from harness.v1 import sandboxes_pb2

__all__ = ["PortPump", "TerminalPump", "event_message", "process_message", "scoped"]

log = logging.getLogger("callbox.executor")

_T = TypeVar("_T")


def process_message(info: JobInfo) -> sandboxes_pb2.ProcessInfo:
    message = sandboxes_pb2.ProcessInfo(
        pid=info.pid, tag=info.tag, command=info.command, state=info.state, signal=info.signal, pty=info.pty,
        started_unix=info.started_at, duration_s=info.duration_s, next_seq=info.next_seq,
        output_bytes=info.output_bytes, dropped_bytes=info.dropped_bytes, oom_killed=info.oom_killed,
    )
    if info.exit_code is not None:
        message.exit_code = info.exit_code
    return message


def event_message(event: JobEvent) -> sandboxes_pb2.ProcessEvent:
    if isinstance(event, JobChunk):
        output = sandboxes_pb2.ProcessOutput(seq=event.seq)
        if event.stream == "stderr":
            output.stderr = event.data
        else:
            output.stdout = event.data
        return sandboxes_pb2.ProcessEvent(output=output)
    if isinstance(event, JobGap):
        return sandboxes_pb2.ProcessEvent(gap=sandboxes_pb2.ProcessGap(
            first_seq=event.first_seq, end_seq=event.end_seq, dropped_bytes=event.dropped_bytes))
    if isinstance(event, JobLive):
        return sandboxes_pb2.ProcessEvent(live=process_message(event.info))
    assert isinstance(event, JobEnded)
    return sandboxes_pb2.ProcessEvent(exited=process_message(event.info))


def scoped(items: Iterator[_T], context: grpc.ServicerContext) -> Iterator[_T]:
    """``items`` (an iterator over an agent stream, opened on its first ``next``), whose agent
    streams the end of the RPC cancels."""
    scope = CallScope()
    context.add_callback(scope.cancel)
    try:
        while True:
            with current_scope(scope):
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


class PortPump:
    """The client's half of a ConnectPort tunnel: a thread sending the data of the request
    stream into the tunnel; ``eof`` (or the end of the request stream) half-closes it."""

    def __init__(self, tunnel: Tunnel, first: sandboxes_pb2.PortData,
                 requests: Iterator[sandboxes_pb2.PortData]) -> None:
        self.tunnel = tunnel
        self.sent = 0
        self._first = first
        self._requests = requests
        self._thread = threading.Thread(target=self._run, name=f"callbox-port-{tunnel.port}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait until the client's side is done (it sent eof, closed its stream, or went away)."""
        self._thread.join()

    def _run(self) -> None:
        try:
            if self._take(self._first):
                return
            for message in self._requests:
                if self._take(message):
                    return
            self.tunnel.shutdown_write()  # the client closed its stream: that is an eof too
        except grpc.RpcError:
            self.tunnel.close()  # the RPC ended (cancelled): the whole connection goes
        except BrokenPipeError:
            pass  # the tunnel is closed: nothing more can go in
        except Exception:
            log.exception("the tunnel to port %d failed", self.tunnel.port)
            self.tunnel.close()

    def _take(self, message: sandboxes_pb2.PortData) -> bool:
        """Send one message's data; True once it carried eof."""
        if message.data:
            self.tunnel.send(message.data)
            self.sent += len(message.data)
        if message.eof:
            self.tunnel.shutdown_write()
            return True
        return False


class TerminalPump:
    """The client's half of a Terminal: a thread typing the request stream's data into the
    terminal and applying its window sizes, until the client's stream ends."""

    def __init__(self, terminal: Terminal, requests: Iterator[sandboxes_pb2.TerminalRequest]) -> None:
        self.terminal = terminal
        self._requests = requests
        self._thread = threading.Thread(target=self._run, name=f"callbox-terminal-{terminal.pid}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            for message in self._requests:
                kind = message.WhichOneof("input")
                if kind == "data":
                    self.terminal.send(message.data)
                elif kind == "resize":
                    self.terminal.resize(message.resize.rows, message.resize.cols)
                # a second attach means nothing: the terminal is attached already
        except grpc.RpcError:
            pass  # the RPC ended; its callback detaches the terminal
        except ValueError:
            pass  # the terminal was closed (the process ended, or the RPC did)
        except Exception:
            log.exception("the input of the terminal of pid %d failed", self.terminal.pid)

    def detach_soon(self) -> None:
        """Detach the terminal without waiting (safe on the server's polling thread)."""
        threading.Thread(target=self._detach, name=f"callbox-detach-{self.terminal.pid}", daemon=True).start()

    def _detach(self) -> None:
        with contextlib.suppress(Exception):
            self.terminal.close()
