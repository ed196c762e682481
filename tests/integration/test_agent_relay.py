"""The agent relay (harness/engine/ray/relay.py) in front of a real sandbox: a real Docker
sandbox, the relay in this process on 127.0.0.1 over TLS, and an ``AgentClient.over_relay``
making the same calls the harness makes, with the guarantees it has on the node itself."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.core.errors import AgentCallError
from harness.engine.agent_client import AgentClient
from harness.engine.agent_errors import SANDBOX_GONE, sandbox_gone
from harness.engine.cancel import CallScope, current_scope
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME
from harness.engine.exec_result import collect
from harness.engine.jobs import JobChunk, JobEnded
from harness.engine.ray import relay as relay_module
from harness.engine.ray.relay import REFUSED, AgentRelay
from harness.engine.ray.relay_tls import relay_identity
from sandbox import health
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

MB = 1_000_000
PATIENCE_S = 15.0
"""How long a test asks again (each time a real call) for something that follows at once."""


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cbx-relay-") as tmp:
        yield Path(tmp) / "relay"


@pytest.fixture
def relay(state_dir: Path) -> Iterator[AgentRelay]:
    server = AgentRelay(bind_host="127.0.0.1", state_dir=state_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=0)


def socket_of(box: Any) -> str:
    return str(box.socket_dir / AGENT_SOCKET_NAME)


@contextlib.contextmanager
def remote_client(relay: AgentRelay, box: Any, token: str | None = None,
                  sandbox_id: str | None = None) -> Iterator[AgentClient]:
    token = token if token is not None else relay.register(box.id, socket_of(box))
    client = AgentClient.over_relay(relay.address, relay.certificate_pem, sandbox_id or box.id, token)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def sandbox(clean_sandbox: Any) -> Any:
    """The module's shared sandbox (reset before each test): the relay's guarantees hold for any
    sandbox, and each test registers it with a relay of its own. Tests that kill or destroy
    their sandbox, or need two, still make their own."""
    return clean_sandbox


@pytest.fixture
def remote(relay: AgentRelay, sandbox: Any) -> Iterator[AgentClient]:
    with remote_client(relay, sandbox) as client:
        yield client


def started(events: Iterator[Any]) -> Any:
    first = next(events)
    assert first.WhichOneof("event") == "started"
    return first.started


def wait_pid(box: Any, pid_file: str) -> int:
    """The pid a command wrote to ``pid_file``, once it has, asking the agent on the node (not
    through the relay); each probe is a real round trip."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        written = run(box, ["cat", pid_file]).stdout.data().strip()
        if written.isdigit():
            return int(written)
    pytest.fail(f"the command never wrote {pid_file}")


def wait_gone(box: Any, pid_file: str, within: float = 20.0) -> None:
    """Until the process whose pid is in ``pid_file`` is gone (at most ``within`` seconds):
    ``tail --pid`` in the sandbox waits for it, in one call to the agent on the node."""
    pid = wait_pid(box, pid_file)
    probe = f"timeout {within} tail --pid={pid} -s 0.05 -f /dev/null; kill -0 {pid} 2>/dev/null && echo alive"
    if run(box, probe, timeout_ms=int(within + 10) * 1000).stdout.data() == b"alive\n":
        pytest.fail(f"the command of {pid_file} outlived its cancelled call by {within:g} s")


def shell_output(events: Iterator[Any]) -> tuple[bytes, int, str]:
    out = b""
    for event in events:
        if event.WhichOneof("event") == "output" and event.output.WhichOneof("data") == "stdout":
            out += event.output.stdout
        elif event.WhichOneof("event") == "done":
            return out, event.done.exit_code, event.done.cwd
    raise AssertionError("the Run stream ended without ShellDone")


# ---- the calls themselves ------------------------------------------------------------------------


def test_exec_round_trip_and_a_bash_session_through_the_relay(remote: AgentClient) -> None:
    assert remote.health() == health.SERVING
    result = collect(remote.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]))
    assert (result.exit_code, result.stdout.data(), result.stderr.data()) == (3, b"out\n", b"err\n")
    assert collect(remote.exec("cat", stdin=b"fed through the relay")).stdout.data() == b"fed through the relay"
    assert shell_output(remote.shell_run("cd /tmp && x=5"))[1:] == (0, "/tmp")
    assert shell_output(remote.shell_run("echo $x $PWD")) == (b"5 /tmp\n", 0, "/tmp")


