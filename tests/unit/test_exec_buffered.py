"""ExecBuffered on the real ProcessRunner of this host: the Exec events in one answer, and the cap it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.errors import AgentError
from sandbox.process import MAX_BUFFERED_OUTPUT_CAP, ProcessRunner
from sandbox.v1 import errors_pb2, process_pb2


def test_the_answer_holds_started_the_output_and_exited_in_order(tmp_path: Path) -> None:
    runner = ProcessRunner(user=None, workspace=str(tmp_path))
    answer = runner.run_buffered(process_pb2.ExecRequest(shell="printf out; printf err >&2; exit 3"))
    kinds = [event.WhichOneof("event") for event in answer.events]
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert set(kinds[1:-1]) == {"output"}
    outputs = [event.output for event in answer.events[1:-1]]
    assert b"".join(o.stdout for o in outputs) == b"out"
    assert b"".join(o.stderr for o in outputs) == b"err"
    assert answer.events[-1].exited.exit_code == 3


def test_a_cap_over_one_answers_worth_is_refused_naming_exec(tmp_path: Path) -> None:
    runner = ProcessRunner(user=None, workspace=str(tmp_path))
    request = process_pb2.ExecRequest(shell="true", output_cap_bytes=MAX_BUFFERED_OUTPUT_CAP + 1)
    with pytest.raises(AgentError) as info:
        runner.run_buffered(request)
    assert info.value.reason == errors_pb2.ERROR_REASON_INVALID_ARGUMENT
    assert "use Exec" in info.value.message
    assert not runner._live  # nothing was started or reserved
