"""collect(): an Exec event stream, built by hand, folded into one ExecResult."""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Iterator

import pytest
from google.protobuf.duration_pb2 import Duration

from harness.engine.exec_result import ExecResult, StreamResult, collect, gap_marker
from sandbox.v1 import process_pb2

CORE_KEYS = {
    "exit_code",
    "signal",
    "timed_out",
    "oom_killed",
    "duration_ms",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
}
EXTRA_KEYS = {"stdout_dropped_bytes", "stderr_dropped_bytes"}


class Stream:
    """Builds an ExecEvent sequence the way the agent sends it."""

    def __init__(self, pid: int = 4242) -> None:
        self.events: list[process_pb2.ExecEvent] = [
            process_pb2.ExecEvent(started=process_pb2.Started(pid=pid, exec_id="e1"))
        ]
        self.seq = 0
        self.totals = {"stdout": 0, "stderr": 0}
        self.dropped = {"stdout": 0, "stderr": 0}

    def out(self, stream: str, data: bytes, dropped_before: int = 0) -> Stream:
        self.events.append(
            process_pb2.ExecEvent(
                output=process_pb2.Output(seq=self.seq, dropped_before=dropped_before, **{stream: data})
            )
        )
        self.seq += 1
        self.totals[stream] += len(data) + dropped_before
        self.dropped[stream] += dropped_before
        return self

    def exited(
        self,
        exit_code: int = 0,
        sig: int = 0,
        timed_out: bool = False,
        oom_killed: bool = False,
        nanos: int = 1_500_000,
    ) -> list[process_pb2.ExecEvent]:
        duration = Duration()
        duration.FromNanoseconds(nanos)
        self.events.append(
            process_pb2.ExecEvent(
                exited=process_pb2.Exited(
                    exit_code=exit_code,
                    signal=sig,
                    timed_out=timed_out,
                    oom_killed=oom_killed,
                    duration=duration,
                    stdout=process_pb2.StreamStats(
                        total_bytes=self.totals["stdout"], dropped_bytes=self.dropped["stdout"]
                    ),
                    stderr=process_pb2.StreamStats(
                        total_bytes=self.totals["stderr"], dropped_bytes=self.dropped["stderr"]
                    ),
                )
            )
        )
        return self.events


def test_plain_run_collects_both_streams_in_order() -> None:
    events = Stream(pid=77).out("stdout", b"one ").out("stderr", b"warn\n").out("stdout", b"two\n").exited(3)
    result = collect(events)
    assert result.pid == 77
    assert result.exit_code == 3
    assert result.signal == 0
    assert not result.timed_out
    assert not result.oom_killed
    assert result.stdout.data() == b"one two\n"
    assert result.stderr.data() == b"warn\n"
    assert result.stdout.rendered() == b"one two\n"
    assert not result.stdout.truncated
    assert result.stdout.total_bytes == 8
    assert result.stderr.total_bytes == 5


def test_duration_is_converted_to_milliseconds() -> None:
    result = collect(Stream().exited(nanos=2_345_678_000))
    assert result.duration_ms == pytest.approx(2345.678)
    assert result.to_json()["duration_ms"] == 2345.678


def test_truncated_stream_places_head_and_tail_and_counts_the_gap() -> None:
    events = (
        Stream()
        .out("stdout", b"HEAD1")
        .out("stdout", b"HEAD2")
        .out("stdout", b"TAIL", dropped_before=1000)
        .out("stderr", b"e")
        .exited()
    )
    result = collect(events)
    assert bytes(result.stdout.head) == b"HEAD1HEAD2"
    assert bytes(result.stdout.tail) == b"TAIL"
    assert result.stdout.dropped_bytes == 1000
    assert result.stdout.total_bytes == 1014
    assert result.stdout.truncated
    assert not result.stderr.truncated


