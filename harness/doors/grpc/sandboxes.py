"""The ``harness.v1.Sandboxes`` servicer: living sandboxes beside Executor.

Every request names a sandbox the calling client created (Executor.CreateSandbox or Fork):
the Executor's sessions are the one registry (:meth:`ExecutorService.session_of`), so
anyone else's sandbox, like one that never existed, is NOT_FOUND, for every RPC. Snapshots
are per client as well (:mod:`harness.doors.grpc.sandboxes_snapshots`); the snapshot and
fork RPCs are in :mod:`harness.doors.grpc.sandboxes_forks`, the steps every RPC shares in
:mod:`harness.doors.grpc.sandboxes_base`.

Policy and audit: starting a process, attaching to one (logs, follow, terminal), connecting
to a port, copying files out (Download) or in (Upload), snapshots, forks and pause/resume
each go through an :class:`~harness.core.actions.ActionGate` of the sandbox's policy, its
run and the actor ``grpc:CLIENT``. The details are stable (``sandbox`` and ``pid``,
``mode``, ``command``, ``path``, ``port``, ``name``, ``op``), so the repeat of an asked
action with its ``approval_id`` matches the approval. ``deny`` is PERMISSION_DENIED naming
the policy key; ``ask`` is FAILED_PRECONDITION, APPROVAL_PENDING, with
``ErrorDetail.approval_id`` (Executor.ResolveApproval resolves it, the approval being of the
sandbox's run). Listing processes, input, signals, kills, Move, Watch, keep-alive, status
and listing or deleting snapshots are not actions of the policy.

Streams relay the agent's (:mod:`harness.doors.grpc.sandboxes_streams`); the end of an RPC
ends the agent's stream, and deleting the sandbox ends every stream of it (its agent's
channel closes; the stream then ends NOT_FOUND). A paused sandbox refuses what needs its
agent with FAILED_PRECONDITION, PAUSED (Executor.CallTool too). The agent's refusals keep
its status code (NOT_FOUND for an unknown pid, FAILED_PRECONDITION for a refused port, ...).

Lifetime: Pause and Resume are the engine's (the expiry clock stops while paused; resume
moves it later by the pause); KeepAlive sets the expiry to now + ttl_seconds (0: the
sandbox's own TTL), at most the server's ``sandbox.ttl_seconds`` (more is
PERMISSION_DENIED, as in CreateSandbox; under 10 s INVALID_ARGUMENT); the door's reaper
follows the same clock (:class:`~harness.doors.grpc.sessions.ClientSession`). GetStatus
reads CPU, memory and processes from the sandbox's cgroup (``gone`` once its container is).

UpdateNetwork replaces a sandbox's network rules within its policy's network (the one
implementation, :func:`harness.core.network_request.update_network`, that the E2B door's
``update_network`` and ``callbox sandbox network`` use too), as the policy's ``network`` action.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc

from harness.core.network_request import NetworkRequest, update_network
from harness.doors.grpc.errors import denied, handle_errors_any, handle_stream_errors, invalid
from harness.doors.grpc.sandboxes_base import Owned
from harness.doors.grpc.sandboxes_forks import SnapshotsAndForks
from harness.doors.grpc.sandboxes_streams import PortPump, TerminalPump, event_message, process_message, scoped
from harness.engine.cancel import CallScope, current_scope
from harness.engine.docker.kept import SandboxExpired
from harness.v1 import sandboxes_pb2, sandboxes_pb2_grpc

__all__ = ["SandboxesService"]


class SandboxesService(SnapshotsAndForks, sandboxes_pb2_grpc.SandboxesServicer):
    """The Sandboxes RPCs over the sessions of an :class:`ExecutorService`; see the module docstring."""

    # ---- processes -------------------------------------------------------------------------------

    @handle_errors_any
    def StartProcess(self, request: sandboxes_pb2.StartProcessRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        command: list[str] | str = list(request.argv) if request.argv else request.command
        if not command:
            raise invalid("StartProcess needs argv (run directly) or command (run under bash -c)")
        gate, ticket = self._gate(owned, "process", {"command": command, "tag": request.tag, "pty": request.pty},
                                  request.approval_id)
        with self._acting(gate, ticket, context, owned):
            spec = owned.box.spec
            info = owned.box.jobs.start(
                command, tag=request.tag, cwd=request.cwd or spec.workdir, env={**spec.env, **request.env},
                pty=request.pty, rows=request.rows, cols=request.cols, stdin=request.stdin,
                buffer_bytes=request.buffer_bytes,
            )
            ticket.outcome["pid"] = info.pid
        return process_message(info)

    @handle_errors_any
    def ListProcesses(self, request: sandboxes_pb2.ListProcessesRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        with self._live(owned):
            jobs = owned.box.jobs.list()
        return sandboxes_pb2.ListProcessesResponse(processes=[process_message(info) for info in jobs])

    @handle_stream_errors
    def AttachProcess(self, request: sandboxes_pb2.AttachProcessRequest,
                      context: grpc.ServicerContext) -> Iterator[sandboxes_pb2.ProcessEvent]:
        owned = self._running(request.sandbox_id, context)
        mode = "attach" if request.follow else "logs"
        gate, ticket = self._gate(owned, "attach", {"pid": request.pid, "mode": mode}, request.approval_id)
        with self._acting(gate, ticket, context, owned):
            events = owned.box.jobs.attach(request.pid, from_seq=request.from_seq, follow=request.follow)
            for event in scoped(events, context):
                yield event_message(event)

    @handle_stream_errors
    def Terminal(self, request_iterator: Iterator[sandboxes_pb2.TerminalRequest],
                 context: grpc.ServicerContext) -> Iterator[sandboxes_pb2.ProcessEvent]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("input") != "attach":
            raise invalid("the first TerminalRequest must be attach (sandbox_id and pid)")
        attach = first.attach
        owned = self._running(attach.sandbox_id, context)
        gate, ticket = self._gate(owned, "attach", {"pid": attach.pid, "mode": "terminal"}, attach.approval_id)
        with self._acting(gate, ticket, context, owned):
            terminal = owned.box.jobs.terminal(attach.pid, from_seq=attach.from_seq)
            pump = TerminalPump(terminal, request_iterator)
            context.add_callback(pump.detach_soon)
            pump.start()
            try:
                for event in terminal.events():
                    yield event_message(event)
            finally:
                terminal.close()

    @handle_errors_any
    def SendInput(self, request: sandboxes_pb2.SendInputRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        with self._live(owned):
            owned.box.jobs.write(request.pid, request.data, close=request.close)
        return sandboxes_pb2.SendInputResponse()

    @handle_errors_any
    def SignalProcess(self, request: sandboxes_pb2.SignalProcessRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        with self._live(owned):
            delivered = owned.box.jobs.signal(request.pid, request.signal)
        return sandboxes_pb2.SignalProcessResponse(delivered=delivered)

    @handle_errors_any
    def KillProcess(self, request: sandboxes_pb2.KillProcessRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        with self._live(owned):
            return process_message(owned.box.jobs.kill(request.pid))

    # ---- files -----------------------------------------------------------------------------------

    @handle_stream_errors
    def Download(self, request: sandboxes_pb2.DownloadRequest,
                 context: grpc.ServicerContext) -> Iterator[sandboxes_pb2.DataChunk]:
        owned = self._running(request.sandbox_id, context)
        if not request.path:
            raise invalid("Download needs the path of a file or directory in the sandbox")
        gate, ticket = self._gate(owned, "copy_out", {"path": request.path}, request.approval_id)
        with self._acting(gate, ticket, context, owned):
            sent = 0
            for chunk in scoped(owned.box.transfer.download(request.path), context):
                sent += len(chunk)
                ticket.outcome["archive_bytes"] = sent
                yield sandboxes_pb2.DataChunk(data=chunk)

    @handle_errors_any
    def Upload(self, request_iterator: Iterator[sandboxes_pb2.UploadRequest], context: grpc.ServicerContext) -> Any:
        first = next(request_iterator, None)
        if first is None or not first.sandbox_id or not first.dest:
            raise invalid("the first UploadRequest names the sandbox_id and the dest directory")
        owned = self._running(first.sandbox_id, context)
        gate, ticket = self._gate(owned, "copy_in", {"path": first.dest}, first.approval_id)

        def chunks() -> Iterator[bytes]:
            if first.data:
                yield first.data
            for message in request_iterator:
                if message.data:
                    yield message.data

        with self._acting(gate, ticket, context, owned):
            result = owned.box.transfer.upload_tar_stream(first.dest, chunks(), overwrite=first.overwrite)
            ticket.outcome.update(files=result.files, dirs=result.dirs, bytes=result.bytes)
        return sandboxes_pb2.UploadResponse(files_written=result.files, dirs_created=result.dirs,
                                            bytes_written=result.bytes)

    @handle_errors_any
    def Move(self, request: sandboxes_pb2.MoveRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        with self._live(owned):
            owned.box.transfer.move(request.source, request.destination, overwrite=request.overwrite)
        return sandboxes_pb2.MoveResponse()

    @handle_stream_errors
    def Watch(self, request: sandboxes_pb2.WatchRequest,
              context: grpc.ServicerContext) -> Iterator[sandboxes_pb2.WatchEvent]:
        owned = self._running(request.sandbox_id, context)
        scope = CallScope()
        context.add_callback(scope.cancel)
        with self._live(owned):
            with current_scope(scope):
                watch = owned.box.transfer.watch(request.path, recursive=request.recursive)
            try:
                yield sandboxes_pb2.WatchEvent(kind="ready", path=request.path, is_dir=True)
                for change in watch:
                    yield sandboxes_pb2.WatchEvent(kind=change.kind, path=change.path, is_dir=change.is_dir)
            finally:
                watch.close()

    # ---- ports -----------------------------------------------------------------------------------

    @handle_stream_errors
    def ConnectPort(self, request_iterator: Iterator[sandboxes_pb2.PortData],
                    context: grpc.ServicerContext) -> Iterator[sandboxes_pb2.PortData]:
        first = next(request_iterator, None)
        if first is None:
            return
        owned = self._running(first.sandbox_id, context)
        if not 1 <= first.port <= 65535:
            raise invalid(f"port {first.port} is not a TCP port (1 to 65535)")
        gate, ticket = self._gate(owned, "port_forward", {"port": first.port}, first.approval_id)
        with self._acting(gate, ticket, context, owned):
            tunnel = owned.box.agent.ports.connect(first.port)
            context.add_callback(tunnel.close)
            pump = PortPump(tunnel, first, request_iterator)
            pump.start()
            received = 0
            try:
                for data in tunnel.recv():
                    received += len(data)
                    yield sandboxes_pb2.PortData(data=data)
                if not context.is_active():
                    ticket.outcome["ended"] = "cancelled"  # the RPC's end closed the tunnel under recv
                    return
                yield sandboxes_pb2.PortData(eof=True)
                pump.join()  # the connection is over once the client's side is done too
            finally:
                ticket.outcome.update(bytes_to_sandbox=pump.sent, bytes_from_sandbox=received)
                tunnel.close()

    # ---- lifetime --------------------------------------------------------------------------------

    def _status(self, owned: Owned) -> sandboxes_pb2.SandboxStatus:
        now = time.time()
        if owned.box.paused and not owned.session.paused:
            owned.session.mark_paused(now)  # paused on the host (`callbox sandbox pause`)
        state = "paused" if owned.session.paused else "running"
        status = sandboxes_pb2.SandboxStatus(sandbox_id=owned.sandbox_id, created_unix=owned.session.created,
                                             expires_unix=owned.session.expires_at(now))
        try:
            stats = owned.box.stats()
        except SandboxExpired:
            status.state = "gone"
            return status
        status.state = state
        status.cpu_seconds = stats.cpu_usage_s
        status.memory_bytes = stats.memory_bytes
        status.pids = stats.pids
        return status

    @handle_errors_any
    def Pause(self, request: sandboxes_pb2.PauseRequest, context: grpc.ServicerContext) -> Any:
        owned = self._owned(request.sandbox_id, context)
        gate, ticket = self._gate(owned, "pause", {"op": "pause"}, request.approval_id)
        with self._acting(gate, ticket, context, owned):
            owned.box.pause()
            owned.session.mark_paused(time.time())
        return self._status(owned)

    @handle_errors_any
    def Resume(self, request: sandboxes_pb2.ResumeRequest, context: grpc.ServicerContext) -> Any:
        owned = self._owned(request.sandbox_id, context)
        gate, ticket = self._gate(owned, "pause", {"op": "resume"}, request.approval_id)
        with self._acting(gate, ticket, context, owned):
            owned.session.mark_resumed(owned.box.resume())
        return self._status(owned)

    @handle_errors_any
    def KeepAlive(self, request: sandboxes_pb2.KeepAliveRequest, context: grpc.ServicerContext) -> Any:
        owned = self._owned(request.sandbox_id, context)
        limit = self.executor.profiles.of(owned.client).sandbox.ttl_seconds
        ttl = request.ttl_seconds or owned.session.ttl_seconds
        if ttl > limit:
            raise denied(f"ttl_seconds: {ttl} is above this server's limit of {limit} (sandbox.ttl_seconds in its "
                         "policy); ask for at most that")
        with self._live(owned):
            owned.session.mark_kept_alive(owned.box.keep_alive(float(ttl)), time.time())
        return self._status(owned)

    @handle_errors_any
    def UpdateNetwork(self, request: sandboxes_pb2.UpdateNetworkRequest, context: grpc.ServicerContext) -> Any:
        owned = self._owned(request.sandbox_id, context)
        asked = NetworkRequest(internet=request.internet if request.HasField("internet") else None,
                               allow=tuple(request.allow), deny=tuple(request.deny))
        details = {"internet": asked.internet, "allow": list(asked.allow), "deny": list(asked.deny)}
        gate, ticket = self._gate(owned, "network", details, request.approval_id)
        with self._acting(gate, ticket, context, owned):
            spec = update_network(owned.box, owned.box.spec, asked, owned.session.policy.sandbox.on_internet_request)
            ticket.outcome["network"] = spec.network_summary()
        return sandboxes_pb2.NetworkRules(sandbox_id=owned.sandbox_id, network=spec.network,
                                          allow_hosts=spec.allow_hosts, allow=spec.egress_allow,
                                          deny=spec.egress_deny, summary=spec.network_summary())

    @handle_errors_any
    def GetStatus(self, request: sandboxes_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        owned = self._owned(request.sandbox_id, context)
        with self._live(owned):
            return self._status(owned)