def test_every_kind_of_method_passes_as_a_stream_stream_call(
        remote: AgentClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unary, server-streaming, client-streaming: with no method known to take one request,
    the relay forwards every call as stream-stream, and each kind still works."""
    monkeypatch.setattr(relay_module, "UNARY_REQUEST_METHODS", frozenset())
    assert remote.health() == health.SERVING  # unary (grpc.health.v1)
    assert remote.write_file("dir/a.txt", b"hello\n", make_parents=True) == 6  # unary
    assert remote.read_file("dir/a.txt").data == b"hello\n"
    assert collect(remote.exec(["seq", "3"])).stdout.data() == b"1\n2\n3\n"  # server streaming
    copied = remote.transfer.upload_tar_stream("/workspace/dir", [_tar({"b.txt": b"uploaded"})])  # client streaming
    assert copied.files == 1
    assert collect(remote.exec(["cat", "dir/b.txt"])).stdout.data() == b"uploaded"


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_tunnel_gets_the_agents_initial_metadata_and_bytes_both_ways(sandbox: Any, remote: AgentClient) -> None:
    """Ports.Connect: bidirectional, and the tunnel counts as open on the agent's initial metadata."""
    program = ("import socket; s = socket.socket(); s.bind(('127.0.0.1', 9000)); s.listen(); print('ready');"
               "c, _ = s.accept(); c.sendall(c.recv(100)[::-1]); c.close()")
    job = sandbox.agent.jobs.start(["python3", "-u", "-c", program])
    try:
        output = b""
        for event in sandbox.agent.jobs.attach(job.pid, follow=True, timeout=30):
            if isinstance(event, JobChunk):
                output += event.data
                if b"ready" in output:
                    break
            assert not isinstance(event, JobEnded), output
        with remote.ports.connect(9000) as tunnel:
            tunnel.send(b"through the relay")
            tunnel.shutdown_write()
            assert b"".join(tunnel.recv()) == b"yaler eht hguorht"
    finally:
        with contextlib.suppress(AgentCallError):
            sandbox.agent.jobs.kill(job.pid)


RANDOM_WITH_DIGEST = """
import hashlib, os, sys
digest, out, left = hashlib.sha256(), sys.stdout.buffer, int(sys.argv[1])
while left:
    chunk = os.urandom(min(left, 1 << 20))
    digest.update(chunk)
    out.write(chunk)
    left -= len(chunk)
out.flush()
print(digest.hexdigest(), file=sys.stderr)
"""
"""Random bytes to stdout, their SHA-256 to stderr after them."""


def test_100_mb_come_out_byte_for_byte(remote: AgentClient) -> None:
    size = 100 * MB
    result = collect(remote.exec(["python3", "-c", RANDOM_WITH_DIGEST, str(size)], output_cap_bytes=2 * size,
                                 timeout_ms=120_000))
    assert result.exit_code == 0, result.stderr.data()
    assert result.stdout.total_bytes == size and not result.stdout.truncated
    data = result.stdout.data()
    assert len(data) == size
    assert result.stderr.data().decode().strip() == hashlib.sha256(data).hexdigest()


def test_the_agents_structured_errors_come_through(remote: AgentClient) -> None:
    with pytest.raises(AgentCallError) as info:
        remote.read_file("/etc/passwd")
    assert (info.value.reason, info.value.grpc_code) == ("PATH_ESCAPE", "PERMISSION_DENIED")
    assert "outside the allowed roots" in info.value.message
    with pytest.raises(AgentCallError) as info:
        remote.signal("nope", 15)
    assert (info.value.reason, info.value.grpc_code, info.value.retryable) == ("NO_SUCH_PROCESS", "NOT_FOUND", False)


# ---- deadlines and cancellation ------------------------------------------------------------------------


def test_the_callers_deadline_holds_through_the_relay(sandbox: Any, remote: AgentClient) -> None:
    began = time.monotonic()
    with pytest.raises(AgentCallError) as info:
        collect(remote.exec("echo $$ > /tmp/deadline.pid; exec sleep 60", timeout_ms=90_000, rpc_timeout=1.0))
    assert info.value.grpc_code == "DEADLINE_EXCEEDED"
    assert time.monotonic() - began < 5
    wait_gone(sandbox, "/tmp/deadline.pid")  # the relay's call ran out too, and the agent killed it


def test_cancelling_the_stream_kills_the_command(sandbox: Any, remote: AgentClient) -> None:
    events = remote.exec("echo $$ > /tmp/leader.pid; exec sleep 100", timeout_ms=60_000)
    started(events)
    wait_pid(sandbox, "/tmp/leader.pid")
    events.close()  # the client goes away: its call is cancelled, so is the relay's
    wait_gone(sandbox, "/tmp/leader.pid")


class Blackhole:
    """A TCP forwarder to ``target`` that can stop passing bytes without closing anything: a
    peer that vanished from the network, as a dead node looks to the harness."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
                self.sockets += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.frozen.is_set():
                    sink.sendall(data)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def test_a_peer_that_vanishes_fails_the_call_within_seconds_and_the_relay_cancels_it(
        sandbox: Any, relay: AgentRelay) -> None:
    """Keepalive both ways: the harness gives up on a silent relay in about three seconds
    (UNAVAILABLE: the sandbox is unreachable), and the relay, hearing nothing from the harness,
    cancels the call, so the agent kills the command."""
    token = relay.register(sandbox.id, socket_of(sandbox))
    hole = Blackhole(("127.0.0.1", int(relay.address.rsplit(":", 1)[1])))
    client = AgentClient.over_relay(f"127.0.0.1:{hole.port}", relay.certificate_pem, sandbox.id, token)
    try:
        events = client.exec("echo $$ > /tmp/vanish.pid; exec sleep 100", timeout_ms=90_000)
        started(events)
        wait_pid(sandbox, "/tmp/vanish.pid")
        hole.frozen.set()
        began = time.monotonic()
        with pytest.raises(AgentCallError) as info:
            collect(events)
        assert time.monotonic() - began < 10
        assert info.value.grpc_code == "UNAVAILABLE" and sandbox_gone(info.value), info.value
        wait_gone(sandbox, "/tmp/vanish.pid")
    finally:
        client.close()
        hole.close()


# ---- who may call ------------------------------------------------------------------------


def test_a_wrong_token_and_an_unknown_sandbox_are_refused_alike(relay: AgentRelay, sandbox: Any,
                                                                  make_sandbox: Any) -> None:
    first, second = sandbox, make_sandbox()  # a second sandbox of its own: two ids, two tokens
    token = relay.register(first.id, socket_of(first))
    other = relay.register(second.id, socket_of(second))
    assert token != other and relay.register(first.id, socket_of(first)) == token
    refusals = []
    for sandbox_id, presented in ((first.id, other), (first.id, token + "x"), ("no-such-sandbox", token),
                                  (second.id, token), (first.id, "")):
        with remote_client(relay, first, token=presented, sandbox_id=sandbox_id) as client, \
                pytest.raises(AgentCallError) as info:
            client.health()
        refusals.append((info.value.grpc_code, info.value.message))
    assert refusals == [("UNAUTHENTICATED", REFUSED)] * 5
    with remote_client(relay, first, token=token) as client:
        assert client.health() == health.SERVING


def test_a_call_without_credentials_is_refused(relay: AgentRelay, sandbox: Any) -> None:
    token = relay.register(sandbox.id, socket_of(sandbox))
    credentials = grpc.ssl_channel_credentials(root_certificates=relay.certificate_pem)
    with grpc.secure_channel(relay.address, credentials,
                             options=[("grpc.ssl_target_name_override", "callbox-relay")]) as channel:
        check = channel.unary_unary(health.CHECK_METHOD)  # bytes in, bytes out
        for metadata in ((), (("callbox-sandbox", sandbox.id),), (("authorization", f"Bearer {token}"),),
                         (("callbox-sandbox", sandbox.id), ("authorization", token))):  # no scheme
            with pytest.raises(grpc.RpcError) as info:
                check(b"", timeout=5, metadata=metadata)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        answer = check(b"", timeout=5, metadata=(("callbox-sandbox", sandbox.id), ("authorization", f"bearer {token}")))
        assert health.HealthCheckResponse.FromString(answer).status == health.SERVING


def test_a_plaintext_client_and_one_trusting_another_certificate_are_refused(
        relay: AgentRelay, sandbox: Any, tmp_path: Path) -> None:
    token = relay.register(sandbox.id, socket_of(sandbox))
    metadata = (("callbox-sandbox", sandbox.id), ("authorization", f"Bearer {token}"))
    with grpc.insecure_channel(relay.address) as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(health.CHECK_METHOD)(b"", timeout=5, metadata=metadata)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    impostor = relay_identity(tmp_path / "impostor", "127.0.0.1").certificate_pem  # same names, another key
    with AgentClient.over_relay(relay.address, impostor, sandbox.id, token) as client, \
            pytest.raises(AgentCallError) as failure:
        client.health(timeout=5)
    assert failure.value.grpc_code == "UNAVAILABLE"


def test_a_relay_over_its_stream_limit_refuses_at_once(state_dir: Path, sandbox: Any) -> None:
    small = AgentRelay(bind_host="127.0.0.1", state_dir=state_dir, max_streams=2)
    small.start()
    try:
        with remote_client(small, sandbox) as client:
            long_calls = [client.exec("exec sleep 100", timeout_ms=60_000) for _ in range(2)]
            for events in long_calls:
                started(events)
            with pytest.raises(AgentCallError) as info:
                client.health()
            assert (info.value.grpc_code, info.value.retryable) == ("RESOURCE_EXHAUSTED", True)
            assert "limit of 2 calls" in info.value.message
            long_calls[0].close()
            deadline = time.monotonic() + PATIENCE_S
            while time.monotonic() < deadline:  # the slot comes back once the relay's call has ended
                with contextlib.suppress(AgentCallError):
                    assert client.health() == health.SERVING
                    break
            else:
                pytest.fail("the relay never freed the slot of a cancelled call")
            long_calls[1].close()
    finally:
        small.stop(grace=0)


# ---- restarts and sandboxes that go ------------------------------------------------------------


def test_a_restarted_relay_accepts_the_old_token_and_the_client_reconnects(state_dir: Path, sandbox: Any) -> None:
    first = AgentRelay(bind_host="127.0.0.1", state_dir=state_dir)
    first.start()
    address, certificate = first.address, first.certificate_pem
    try:
        token = first.register(sandbox.id, socket_of(sandbox))
        client = AgentClient.over_relay(address, certificate, sandbox.id, token)
    finally:
        first.stop(grace=0)
    second = AgentRelay(bind_host="127.0.0.1", port=int(address.rsplit(":", 1)[1]), state_dir=state_dir)
    try:
        assert second.certificate_pem == certificate
        assert second.registered() == [sandbox.id]  # taken back from the state directory
        second.start()
        assert second.address == address
        assert collect(client.exec(["echo", "again"])).stdout.data() == b"again\n"
        assert second.register(sandbox.id, socket_of(sandbox)) == token
        assert (state_dir / relay_module.TOKENS_FILE).stat().st_mode & 0o777 == 0o600
        assert state_dir.stat().st_mode & 0o777 == 0o700
    finally:
        client.close()
        second.stop(grace=0)


def test_a_sandbox_killed_mid_call_reads_as_gone(make_sandbox: Any, relay: AgentRelay) -> None:
    box = make_sandbox()  # killed or destroyed here: a sandbox of its own
    with remote_client(relay, box) as client:
        events = client.exec("exec sleep 100", timeout_ms=60_000)
        started(events)
        box.engine.client.api.kill(box.container_id)  # the agent's socket closes under the relay
        with pytest.raises(AgentCallError) as info:
            collect(events)
    assert info.value.message.startswith(SANDBOX_GONE) and sandbox_gone(info.value), info.value


def test_a_sandbox_destroyed_by_its_host_mid_call_reads_as_gone(make_sandbox: Any, relay: AgentRelay) -> None:
    """As the node's host destroys one: unregistered from the relay first, then removed."""
    box = make_sandbox()  # killed or destroyed here: a sandbox of its own
    with remote_client(relay, box) as client:
        events = client.exec("exec sleep 100", timeout_ms=60_000)
        started(events)
        relay.unregister(box.id)
        box.destroy()
        with pytest.raises(AgentCallError) as info:
            collect(events)
        assert info.value.message.startswith(SANDBOX_GONE) and sandbox_gone(info.value), info.value
        with pytest.raises(AgentCallError) as info:
            client.health()  # and its token is gone with it
        assert info.value.grpc_code == "UNAUTHENTICATED"
    assert box.id not in relay.registered()


def test_a_registered_sandbox_whose_socket_is_gone_is_unavailable(relay: AgentRelay, sandbox: Any,
                                                                    tmp_path: Path) -> None:
    token = relay.register("gone-sandbox", str(tmp_path / "no-agent.sock"))
    with AgentClient.over_relay(relay.address, relay.certificate_pem, "gone-sandbox", token) as client, \
            pytest.raises(AgentCallError) as info:
        client.health()
    assert info.value.grpc_code == "UNAVAILABLE" and info.value.message.startswith(SANDBOX_GONE)


def test_a_call_cancelled_before_the_agent_answered_at_all_frees_the_relay(sandbox: Any, relay: AgentRelay) -> None:
    """A bash Run queued behind another in its session gets nothing from the agent (not even
    headers) until the first ends: cancelling it must still end the relay's call at once."""
    with remote_client(relay, sandbox) as client:
        first = client.shell_run("echo first; exec sleep 60", session_id="q", timeout_ms=90_000)
        assert next(first).output.stdout == b"first\n"
        scope = CallScope()
        outcome: list[BaseException] = []

        def queued() -> None:
            with current_scope(scope):
                try:
                    shell_output(client.shell_run("echo second", session_id="q", timeout_ms=90_000))
                except BaseException as error:
                    outcome.append(error)

        thread = threading.Thread(target=queued)
        thread.start()
        try:
            deadline = time.monotonic() + PATIENCE_S
            while relay.active < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert relay.active == 2
            scope.cancel()
            thread.join(PATIENCE_S)
            assert outcome and isinstance(outcome[0], AgentCallError) and outcome[0].grpc_code == "CANCELLED"
            deadline = time.monotonic() + 5
            while relay.active > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert relay.active == 1, "the relay still holds the cancelled call"
            assert client.health() == health.SERVING
        finally:
            first.close()
            thread.join(PATIENCE_S)
