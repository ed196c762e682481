"""A small typed client for the callbox executor service (``callbox serve --grpc``).

Synchronous::

    from harness.client import ExecutorClient

    with ExecutorClient("unix:/run/callbox/executor.sock", token) as client:
        tools = client.list_tools("openai")              # definitions for the model's tools list
        box = client.create_sandbox(memory="256m")       # its id is also the run id
        for event in client.call_tool(box, "shell", {"command": "ls"}, call_id="c1"):
            ...                                          # OutputEvent chunks, then one CallResult
        result = client.call(box, "shell", '{"command": "ls"}', call_id="c2")
        conversation.append(result.item)                 # the item for the same call_id, shaped for fmt
        client.delete_sandbox(box)

Asynchronous: :class:`AsyncExecutorClient` has the same methods as coroutines, and
``call_tool`` is an async iterator.

``target`` is ``unix:/path``, a socket path (starting with ``/``, ``./`` or ``~``), or
``host:port`` (None: the server's default socket); ``token`` None means ``CALLBOX_TOKEN``
or the token file (:func:`harness.doors.grpc.tokens.client_token`). With ``tls_ca`` (a PEM path or
bytes) or ``tls=True`` the channel uses TLS (``tls_server_name`` overrides the name the
certificate is checked against). The default ``timeout`` (60 s) applies to the unary
methods; ``call_tool`` has no deadline unless given one. An RPC that fails raises
:class:`ExecutorError` with the gRPC ``code``, the server's ``reason`` (``"NOT_FOUND"``,
``"LIMIT_REACHED"``, ...), its ``message`` and ``retryable``. A tool call
that fails for the model (bad arguments, denied, non-zero exit, timed out) is not an error:
it is a ``CallResult`` with ``is_error`` set, to be handed to the model. ``timeout`` on a
method is the RPC deadline in seconds: a ``call_tool`` whose deadline passes (or whose
iterator is closed early) kills the tool's processes in the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from harness.client_messages import (
    ApprovalInfo,
    CallEvent,
    CallInfo,
    CallResult,
    ExecutorError,
    FormatName,
    MountSpec,
    OutputEvent,
    Rpc,
    RunInfo,
    SandboxInfo,
    call_event,
    call_tool_request,
    create_sandbox_rpc,
    delete_sandbox_rpc,
    get_run_rpc,
    list_runs_rpc,
    list_tools_rpc,
    no_result_error,
    resolve_approval_rpc,
    result_or_relay,
)
from harness.doors.grpc.tokens import client_token
from harness.v1 import executor_pb2_grpc
from harness.wire import MAX_MESSAGE_BYTES, default_executor_socket

__all__ = [
    "ApprovalInfo",
    "AsyncExecutorClient",
    "CallEvent",
    "CallInfo",
    "CallResult",
    "ExecutorClient",
    "ExecutorError",
    "OutputEvent",
    "RunInfo",
    "SandboxInfo",
]


# --- the channel (shared by both clients) ----------------------------------------------------------


def _target(target: str | None) -> str:
    if not target:
        return f"unix:{default_executor_socket()}"
    if target.startswith(("/", "./", "../", "~")):  # a socket path
        return f"unix:{os.path.abspath(os.path.expanduser(target))}"
    return target  # unix:PATH, host:port, or any gRPC target (dns:///host:port, ...)


def _ca_bytes(tls_ca: str | Path | bytes | None) -> bytes | None:
    if tls_ca is None or isinstance(tls_ca, bytes):
        return tls_ca
    return Path(tls_ca).expanduser().read_bytes()


def _channel_options(tls_server_name: str | None) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options


def _use_tls(tls: bool | None, tls_ca: object) -> bool:
    return tls if tls is not None else tls_ca is not None


_T = TypeVar("_T")
_ChannelT = TypeVar("_ChannelT", grpc.Channel, grpc.aio.Channel)


class _Client(Generic[_ChannelT]):
    """What both clients share: the target, the credentials, the channel and the stub."""

    def __init__(
        self,
        target: str | None = None,
        token: str | None = None,
        *,
        tls_ca: str | Path | bytes | None = None,
        tls: bool | None = None,
        tls_server_name: str | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        self.target = _target(target)
        self._metadata = (("authorization", f"Bearer {token or client_token()}"),)
        self.timeout = timeout
        options = _channel_options(tls_server_name)
        credentials = None
        if _use_tls(tls, tls_ca):
            credentials = grpc.ssl_channel_credentials(root_certificates=_ca_bytes(tls_ca))
        self.channel: _ChannelT = self._open(self.target, credentials, options)
        self.stub = executor_pb2_grpc.ExecutorStub(self.channel)

    def _open(self, target: str, credentials: grpc.ChannelCredentials | None,
              options: list[tuple[str, Any]]) -> _ChannelT:
        raise NotImplementedError

    def _call_options(self, timeout: float | None) -> dict[str, Any]:
        """The metadata and deadline of a unary call (``timeout`` None: the client's default)."""
        return {"metadata": self._metadata, "timeout": timeout if timeout is not None else self.timeout}


# --- the synchronous client ----------------------------------------------------------------------------


class ExecutorClient(_Client[grpc.Channel]):
    """Blocking client; one channel, safe to share between threads."""

    def _open(self, target: str, credentials: grpc.ChannelCredentials | None,
              options: list[tuple[str, Any]]) -> grpc.Channel:
        if credentials is not None:
            return grpc.secure_channel(target, credentials, options=options)
        return grpc.insecure_channel(target, options=options)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ExecutorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, rpc: Rpc[_T], timeout: float | None) -> _T:
        try:
            response = getattr(self.stub, rpc.method)(rpc.request, **self._call_options(timeout))
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        return rpc.convert(response)

    def list_tools(self, fmt: FormatName | str = "openai", *, sandbox_id: str = "",
                   timeout: float | None = None) -> list[dict[str, Any]]:
        """Tool definitions in ``fmt``'s shape (for the model's tools list)."""
        return self._unary(list_tools_rpc(fmt, sandbox_id), timeout)

    def create_sandbox(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> str:
        """Start a sandbox (overrides may only tighten the server's policy); its id."""
        rpc = create_sandbox_rpc(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return self._unary(rpc, timeout).sandbox_id

    def create_sandbox_info(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> SandboxInfo:
        """Like ``create_sandbox``, returning the sandbox's effective settings."""
        rpc = create_sandbox_rpc(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return self._unary(rpc, timeout)

    def call_tool(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
    ) -> Iterator[CallEvent]:
        """Run a tool call: OutputEvent chunks while it runs, then the CallResult.

        ``timeout`` (seconds, default none) is the RPC deadline; closing the iterator early
        cancels the call. Either kills the tool's processes in the sandbox."""
        request = call_tool_request(sandbox_id, name, arguments, call_id, fmt)
        stream = self.stub.CallTool(request, metadata=self._metadata, timeout=timeout)
        try:
            for message in stream:
                yield call_event(message)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        finally:
            stream.cancel()

    def call(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
    ) -> CallResult:
        """Run a tool call to the end; ``on_output`` sees each output chunk."""
        for event in self.call_tool(sandbox_id, name, arguments, call_id, fmt, timeout=timeout):
            if (result := result_or_relay(event, on_output)) is not None:
                return result
        raise no_result_error()

    def resolve_approval(self, approval_id: str, approve: bool, reason: str = "", *, scope: str = "",
                         timeout: float | None = None) -> ApprovalInfo:
        """Approve or deny a pending call (then send the same call again to run it), or a held
        egress connection (``scope``: ``once``, the default, or ``sandbox``)."""
        return self._unary(resolve_approval_rpc(approval_id, approve, reason, scope), timeout)

    def get_run(self, run_id: str, *, timeout: float | None = None) -> RunInfo:
        return self._unary(get_run_rpc(run_id), timeout)

    def list_runs(self, limit: int = 50, *, timeout: float | None = None) -> list[RunInfo]:
        return self._unary(list_runs_rpc(limit), timeout)

    def delete_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> int:
        """Destroy the sandbox; how many running calls were cancelled."""
        return self._unary(delete_sandbox_rpc(sandbox_id), timeout)


# --- the asynchronous client -----------------------------------------------------------------------------


class AsyncExecutorClient(_Client[grpc.aio.Channel]):
    """The same methods as :class:`ExecutorClient` on ``grpc.aio``; ``call_tool`` is an async iterator."""

    def _open(self, target: str, credentials: grpc.ChannelCredentials | None,
              options: list[tuple[str, Any]]) -> grpc.aio.Channel:
        if credentials is not None:
            return grpc.aio.secure_channel(target, credentials, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncExecutorClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _unary(self, rpc: Rpc[_T], timeout: float | None) -> _T:
        try:
            response = await getattr(self.stub, rpc.method)(rpc.request, **self._call_options(timeout))
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        return rpc.convert(response)

    async def list_tools(self, fmt: FormatName | str = "openai", *, sandbox_id: str = "",
                         timeout: float | None = None) -> list[dict[str, Any]]:
        return await self._unary(list_tools_rpc(fmt, sandbox_id), timeout)

    async def create_sandbox(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> str:
        rpc = create_sandbox_rpc(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return (await self._unary(rpc, timeout)).sandbox_id

    async def create_sandbox_info(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> SandboxInfo:
        rpc = create_sandbox_rpc(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return await self._unary(rpc, timeout)

    async def call_tool(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[CallEvent]:
        request = call_tool_request(sandbox_id, name, arguments, call_id, fmt)
        stream = self.stub.CallTool(request, metadata=self._metadata, timeout=timeout)
        try:
            async for message in stream:
                yield call_event(message)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        finally:
            stream.cancel()

    async def call(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
    ) -> CallResult:
        async for event in self.call_tool(sandbox_id, name, arguments, call_id, fmt, timeout=timeout):
            if (result := result_or_relay(event, on_output)) is not None:
                return result
        raise no_result_error()

    async def resolve_approval(self, approval_id: str, approve: bool, reason: str = "", *, scope: str = "",
                               timeout: float | None = None) -> ApprovalInfo:
        return await self._unary(resolve_approval_rpc(approval_id, approve, reason, scope), timeout)

    async def get_run(self, run_id: str, *, timeout: float | None = None) -> RunInfo:
        return await self._unary(get_run_rpc(run_id), timeout)

    async def list_runs(self, limit: int = 50, *, timeout: float | None = None) -> list[RunInfo]:
        return await self._unary(list_runs_rpc(limit), timeout)

    async def delete_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> int:
        return await self._unary(delete_sandbox_rpc(sandbox_id), timeout)