def test_rendered_has_one_marker_naming_the_dropped_count() -> None:
    result = collect(Stream().out("stdout", b"AB").out("stdout", b"YZ", dropped_before=12345).exited())
    rendered = result.stdout.rendered()
    assert rendered == b"AB" + gap_marker(12345) + b"YZ"
    assert rendered.count(b"12345 bytes dropped") == 1
    assert b"\n[... 12345 bytes dropped ...]\n" in rendered


def test_data_has_no_marker() -> None:
    result = collect(Stream().out("stdout", b"AB").out("stdout", b"YZ", dropped_before=9).exited())
    assert result.stdout.data() == b"ABYZ"
    assert b"dropped" not in result.stdout.data()


def test_tail_without_a_gap_is_contiguous_and_not_truncated() -> None:
    # Output between half the cap and the cap: the tail arrives with dropped_before=0.
    result = collect(Stream().out("stdout", b"0123").out("stdout", b"45").exited())
    assert result.stdout.rendered() == b"012345"
    assert not result.stdout.truncated


def test_empty_tail_after_a_gap_still_marks_the_gap() -> None:
    # Cap 1: head 1 byte, tail 0 bytes; the agent sends an empty tail carrying the gap.
    result = collect(Stream().out("stdout", b"x").out("stdout", b"", dropped_before=99).exited())
    assert result.stdout.rendered() == b"x" + gap_marker(99)
    assert result.stdout.data() == b"x"


def test_everything_after_the_gap_is_tail() -> None:
    result = collect(Stream().out("stdout", b"h").out("stdout", b"t1", dropped_before=5).out("stdout", b"t2").exited())
    assert bytes(result.stdout.head) == b"h"
    assert bytes(result.stdout.tail) == b"t1t2"


def test_output_with_no_data_field_is_ignored() -> None:
    stream = Stream()
    stream.events.append(process_pb2.ExecEvent(output=process_pb2.Output(seq=0)))
    calls: list[str] = []
    result = collect(stream.exited(), on_output=lambda s, _d, _n: calls.append(s))
    assert calls == []
    assert result.stdout.data() == b""
    assert result.stderr.data() == b""


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"exit_code": 0}, 0),
        ({"exit_code": 3}, 3),
        ({"exit_code": 255}, 255),
        ({"exit_code": -1, "sig": signal.SIGTERM, "timed_out": True}, 124),
        ({"exit_code": -1, "sig": signal.SIGKILL, "timed_out": True}, 124),
        ({"exit_code": -1, "sig": signal.SIGKILL, "oom_killed": True}, 137),
        ({"exit_code": 137, "oom_killed": True}, 137),
        ({"exit_code": -1, "sig": signal.SIGKILL}, 137),
        ({"exit_code": -1, "sig": signal.SIGTERM}, 143),
        ({"exit_code": -1, "sig": signal.SIGSEGV}, 128 + signal.SIGSEGV),
        ({"exit_code": -1, "sig": signal.SIGINT}, 130),
    ],
)
def test_shell_exit_code(kwargs: dict[str, int], code: int) -> None:
    assert collect(Stream().exited(**kwargs)).shell_exit_code == code


def test_to_json_has_exactly_the_design_keys_plus_the_extras() -> None:
    result = collect(Stream().out("stdout", b"hi\n").exited(exit_code=1))
    obj = result.to_json()
    assert set(obj) == CORE_KEYS | EXTRA_KEYS
    assert obj["exit_code"] == 1
    assert obj["signal"] == 0
    assert obj["timed_out"] is False
    assert obj["oom_killed"] is False
    assert obj["stdout"] == "hi\n"
    assert obj["stderr"] == ""
    assert obj["stdout_truncated"] is False
    assert obj["stdout_dropped_bytes"] == 0
    assert json.loads(json.dumps(obj)) == obj


def test_to_json_reports_truncation_with_the_marker_in_the_text() -> None:
    result = collect(Stream().out("stderr", b"start").out("stderr", b"end", dropped_before=4096).exited(exit_code=0))
    obj = result.to_json()
    assert obj["stderr_truncated"] is True
    assert obj["stderr_dropped_bytes"] == 4096
    assert obj["stderr"] == "start\n[... 4096 bytes dropped ...]\nend"
    assert obj["stdout_truncated"] is False


