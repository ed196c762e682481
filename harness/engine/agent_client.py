"""A typed client for the in-container agent (sandbox.v1) over its unix socket.

Thin on purpose: it turns gRPC errors into ``AgentCallError`` with the agent's
structured reason, and leaves shaping results to the callers. Its channel records the
streaming RPCs it opens in the calling thread's :class:`~harness.engine.cancel.CallScope`,
so cancelling a tool call's scope cancels them (and the agent kills what they started).

``Exec`` and bash ``Run`` go over a second channel object whose server-streaming calls are
read on the calling thread (gRPC's ``SingleThreadedUnaryStream``): a plain channel starts a
"channel spin thread" whenever a streaming call begins with none in flight, so every short
command paid for a thread start and two thread hand-offs. Cancelling such a stream from
another thread (a :class:`~harness.engine.cancel.CallScope`) still ends it at once. Both
channel objects have the same core arguments, so gRPC core shares one connection between
them. The other streams (jobs, transfers, tunnels) keep the plain channel: some of them are
watched from other threads (done callbacks, metadata), which the single-threaded kind
does not allow.

:meth:`AgentClient.over_relay` reaches an agent on another machine through that node's relay
(:mod:`harness.engine.ray.relay`): the same stubs and the same two channel objects, over TLS
pinned to the relay's certificate, every call carrying the sandbox's id and token, with
keepalive pings so a node that vanishes fails its calls with UNAVAILABLE within seconds.
"""

from __future__ import annotations

import collections
import contextlib
import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import grpc.experimental

from harness.core.errors import AgentCallError
from harness.engine.agent_errors import SANDBOX_GONE, sandbox_gone, translate
from harness.engine.cancel import StreamTracker, active_scope
from harness.engine.jobs import JobsClient
from harness.engine.ports import PortsClient
from harness.engine.transfer import TransferClient
from harness.wire import MAX_MESSAGE_BYTES
from sandbox import health
from sandbox.v1 import (
    changes_pb2,
    changes_pb2_grpc,
    filesystem_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    shell_pb2,
    shell_pb2_grpc,
)

DEFAULT_AGENT_TIMEOUT_MS = 30_000  # the agent's default when a request sets none
RPC_MARGIN_S = 30.0
UPLOAD_CHUNK_BYTES = 1 << 20
OLD_AGENT = ("this sandbox's agent has no ExecBuffered: its image was built by an older callbox; rebuild the "
             "image (`callbox image build`) and start a new sandbox from it")


_TRACKER = StreamTracker()
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
    # The agent's socket is local: a connection refused while it is not yet listening (a sandbox
    # starting, or restored from a memory image) is tried again soon, not after gRPC's default
    # backoff of a second and more
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_SINGLE_THREADED = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)
"""Server-streaming calls read on the calling thread, no channel spin thread (see the module docstring)."""

RELAY_SANDBOX_KEY = "callbox-sandbox"
"""Request metadata naming the sandbox a relayed call is for."""
RELAY_AUTH_KEY = "authorization"
"""Request metadata carrying ``Bearer <token>``: the sandbox's own token at its node's relay."""
RELAY_TLS_NAME = "callbox-relay"
"""The name every relay certificate holds (:mod:`harness.engine.ray.relay_tls`); checked instead
of the dialled address, since the certificate itself is pinned."""
_RELAY_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.ssl_target_name_override", RELAY_TLS_NAME),
    # a ping every second, and a peer that does not answer one within two is dead: calls on a
    # node that vanished fail with UNAVAILABLE in about three seconds, idle or not
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # any ping counts: while one of gRPC's own (a flow-control probe) is unanswered no keepalive
    # ping is sent, and that one would otherwise wait a minute
    ("grpc.http2.ping_timeout_ms", 2000),
    # a relay that restarts (its host did) is found again soon
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _exec_request(
    command: Sequence[str] | str, *, cwd: str, env: Mapping[str, str] | None, stdin: bytes, timeout_ms: int,
    output_cap_bytes: int, exec_id: str, kill_grace_ms: int, keep_stdin_open: bool,
) -> process_pb2.ExecRequest:
    """An ExecRequest: argv when ``command`` is a sequence, ``bash -c`` when a string."""
    request = process_pb2.ExecRequest(
        cwd=cwd, env=dict(env or {}), stdin=stdin, timeout_ms=timeout_ms,
        output_cap_bytes=output_cap_bytes, exec_id=exec_id, kill_grace_ms=kill_grace_ms,
        keep_stdin_open=keep_stdin_open,
    )
    if isinstance(command, str):
        request.shell = command
    else:
        request.argv.args.extend(command)
    return request


