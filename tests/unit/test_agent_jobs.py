"""Background jobs and terminals through the agent's real gRPC server (in this process, on a
unix socket, commands started by the pre-forked spawner) and the harness's JobsClient.

Waits are on the jobs' own output (events gathered by a thread), each bounded, never sleeps.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from harness.core.errors import AgentCallError
from harness.engine.agent_client import AgentClient
from harness.engine.jobs import JobChunk, JobEnded, JobGap, JobLive, gap_text
from sandbox import jobs as agent_jobs
from sandbox import jobterm, proctree
from sandbox.errors import AgentError
from sandbox.launch import Identity, SpawnerLauncher
from sandbox.server import Agent, AgentConfig, build_server
from sandbox.spawner import Spawner
from sandbox.v1 import jobs_pb2, jobs_pb2_grpc
from tests.job_follower import Follower

WAIT_S = 15.0


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[Agent, str]]:
    # A short directory: a unix socket's path is at most 108 bytes.
    short = tempfile.mkdtemp(prefix="cbx-jobs-", dir="/tmp")
    socket = os.path.join(short, "agent.sock")
    # A new interpreter, not a fork of this one: a fork would carry gRPC's fork handlers
    # (this process runs gRPC already) into every job it starts (the agent forks its
    # spawner before it imports gRPC).
    spawner = Spawner(fresh=True)
    built = build_server(AgentConfig(socket=socket, workspace=short, roots=[short], user=None,
                                     max_concurrent=8, spawner=spawner))
    built.server.add_insecure_port(f"unix:{socket}")
    built.server.start()
    try:
        yield built, socket
    finally:
        built.jobs.value().stop("the test module ended")
        built.runner.stop("the test module ended")
        built.server.stop(grace=1).wait()
        spawner.close()
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def client(agent: tuple[Agent, str]) -> Iterator[AgentClient]:
    with AgentClient(agent[1]) as c:
        yield c



def test_a_job_runs_detached_and_replays_its_output(client: AgentClient) -> None:
    info = client.jobs.start("echo out; echo err >&2; read go; echo after; exit 3", tag="demo", stdin=True)
    assert (info.state, info.tag, info.command[:2], info.pty) == ("running", "demo", ["bash", "-c"], False)
    live = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S)
    live.wait_for(b"out\n")
    assert any(j.pid == info.pid and j.state == "running" for j in client.jobs.list())

    client.jobs.write(info.pid, b"now\n", close=True)
    events = live.finish()
    assert sum(isinstance(e, JobLive) for e in events) == 1
    ended = events[-1]
    assert isinstance(ended, JobEnded)
    assert (ended.info.state, ended.info.exit_code, ended.info.signal) == ("exited", 3, 0)
    chunks = [e for e in events if isinstance(e, JobChunk)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out\nafter\n"

    # Replay of an ended job: all of it, then the end; from a later seq only the rest.
    replay = list(client.jobs.attach(info.pid))
    assert [e for e in replay if isinstance(e, JobChunk)] == chunks
    assert isinstance(replay[-1], JobEnded) and not any(isinstance(e, JobLive) for e in replay)
    tail = list(client.jobs.attach(info.pid, from_seq=chunks[-1].seq))
    assert tail == [chunks[-1], replay[-1]]
    got = client.jobs.get(info.pid)
    assert (got.state, got.next_seq, got.output_bytes, got.dropped_bytes) == ("exited", len(chunks), 14, 0)
    assert got.to_json()["exit_code"] == 3


def test_a_job_outlives_its_client(agent: tuple[Agent, str]) -> None:
    with AgentClient(agent[1]) as first:
        info = first.jobs.start(["sh", "-c", "echo started; read x; echo got $x"], stdin=True)
        Follower(first.jobs.attach(info.pid, follow=True), wait_s=WAIT_S).wait_for(b"started\n")
    with AgentClient(agent[1]) as second:
        assert second.jobs.get(info.pid).state == "running"
        second.jobs.write(info.pid, b"later\n")
        events = Follower(second.jobs.attach(info.pid, follow=True), wait_s=WAIT_S).finish()
        assert b"".join(e.data for e in events if isinstance(e, JobChunk)) == b"started\ngot later\n"


def test_kill_reaches_a_double_forked_tree_that_ignores_sigterm(agent: tuple[Agent, str],
                                                                client: AgentClient) -> None:
    script = r"""
        trap '' TERM
        ( setsid bash -c 'echo orphan $$; exec sleep 1000' & )
        echo leader $$
        exec sleep 1000
    """
    info = client.jobs.start(script)
    live = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S)
    orphan = int(live.wait_for(rb"orphan (\d+)").group(1))
    live.wait_for(b"leader")
    marker = agent[0].jobs.value().get(info.pid).marker
    assert orphan in set(proctree.marked_pids(marker))

    assert client.jobs.signal(info.pid, signal.SIGTERM) >= 2  # ignored by all of them
    assert psutil.Process(orphan).is_running() and client.jobs.get(info.pid).state == "running"

    killed = client.jobs.kill(info.pid)
    assert (killed.state, killed.signal, killed.exit_code, killed.oom_killed) == ("killed", signal.SIGKILL, None, False)
    assert list(proctree.marked_pids(marker)) == []
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert isinstance(live.finish()[-1], JobEnded)
    assert client.jobs.kill(info.pid).state == "killed"  # again: its final info


def test_leftovers_die_with_the_leader_unless_the_job_keeps_them(agent: tuple[Agent, str],
                                                                   client: AgentClient) -> None:
    # A daemon as Inspect AI's sandbox tools start theirs: double-forked, same session, the
    # job's output pipes closed; and one left in the background with `&`.
    script = "( exec sleep 1000 </dev/null >/dev/null 2>&1 & ); sleep 1001 </dev/null >/dev/null 2>&1 & echo up"
    pids: dict[bool, int] = {}
    try:
        for keep in (False, True):
            info = client.jobs.start(script, keep_leftovers=keep)
            ended = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S).finish()[-1]
            assert isinstance(ended, JobEnded) and ended.info.exit_code == 0
            marker = agent[0].jobs.value().get(info.pid).marker
            left = list(proctree.marked_pids(marker))
            if keep:
                assert len(left) == 2, left  # both live on, carrying the job's marker
                assert marker in agent[0].jobs.value()._leftover_markers  # never given to another job
                pids[keep] = marker
            else:
                assert left == []
    finally:
        for marker in pids.values():
            proctree.kill_marked(marker)


def test_refusals_name_the_fix(client: AgentClient) -> None:
    with pytest.raises(AgentCallError) as unknown:
        client.jobs.kill(999_999)
    assert unknown.value.reason == "NO_SUCH_PROCESS"
    assert "999999" in str(unknown.value) and "`List`" in str(unknown.value)
    with pytest.raises(AgentCallError) as missing:
        client.jobs.get(999_999)
    assert missing.value.reason == "NO_SUCH_PROCESS"

    info = client.jobs.start("echo ready; exec sleep 1000")
    try:
        with pytest.raises(AgentCallError, match="stdin=true") as no_stdin:
            client.jobs.write(info.pid, b"x")
        assert no_stdin.value.reason == "INVALID_ARGUMENT"
        with pytest.raises(AgentCallError, match="pty=true"):
            client.jobs.resize(info.pid, 10, 10)
        with pytest.raises(AgentCallError, match="past the job's output"):
            list(client.jobs.attach(info.pid, from_seq=1000))
    finally:
        client.jobs.kill(info.pid)
    with pytest.raises(AgentCallError, match="has ended"):
        client.jobs.signal(info.pid, signal.SIGTERM)
    with pytest.raises(AgentCallError, match="buffer_bytes"):
        client.jobs.start("true", buffer_bytes=100)
    with pytest.raises(AgentCallError) as not_found:
        client.jobs.start(["/no/such/program"])
    assert not_found.value.reason == "SPAWN_FAILED"

    # A Terminal's first message must attach.
    stub = jobs_pb2_grpc.JobsStub(client.channel)
    with pytest.raises(grpc.RpcError) as first:
        list(stub.Terminal(iter([jobs_pb2.TerminalInput(data=b"x")]), timeout=WAIT_S))
    assert first.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_running_jobs_and_streams_are_capped(client: AgentClient, monkeypatch: pytest.MonkeyPatch) -> None:
    running = sum(1 for j in client.jobs.list() if j.state == "running")
    monkeypatch.setattr(agent_jobs, "MAX_RUNNING", running + 1)
    info = client.jobs.start("exec sleep 1000")
    try:
        with pytest.raises(AgentCallError) as busy:
            client.jobs.start("true")
        assert busy.value.reason == "BUSY" and busy.value.retryable
        monkeypatch.setattr(agent_jobs, "MAX_STREAMS", 0)
        with pytest.raises(AgentCallError, match="close one first") as streams:
            list(client.jobs.attach(info.pid))
        assert streams.value.reason == "BUSY"
    finally:
        client.jobs.kill(info.pid)


def test_pty_job_has_a_terminal_that_resizes(client: AgentClient) -> None:
    info = client.jobs.start("tty; stty size; read line; stty size; echo got=$line", pty=True, rows=30, cols=100)
    assert info.pty
    live = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S)
    live.wait_for(rb"/dev/pts/\d+\r\n")
    live.wait_for(b"30 100\r\n")
    client.jobs.resize(info.pid, 50, 132)
    client.jobs.write(info.pid, b"hi\n")
    live.wait_for(b"50 132\r\n")
    events = live.finish()
    assert b"got=hi" in live.text
    assert {e.stream for e in events if isinstance(e, JobChunk)} == {"stdout"}
    ended = events[-1]
    assert isinstance(ended, JobEnded) and ended.info.exit_code == 0


def test_terminal_sends_keys_resizes_and_detaches(client: AgentClient) -> None:
    info = client.jobs.start(["bash", "--norc", "--noprofile", "-i"], pty=True, env={"PS1": "$ "})
    term = client.jobs.terminal(info.pid)
    live = Follower(term.events(), wait_s=WAIT_S)
    term.send(b"stty size; tty\n")
    live.wait_for(rb"24 80\r\n/dev/pts/\d+")
    term.resize(40, 120)
    term.send(b"stty size\n")
    live.wait_for(b"40 120")
    term.send(b"echo sent-just-before-close\n")
    term.close()  # while another thread reads: the agent still takes what was sent
    live.finish()
    assert client.jobs.get(info.pid).state == "running"  # detached, not killed
    replay = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S)
    replay.wait_for(rb"[\r\n]sent-just-before-close\r\n")  # the output, not the echo

    # Another terminal replays from where the first left off, then exits the shell.
    with client.jobs.terminal(info.pid, from_seq=client.jobs.get(info.pid).next_seq) as again:
        later = Follower(again.events(), wait_s=WAIT_S)
        again.send(b"echo second; exit 7\n")
        later.wait_for(b"second")
        events = later.finish()
    ended = events[-1]
    assert isinstance(ended, JobEnded) and ended.info.exit_code == 7
    assert not any(b"40 120" in e.data for e in events if isinstance(e, JobChunk))


def test_a_small_buffer_drops_the_oldest_output_and_says_how_much(client: AgentClient) -> None:
    # 200 lines of 100 bytes; the 4 KiB buffer holds the last few dozen chunks at most.
    info = client.jobs.start("for i in $(seq 1000 1199); do printf '%099d\\n' $i; done", buffer_bytes=4096)
    events = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S).finish()
    assert isinstance(events[-1], JobEnded)
    final = client.jobs.get(info.pid)
    assert final.output_bytes == 200 * 100 and final.dropped_bytes > 0
    replay = list(client.jobs.attach(info.pid))
    gap, chunks = replay[0], [e for e in replay if isinstance(e, JobChunk)]
    assert isinstance(gap, JobGap)
    assert (gap.first_seq, gap.end_seq) == (0, chunks[0].seq)
    assert gap.dropped_bytes == final.dropped_bytes == 200 * 100 - sum(len(c.data) for c in chunks)
    held = b"".join(c.data for c in chunks)
    assert 2048 < len(held) <= 4096 and (b"".join(b"%099d\n" % i for i in range(1000, 1200))).endswith(held)
    assert gap_text(gap) == f"\n[callbox: {gap.dropped_bytes} bytes (chunks 0-{gap.end_seq - 1}) dropped]\n".encode()


def test_a_job_that_holds_its_output_waits_for_its_follower_and_loses_nothing(client: AgentClient) -> None:
    # 2.4 MB through a 4 KiB buffer: without holding, the follower above lost most of 20 kB.
    info = client.jobs.start("seq 1 333333", buffer_bytes=4096, hold_output=True)
    events = Follower(client.jobs.attach(info.pid, follow=True), wait_s=WAIT_S).finish()
    assert isinstance(events[-1], JobEnded) and events[-1].info.exit_code == 0
    assert not [e for e in events if isinstance(e, JobGap)]
    text = b"".join(e.data for e in events if isinstance(e, JobChunk))
    assert text == b"".join(b"%d\n" % i for i in range(1, 333334))
    assert client.jobs.get(info.pid).output_bytes == len(text)  # evicted from the replay buffer once sent


def test_a_follower_that_leaves_no_longer_holds_the_job(client: AgentClient) -> None:
    info = client.jobs.start("seq 1 333333; echo done", buffer_bytes=4096, hold_output=True)
    first = client.jobs.attach(info.pid, follow=True)
    assert isinstance(next(e for e in first if isinstance(e, JobChunk)), JobChunk)
    first.close()  # the job waited for this stream; with no one following it runs on, keeping the newest
    deadline = time.monotonic() + WAIT_S
    while client.jobs.get(info.pid).state == "running":
        assert time.monotonic() < deadline, "the job still waits for a follower that left"
        time.sleep(0.05)
    replay = list(client.jobs.attach(info.pid))
    assert isinstance(replay[0], JobGap) and replay[0].dropped_bytes > 0
    assert b"".join(e.data for e in replay if isinstance(e, JobChunk)).endswith(b"333333\ndone\n")


def test_closing_an_attach_early_cancels_it(client: AgentClient, monkeypatch: pytest.MonkeyPatch) -> None:
    detached = threading.Event()
    cancel = jobterm.Detach.cancel

    def noted_cancel(self: jobterm.Detach) -> None:
        detached.set()
        cancel(self)

    monkeypatch.setattr(jobterm.Detach, "cancel", noted_cancel)
    info = client.jobs.start("echo one; exec sleep 1000")
    try:
        events = client.jobs.attach(info.pid, follow=True)
        first = next(e for e in events if isinstance(e, JobChunk))
        assert first.data == b"one\n"
        events.close()  # the stream is cancelled; the job is untouched
        assert detached.wait(WAIT_S)
        assert client.jobs.get(info.pid).state == "running"
        # A timeout ends a following attach quietly; the job runs on.
        again = list(client.jobs.attach(info.pid, follow=True, timeout=0.5))
        assert again[0] == first and isinstance(again[-1], JobLive)
    finally:
        client.jobs.kill(info.pid)


def test_stop_kills_every_job_and_refuses_new_ones(tmp_path: Path) -> None:
    manager = agent_jobs.JobManager(None, str(tmp_path))  # the direct launcher
    try:
        job = manager.start(jobs_pb2.JobStartRequest(shell="trap '' TERM; exec sleep 1000"))
        manager.stop("the test says so")
        assert job.info().state == jobs_pb2.JOB_STATE_KILLED
        with pytest.raises(AgentError, match="the test says so") as refused:
            manager.start(jobs_pb2.JobStartRequest(shell="true"))
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        manager.stop("cleanup")


def test_a_nul_in_the_environment_leaves_the_spawner_alive(tmp_path: Path) -> None:
    # Popen refuses it before forking; the spawner answers EINVAL and serves the next command.
    spawner = Spawner()
    try:
        launcher = SpawnerLauncher(spawner)
        with pytest.raises(OSError, match="null byte"):
            launcher.launch(["true"], str(tmp_path), {"A": "x\0y"}, Identity(None, None, None), with_stdin=False)
        child = launcher.launch(["true"], str(tmp_path), {}, Identity(None, None, None), with_stdin=False)
        assert child.reap() == 0
        child.close_pipes()
    finally:
        spawner.close()
