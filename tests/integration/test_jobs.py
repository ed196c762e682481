"""Background jobs and terminals in a real sandbox: replay with an exact gap, a whole tree
killed, a PTY bash, and a job that outlives the client that started it.

One sandbox serves the module; each test cleans up its jobs. Waits are on the jobs' own
output (events gathered by a thread), each bounded.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from harness.engine.agent_client import AgentClient
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME
from harness.engine.jobs import JobChunk, JobEnded, JobGap
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE
from tests.integration.helpers import run
from tests.job_follower import Follower

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def box(engine: Any) -> Iterator[Any]:
    sandbox = engine.create(SandboxSpec(image=IMAGE))
    try:
        yield sandbox
    finally:
        sandbox.destroy()



def test_output_past_the_buffer_is_replayed_from_seq_0_with_the_exact_gap(box: Any) -> None:
    expected = b"".join(b"%d\n" % i for i in range(1, 400_001))  # 2.7 MB
    info = box.agent.jobs.start("seq 1 400000", buffer_bytes=256 << 10)
    ended = Follower(box.agent.jobs.attach(info.pid, follow=True)).finish()[-1]
    assert isinstance(ended, JobEnded) and ended.info.exit_code == 0
    assert ended.info.output_bytes == len(expected)

    replay = list(box.agent.jobs.attach(info.pid, from_seq=0))
    gap = replay[0]
    chunks = [e for e in replay if isinstance(e, JobChunk)]
    held = b"".join(c.data for c in chunks)
    assert isinstance(gap, JobGap) and isinstance(replay[-1], JobEnded)
    assert (gap.first_seq, gap.end_seq) == (0, chunks[0].seq)
    assert [c.seq for c in chunks] == list(range(gap.end_seq, ended.info.next_seq))
    assert 128 << 10 < len(held) <= 256 << 10
    assert expected.endswith(held)
    assert gap.dropped_bytes == len(expected) - len(held) == ended.info.dropped_bytes


def test_kill_leaves_nothing_of_a_double_forked_tree_that_ignores_sigterm(box: Any) -> None:
    script = r"""
        trap '' TERM
        ( setsid bash -c 'echo orphan $$; exec -a cbx-job-orphan sleep 1000' & )
        ( trap '' TERM; exec -a cbx-job-child sleep 1000 ) &
        echo leader $$
        exec -a cbx-job-leader sleep 1000
    """
    info = box.agent.jobs.start(script, tag="tree")
    live = Follower(box.agent.jobs.attach(info.pid, follow=True))
    orphan = live.wait_for(rb"orphan (\d+)").group(1).decode()
    live.wait_for(b"leader")
    before = run(box, "ps -eo pid,args").stdout.data().decode()
    assert all(name in before for name in ("cbx-job-orphan", "cbx-job-child", "cbx-job-leader")), before

    assert box.agent.jobs.signal(info.pid, signal.SIGTERM) >= 3  # every one ignores it
    assert box.agent.jobs.get(info.pid).state == "running"

    killed = box.agent.jobs.kill(info.pid)
    assert (killed.state, killed.signal, killed.tag) == ("killed", signal.SIGKILL, "tree")
    assert isinstance(live.finish()[-1], JobEnded)
    after = run(box, "ps -eo pid,stat,args").stdout.data().decode()
    assert "cbx-job" not in after, after
    gone = run(box, f"test -e /proc/{orphan} && cat /proc/{orphan}/stat || echo gone").stdout.data()
    assert gone == b"gone\n"


def test_a_pty_bash_has_a_terminal_that_follows_resizes(box: Any) -> None:
    info = box.agent.jobs.start(["bash", "--norc", "--noprofile", "-i"], pty=True, rows=24, cols=80,
                                env={"PS1": "$ "})
    try:
        with box.agent.jobs.terminal(info.pid) as term:
            live = Follower(term.events())
            term.send(b"tty; stty size; stat -c owner=%u $(tty); id -u; echo $TERM\n")
            tty = live.wait_for(rb"(/dev/pts/\d+)\r\n").group(1)
            live.wait_for(b"24 80\r\n")
            owner = live.wait_for(rb"owner=(\d+)\r\n(\d+)\r\n")
            assert owner.group(1) == owner.group(2) != b"0"  # the terminal is the tool user's
            live.wait_for(b"xterm-256color")
            term.resize(50, 132)
            term.send(b"stty size\n")
            live.wait_for(b"50 132\r\n")
        # Detached: the shell runs on; a resize through the unary call reaches it too.
        box.agent.jobs.resize(info.pid, 33, 99)
        box.agent.jobs.write(info.pid, b"stty size; tty; exit 5\n")
        events = Follower(box.agent.jobs.attach(info.pid, follow=True)).finish()
        text = b"".join(e.data for e in events if isinstance(e, JobChunk))
        assert b"33 99\r\n" + tty in text
        assert isinstance(events[-1], JobEnded) and events[-1].info.exit_code == 5
    finally:
        if box.agent.jobs.get(info.pid).state == "running":
            box.agent.jobs.kill(info.pid)


def test_a_job_outlives_the_call_and_the_client_that_started_it(box: Any) -> None:
    socket = str(box.socket_dir / AGENT_SOCKET_NAME)
    with AgentClient(socket) as starter:
        info = starter.jobs.start("id -u; pwd; echo waiting; read word; echo heard $word", stdin=True)
    with AgentClient(socket) as later:
        job = later.jobs.get(info.pid)
        assert job.state == "running"
        live = Follower(later.jobs.attach(info.pid, follow=True))
        live.wait_for(b"waiting\n")
        later.jobs.write(info.pid, b"you\n")
        events = live.finish()
    lines = b"".join(e.data for e in events if isinstance(e, JobChunk)).splitlines()
    assert lines[0] != b"0" and lines[1] == b"/workspace"
    assert lines[2:] == [b"waiting", b"heard you"]
    assert isinstance(events[-1], JobEnded) and events[-1].info.exit_code == 0