def _rpc_timeout(timeout_ms: int) -> float:
    """Never wait forever on a wedged agent: the command's own limit plus a margin."""
    return (timeout_ms or DEFAULT_AGENT_TIMEOUT_MS) / 1000 + RPC_MARGIN_S


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                                            "compression")),
    grpc.ClientCallDetails,  # type: ignore[misc]
):
    pass


class _RelayCredentials(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the sandbox's id and token to every call (in Python, on the calling thread: call
    credentials would run a metadata plugin on a thread of gRPC's for each call)."""

    def __init__(self, sandbox_id: str, token: str) -> None:
        self._metadata = ((RELAY_SANDBOX_KEY, sandbox_id), (RELAY_AUTH_KEY, f"Bearer {token}"))

    def _details(self, details: Any) -> _CallDetails:
        return _CallDetails(details.method, details.timeout, (*(details.metadata or ()), *self._metadata),
                            details.credentials, details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


class AgentClient:
    """One channel to one sandbox's agent."""

    def __init__(self, socket_path: str) -> None:
        self.target = f"unix:{socket_path}"
        channel = grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        stream_channel = grpc.insecure_channel(self.target, options=[*_CHANNEL_OPTIONS, _SINGLE_THREADED])
        self._attach(grpc.intercept_channel(channel, _TRACKER), stream_channel,
                     grpc.intercept_channel(stream_channel, _TRACKER))

    @classmethod
    def over_relay(cls, address: str, certificate_pem: bytes, sandbox_id: str, token: str) -> AgentClient:
        """A client of sandbox ``sandbox_id``'s agent through the relay at ``address`` (``ip:port``)
        of its node, trusting only ``certificate_pem`` (the relay's own), with the sandbox's token."""
        client = cls.__new__(cls)
        client.target = address
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate_pem)
        relay_keys = {key for key, _ in _RELAY_OPTIONS}
        options = [*(o for o in _CHANNEL_OPTIONS if o[0] not in relay_keys), *_RELAY_OPTIONS]
        channel = grpc.secure_channel(address, credentials, options=options)
        stream_channel = grpc.secure_channel(address, credentials, options=[*options, _SINGLE_THREADED])
        auth = _RelayCredentials(sandbox_id, token)
        client._attach(grpc.intercept_channel(channel, auth, _TRACKER), stream_channel,
                       grpc.intercept_channel(stream_channel, auth, _TRACKER))
        return client

    def _attach(self, channel: grpc.Channel, stream_channel: grpc.Channel, streams: grpc.Channel) -> None:
        """Set up the stubs on ``channel`` (intercepted) and, for Exec and bash Run, ``streams``
        (the single-threaded ``stream_channel``, intercepted)."""
        self.channel: grpc.Channel = channel
        self._stream_channel = stream_channel
        self.process = process_pb2_grpc.ProcessStub(self.channel)
        self._exec = process_pb2_grpc.ProcessStub(streams).Exec
        self._exec_buffered = self.process.ExecBuffered
        self._shell_run = shell_pb2_grpc.ShellStub(streams).Run
        self.files = filesystem_pb2_grpc.FilesystemStub(self.channel)
        self.changes = changes_pb2_grpc.ChangesStub(self.channel)
        self.jobs = JobsClient(self.channel)
        """Background jobs and terminals (:mod:`harness.engine.jobs`)."""
        self.transfer = TransferClient(self.channel)
        """Files both ways: download, copy in and out, move, watch (:mod:`harness.engine.transfer`)."""
        self.ports = PortsClient(self.channel)
        """TCP tunnels to the sandbox's loopback (:mod:`harness.engine.ports`)."""
        self.explain_gone: Callable[[], str | None] | None = None
        """Asked, when a call finds the sandbox gone, for why (``"its container was killed
        for running out of memory"``): the engine that made the sandbox knows."""

    def _failure(self, error: grpc.RpcError) -> AgentCallError:
        """The AgentCallError of a failed RPC, saying why the sandbox went away if it did."""
        failure = translate(error)
        if self.explain_gone is not None and sandbox_gone(failure) and failure.message.startswith(SANDBOX_GONE):
            try:
                why = self.explain_gone()
            except Exception:  # the explanation is a courtesy: it never hides the failure
                why = None
            if why:
                failure = AgentCallError(f"{failure.message} ({why})", reason=failure.reason,
                                         grpc_code=failure.grpc_code, retryable=failure.retryable)
        return failure

    def close(self) -> None:
        self._stream_channel.close()
        self.channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self, timeout: float = 1.0) -> int:
        try:
            return health.check(self.channel, timeout)
        except grpc.RpcError as error:
            raise self._failure(error) from None

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout_ms: int = 0,
        output_cap_bytes: int = 0,
        exec_id: str = "",
        kill_grace_ms: int = 0,
        keep_stdin_open: bool = False,
        rpc_timeout: float | None = None,
    ) -> Iterator[process_pb2.ExecEvent]:
        """Start a command and yield its events; argv when a sequence, ``bash -c`` when a string.

        With ``keep_stdin_open`` the command's stdin stays open after ``stdin`` is written;
        :meth:`write_stdin` (with the same ``exec_id``) sends more and closes it."""
        request = _exec_request(command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms,
                                output_cap_bytes=output_cap_bytes, exec_id=exec_id, kill_grace_ms=kill_grace_ms,
                                keep_stdin_open=keep_stdin_open)
        if rpc_timeout is None:
            rpc_timeout = _rpc_timeout(timeout_ms)
        stream = self._exec(request, timeout=rpc_timeout)
        try:
            yield from stream
        except grpc.RpcError as error:
            raise self._failure(error) from None
        finally:
            stream.cancel()

    def exec_buffered(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout_ms: int = 0,
        output_cap_bytes: int = 0,
        exec_id: str = "",
        kill_grace_ms: int = 0,
        rpc_timeout: float | None = None,
    ) -> list[process_pb2.ExecEvent]:
        """Run a command to its end and return the events :meth:`exec` would yield, all in one
        answer (``ExecBuffered``: one message each way, no stream), for a caller that does not
        watch the output as it arrives; ``collect`` takes them as it takes a stream.

        ``output_cap_bytes`` is at most the agent's ``MAX_BUFFERED_OUTPUT_CAP`` (16 MiB; more is refused):
        a larger cap needs :meth:`exec`. The call is cancelled with the current
        :class:`~harness.engine.cancel.CallScope`, as :meth:`exec`'s stream is."""
        request = _exec_request(command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms,
                                output_cap_bytes=output_cap_bytes, exec_id=exec_id, kill_grace_ms=kill_grace_ms,
                                keep_stdin_open=False)
        if rpc_timeout is None:
            rpc_timeout = _rpc_timeout(timeout_ms)
        scope = active_scope()
        try:
            if scope is None:
                answer = self._exec_buffered(request, timeout=rpc_timeout)
            else:
                # Only a call started as a future can be cancelled from another thread.
                future = self._exec_buffered.future(request, timeout=rpc_timeout)
                scope.track(future)
                answer = future.result()
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise AgentCallError(OLD_AGENT, reason="UNSPECIFIED", grpc_code="UNIMPLEMENTED",
                                     retryable=False) from None
            raise self._failure(error) from None
        except grpc.FutureCancelledError:
            # What a cancelled Exec stream raises, so callers need not tell the two apart.
            raise AgentCallError("the call was cancelled", reason="UNSPECIFIED", grpc_code="CANCELLED",
                                 retryable=False) from None
        return list(answer.events)

    def signal(self, exec_id: str, signum: int) -> int:
        return int(self._unary(self.process.Signal, process_pb2.SignalRequest(exec_id=exec_id, signal=signum))
                   .delivered)

    def write_stdin(self, exec_id: str, data: bytes, *, close: bool = False, timeout: float = 30.0) -> int:
        """Queue ``data`` for the stdin of a running exec started with ``keep_stdin_open`` (and
        close it after, with ``close``); return the bytes still waiting for the command to read."""
        request = process_pb2.WriteStdinRequest(exec_id=exec_id, data=data, close=close)
        return int(self._unary(self.process.WriteStdin, request, timeout).pending_bytes)

    def read_file(self, path: str, *, offset: int = 0, limit: int = 0) -> filesystem_pb2.ReadResponse:
        response: filesystem_pb2.ReadResponse = self._unary(
            self.files.Read, filesystem_pb2.ReadRequest(path=path, offset=offset, limit=limit))
        return response

    def write_file(self, path: str, data: bytes, **options: Any) -> int:
        request = filesystem_pb2.WriteRequest(path=path, data=data, **options)
        return int(self._unary(self.files.Write, request).bytes_written)

    def list_dir(self, path: str, **options: Any) -> filesystem_pb2.ListResponse:
        response: filesystem_pb2.ListResponse = self._unary(
            self.files.List, filesystem_pb2.ListRequest(path=path, **options))
        return response

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._unary(self.files.Remove, filesystem_pb2.RemoveRequest(path=path, recursive=recursive))

    def make_dir(self, path: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        self._unary(self.files.MakeDir, filesystem_pb2.MakeDirRequest(path=path, parents=parents, exist_ok=exist_ok))

    def stat(self, path: str) -> filesystem_pb2.FileInfo:
        return self._unary(self.files.Stat, filesystem_pb2.StatRequest(path=path)).info  # type: ignore[no-any-return]

    def scan_changes(
        self, request: changes_pb2.ScanRequest, *, timeout: float = 600.0
    ) -> Iterator[changes_pb2.ScanChunk]:
        """What changed in the places since the agent's previous scan of them (``Changes.Scan``), streamed."""
        call = self.changes.Scan(request, timeout=timeout)
        try:
            yield from call
        except grpc.RpcError as error:
            raise self._failure(error) from None
        finally:
            call.cancel()

    def apply_changes(self, ops: Sequence[changes_pb2.ApplyOp], *, timeout: float = 300.0) -> int:
        """Apply operations in order in the sandbox (``Changes.Apply``); how many were applied."""
        return int(self._unary(self.changes.Apply, changes_pb2.ApplyRequest(ops=ops), timeout).applied)

    def upload_tar(
        self,
        dest: str,
        data: bytes | BinaryIO | Path,
        *,
        overwrite: bool = False,
        max_bytes: int = 0,
        chunk_size: int = UPLOAD_CHUNK_BYTES,
        timeout: float = 300.0,
    ) -> filesystem_pb2.UploadResponse:
        """Stream a tar archive (plain or gzip) into the existing directory ``dest`` in the sandbox.

        ``data`` is the archive itself, a binary file object read from its current position, or a
        file on the host. The agent unpacks it as the tool user; a member that is absolute, has a
        ``..`` component, is a link or a special file, or goes through a symlink in ``dest`` refuses
        the whole upload and nothing is written (``sandbox/upload.py``). ``max_bytes`` lowers the
        agent's limit on file content (1 GiB).
        """
        if not 0 < chunk_size <= MAX_MESSAGE_BYTES // 2:
            raise ValueError(f"chunk_size must be between 1 and {MAX_MESSAGE_BYTES // 2} bytes")
        with contextlib.ExitStack() as stack:
            source: BinaryIO
            if isinstance(data, Path):
                source = stack.enter_context(data.open("rb"))
            elif isinstance(data, bytes):
                source = io.BytesIO(data)
            else:
                source = data

            def chunks() -> Iterator[filesystem_pb2.UploadChunk]:
                first = filesystem_pb2.UploadChunk(dest=dest, overwrite=overwrite, max_bytes=max_bytes)
                first.data = source.read(chunk_size)
                yield first
                while piece := source.read(chunk_size):
                    yield filesystem_pb2.UploadChunk(data=piece)

            response: filesystem_pb2.UploadResponse = self._unary(self.files.Upload, chunks(), timeout)
        return response

    # ---- the persistent bash sessions (Shell service) ---------------------------------

    @cached_property
    def shell(self) -> shell_pb2_grpc.ShellStub:
        return shell_pb2_grpc.ShellStub(self.channel)

    def shell_run(
        self,
        command: str,
        *,
        session_id: str = "",
        timeout_ms: int = 0,
        output_cap_bytes: int = 0,
        env: Mapping[str, str] | None = None,
        rpc_timeout: float | None = None,
    ) -> Iterator[shell_pb2.ShellEvent]:
        """Run a command in a bash session (started on first use); yield Output events, then ShellDone.

        A session runs one command at a time: a call made while another runs waits for it (up to
        its own timeout) before its own timeout starts, so the default RPC deadline allows both.
        """
        request = shell_pb2.ShellRunRequest(
            session_id=session_id, command=command, timeout_ms=timeout_ms, output_cap_bytes=output_cap_bytes,
            env=dict(env or {}),
        )
        if rpc_timeout is None:
            rpc_timeout = 2 * (timeout_ms or DEFAULT_AGENT_TIMEOUT_MS) / 1000 + RPC_MARGIN_S
        stream = self._shell_run(request, timeout=rpc_timeout)
        try:
            yield from stream
        except grpc.RpcError as error:
            raise self._failure(error) from None
        finally:
            stream.cancel()

    def shell_restart(
        self, session_id: str = "", *, env: Mapping[str, str] | None = None, timeout: float = 30.0
    ) -> shell_pb2.ShellRestartResponse:
        """Kill the session's whole process tree and start a fresh shell (``env`` added to its environment)."""
        response: shell_pb2.ShellRestartResponse = self._unary(
            self.shell.Restart, shell_pb2.ShellRestartRequest(session_id=session_id, env=dict(env or {})), timeout)
        return response

    def shell_close(self, session_id: str = "", *, timeout: float = 30.0) -> bool:
        """Kill the session's whole process tree and forget it; False if there was none."""
        return bool(self._unary(self.shell.Close, shell_pb2.ShellCloseRequest(session_id=session_id), timeout).closed)

    def _unary(self, method: Any, request: Any, timeout: float = 30.0) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as error:
            raise self._failure(error) from None