def test_to_json_timeout_fields() -> None:
    obj = collect(Stream().exited(exit_code=-1, sig=signal.SIGKILL, timed_out=True)).to_json()
    assert obj["timed_out"] is True
    assert obj["signal"] == signal.SIGKILL
    assert obj["exit_code"] == -1


def test_utf8_output_has_no_base64() -> None:
    obj = collect(Stream().out("stdout", "héllo ✓\n".encode()).exited()).to_json()
    assert obj["stdout"] == "héllo ✓\n"
    assert "stdout_base64" not in obj
    assert "stderr_base64" not in obj


def test_non_utf8_output_gets_exact_base64_and_a_replacement_text() -> None:
    raw = b"ok \xff\xfe bytes"
    obj = collect(Stream().out("stderr", raw).out("stdout", b"fine").exited()).to_json()
    assert base64.b64decode(obj["stderr_base64"]) == raw
    assert obj["stderr"] == raw.decode("utf-8", errors="replace")
    assert "\ufffd" in obj["stderr"]
    assert "stdout_base64" not in obj
    assert set(obj) == CORE_KEYS | EXTRA_KEYS | {"stderr_base64"}


def test_on_output_is_called_in_event_order_with_dropped_before() -> None:
    calls: list[tuple[str, bytes, int]] = []
    events = (
        Stream()
        .out("stdout", b"a")
        .out("stderr", b"b")
        .out("stdout", b"c")
        .out("stdout", b"z", dropped_before=7)
        .out("stderr", b"y", dropped_before=3)
        .exited()
    )
    collect(events, on_output=lambda stream, data, dropped: calls.append((stream, data, dropped)))
    assert calls == [
        ("stdout", b"a", 0),
        ("stderr", b"b", 0),
        ("stdout", b"c", 0),
        ("stdout", b"z", 7),
        ("stderr", b"y", 3),
    ]


def test_on_output_sees_each_chunk_before_the_stream_ends() -> None:
    """Streaming: the callback runs while the stream is still being consumed."""
    seen_at_yield: list[int] = []
    calls: list[bytes] = []

    def gen() -> Iterator[process_pb2.ExecEvent]:
        stream = Stream()
        stream.out("stdout", b"first")
        yield from stream.events  # started + first output
        seen_at_yield.append(len(calls))
        yield from stream.exited()[2:]

    collect(gen(), on_output=lambda _s, data, _d: calls.append(data))
    assert seen_at_yield == [1]
    assert calls == [b"first"]


def test_stream_without_exited_raises() -> None:
    events = Stream().out("stdout", b"partial").events
    with pytest.raises(RuntimeError, match="without an Exited event"):
        collect(events)


def test_empty_stream_raises() -> None:
    with pytest.raises(RuntimeError, match="Exited"):
        collect(iter([]))


def test_events_after_exited_are_not_consumed() -> None:
    consumed: list[str] = []

    def gen() -> Iterator[process_pb2.ExecEvent]:
        for event in Stream().exited(exit_code=5):
            consumed.append(event.WhichOneof("event") or "")
            yield event
        consumed.append("after")
        yield process_pb2.ExecEvent(output=process_pb2.Output(stdout=b"late"))

    result = collect(gen())
    assert result.exit_code == 5
    assert consumed == ["started", "exited"]


def test_stream_result_and_exec_result_can_be_built_directly() -> None:
    out = StreamResult()
    out.add(b"a", 0)
    out.add(b"b", 2)
    out.dropped_bytes = 2
    result = ExecResult(
        exit_code=0,
        signal=0,
        timed_out=False,
        oom_killed=False,
        duration_ms=1.0,
        stdout=out,
        stderr=StreamResult(),
    )
    assert result.to_json()["stdout"] == "a" + gap_marker(2).decode() + "b"
    assert result.pid == 0
