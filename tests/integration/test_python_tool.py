"""The ``python`` tool in a real code-interpreter sandbox, through the harness's call path: state
across calls, a chart as a PNG image part, a DataFrame as a text table, an exception's traceback,
a timeout that keeps the kernel, a dead kernel restarted, the policy on the code; and the default image's clear refusal.

One sandbox (one kernel) for the module: the cells run in order and share its state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.context import OutputSink, ToolContext
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import VARIANTS, build_variant
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from harness.tools.python_kernel import PYTHON, PythonArgs

pytestmark = pytest.mark.docker

POLICY = parse_policy("""
[[tools.python.rules]]
action = "deny"
command = "*shutil.rmtree*"
reason = "no trees are removed here"
""")


@pytest.fixture(scope="module")
def session(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    audit_path: Path = tmp_path_factory.mktemp("python-tool") / "audit.sqlite3"
    with AuditStore(audit_path) as audit, Session(
        builtin_registry(), POLICY, audit, spec=SandboxSpec(image=VARIANTS["code-interpreter"].tag),
        engine_factory=lambda: engine,
    ) as running:
        yield running


def _call(session: Session, code: str, call_id: str, **args: Any) -> ToolResult:
    return session.call(ToolCall("python", {"code": code, **args}, call_id))


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _ctx(box: Any, on_output: OutputSink | None = None) -> ToolContext:
    return ToolContext(run_id="python-tool", call_id="direct", provider=_Provider(box), default_timeout_s=30.0,
                       timeout_ceiling_s=60.0, output_budget=30_000, on_output=on_output)


def test_state_persists_across_calls(session: Session) -> None:
    first = _call(session, "x = 41\nprint('set', flush=True)", "s1")
    assert (first.is_error, first.text) == (False, "set"), first.text
    second = _call(session, "x + 1", "s2")
    assert not second.is_error, second.text
    assert second.text.endswith(": 42") and second.text.startswith("Out[")


def test_a_chart_is_a_png_of_the_figures_size(session: Session) -> None:
    # The inline backend crops a figure to its drawing (bbox_inches="tight"), as Jupyter does;
    # without the crop the PNG is the figure's size in inches times its dpi.
    code = ("%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
            "import matplotlib.pyplot as plt\n"
            "fig = plt.figure(figsize=(6.4, 4.8), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()")
    result = _call(session, code, "chart")
    assert not result.is_error, result.text
    assert "(image 1)" in result.text and result.structured is not None and result.structured["images"] == 1
    # The part the call path checked against the policy's bounds, as every door carries it.
    [part] = result.images
    assert (part.media_type, part.width, part.height) == ("image/png", 640, 480)
    assert part.data.startswith(b"\x89PNG") and len(part.data) > 1000


def test_output_streams_as_it_comes(session: Session) -> None:
    chunks: list[tuple[str, bytes]] = []
    code = "import sys\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)"
    out = PYTHON.handler(_ctx(session.sandbox(), lambda stream, data: chunks.append((stream, data))),
                         PythonArgs(code=code))
    assert out.text == "out\nerr" and chunks == [("stdout", b"out\n"), ("stderr", b"err\n")]


def test_a_dataframe_is_a_text_table(session: Session) -> None:
    result = _call(session, "import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'n': [1, 22]})", "df")
    assert not result.is_error, result.text
    lines = result.text.splitlines()
    assert lines[0].startswith("Out[") and lines[1:] == ["  name   n", "0    a   1", "1    b  22"], result.text


def test_an_exception_is_an_error_with_its_traceback(session: Session) -> None:
    result = _call(session, "def f():\n    return 1 / 0\nf()", "boom")
    assert (result.is_error, result.error) == (True, ErrorCode.TOOL_FAILED)
    assert "Traceback" in result.text and "return 1 / 0" in result.text
    assert result.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "\x1b[" not in result.text
    assert result.structured is not None and result.structured["error"]["name"] == "ZeroDivisionError"


def test_a_timeout_interrupts_the_cell_and_keeps_the_kernel(session: Session) -> None:
    result = _call(session, "y = 7\nprint('before', flush=True)\nimport time\ntime.sleep(60)", "slow", timeout_ms=1000)
    assert (result.is_error, result.error) == (True, ErrorCode.TIMED_OUT), result.text
    assert result.text.startswith("before\nThe cell was interrupted after")
    after = _call(session, "print(y)", "after")
    assert (after.is_error, after.text) == (False, "7"), after.text


def test_a_dead_kernel_is_restarted_and_its_state_is_gone(session: Session) -> None:
    _call(session, "z = 5", "z")
    died = _call(session, "import os\nos._exit(1)", "die")
    assert (died.is_error, died.error) == (True, ErrorCode.TOOL_FAILED), died.text
    assert "The kernel exited during the cell." in died.text and "has been restarted" in died.text
    after = _call(session, "'z' in globals()", "fresh")
    assert (after.is_error, after.text.split(": ", 1)[-1]) == (False, "False"), after.text


def test_the_policy_sees_the_code(session: Session) -> None:
    result = _call(session, "import shutil\nshutil.rmtree('/workspace')", "denied")
    assert (result.is_error, result.error) == (True, ErrorCode.DENIED)
    assert "no trees are removed here" in result.text


def test_the_default_image_has_no_kernel_and_says_what_to_change(sandbox: Any) -> None:
    out = PYTHON.handler(_ctx(sandbox), PythonArgs(code="print(1)"))
    assert (out.is_error, out.error) == (True, ErrorCode.NOT_SUPPORTED)
    assert f'image = "{VARIANTS["code-interpreter"].tag}"' in out.text and "[sandbox]" in out.text
