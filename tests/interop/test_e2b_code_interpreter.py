"""``e2b_code_interpreter`` (from PyPI, unmodified) against ``callbox serve --e2b``.

As a program written for E2B's code interpreter uses it: ``Sandbox.create()`` with the SDK's
own default template (``code-interpreter-v1``), then ``run_code``, contexts and files. The
code-interpreter image variant is built first when it is missing (cached afterwards; see
``harness/engine/image/variants.py``). One server and one sandbox for the module: kernels are
slow to start, and each test uses names of its own.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import struct
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox as BaseSandbox
from e2b import SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScaleType,
    ScatterChart,
    SuperChart,
)

from harness.audit.store import AuditStore
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

DENIED_REASON = "the interpreter removes no trees"
POLICY = policy_text(f"""
[tools.shell]
[[tools.shell.rules]]
action = "deny"
command = "*shutil.rmtree*"
reason = "{DENIED_REASON}"
""")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    with serve_e2b(engine, policy=POLICY) as served:
        yield served


@pytest.fixture(scope="module")
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    with sdk_environment(server):
        sbx = Sandbox.create(timeout=600)
        try:
            yield sbx
        finally:
            sbx.kill()


def test_the_sdk_default_template_is_the_code_interpreter(sandbox: Sandbox, server: E2bServer) -> None:
    with sdk_environment(server):
        info = sandbox.get_info()
    assert info.template_id == "code-interpreter-v1"


def test_state_is_kept_across_cells(sandbox: Sandbox) -> None:
    first = sandbox.run_code("kept = 41\nprint('set')")
    assert first.error is None, first.error
    assert first.logs.stdout == ["set\n"]
    second = sandbox.run_code("kept + 1")
    assert second.text == "42"
    assert second.results[0].is_main_result
    assert first.execution_count is not None and second.execution_count == first.execution_count + 1
    magic = sandbox.run_code("%pwd")  # IPython's magics work as in Jupyter
    assert magic.text == "'/home/user'"


def _decoded_png(encoded: str | None) -> tuple[int, int]:
    """The width and height of a base64 PNG (it decodes and has a PNG's header)."""
    assert encoded
    data = base64.b64decode(encoded)
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_matplotlib_chart_arrives_as_png_and_as_its_data(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [3, 1, 2], label='fuel')\nplt.plot([1, 3], [0.5, 4.5])\n"
        "plt.title('callbox')\nplt.xlabel('time (s)')\nplt.ylabel('level [l]')\nplt.show()")
    assert execution.error is None, execution.error
    assert [r.formats() for r in execution.results] == [["text", "png", "chart"]], execution.results
    width, height = _decoded_png(execution.results[0].png)
    assert width > 100 and height > 100, (width, height)
    chart = execution.results[0].chart
    assert isinstance(chart, LineChart), chart
    assert chart.type == ChartType.LINE and chart.title == "callbox"
    assert (chart.x_label, chart.x_unit, chart.y_label, chart.y_unit) == ("time (s)", "s", "level [l]", "l")
    assert chart.x_scale == ScaleType.LINEAR and 2.0 in chart.x_ticks and "2.00" in chart.x_tick_labels
    assert [(e.label, e.points) for e in chart.elements] == [
        ("fuel", [(1.0, 3.0), (2.0, 1.0), (3.0, 2.0)]), ("Line 1", [(1.0, 0.5), (3.0, 4.5)])]
    last = sandbox.run_code("fig, ax = plt.subplots()\nax.plot([0, 1], [2, 3])\nplt.close(fig)\nfig")
    assert last.error is None, last.error
    assert [(r.is_main_result, r.formats()) for r in last.results] == [(True, ["text", "png", "chart"])]
    assert isinstance(last.results[0].chart, LineChart)
    assert last.results[0].chart.elements[0].points == [(0.0, 2.0), (1.0, 3.0)]


def test_bars_a_pie_and_a_figure_of_two_axes_arrive_as_charts(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt, numpy as np\n"
        "fig, ax = plt.subplots()\nax.bar(['cpu', 'ram'], [3, 5], label='2025')\n"
        "ax.bar(['cpu', 'ram'], [1, 2], bottom=[3, 5], label='2026')\nax.set_xlabel('resource')\n"
        "fig, ax = plt.subplots()\nax.pie([1, 2, 3], labels=['a', 'b', 'c'])\nax.set_title('share')\n"
        "fig, (left, right) = plt.subplots(1, 2)\nfig.suptitle('both')\n"
        "left.scatter([1, 2], [4, 5])\nright.boxplot([[1, 2, 3, 4, 50]], labels=['load'])\n"
        "fig, ax = plt.subplots()\nax.imshow(np.eye(3))\n"
        "plt.show()")
    assert execution.error is None, execution.error
    assert len(execution.results) == 4, execution.results
    for result in execution.results:  # every figure's PNG beside its chart
        _decoded_png(result.png)
    bars, pie, both, image = (r.chart for r in execution.results)
    assert isinstance(bars, BarChart) and bars.x_label == "resource"
    assert [(e.label, e.value, e.group) for e in bars.elements] == [
        ("cpu", 3.0, "2025"), ("ram", 5.0, "2025"), ("cpu", 1.0, "2026"), ("ram", 2.0, "2026")]
    assert isinstance(pie, PieChart) and pie.title == "share"
    assert [(e.label, e.angle, e.radius) for e in pie.elements] == [("a", 60.0, 1.0), ("b", 120.0, 1.0),
                                                                   ("c", 180.0, 1.0)]
    assert isinstance(both, SuperChart) and both.title == "both"
    scatter, box = both.elements
    assert isinstance(scatter, ScatterChart) and scatter.elements[0].points == [(1.0, 4.0), (2.0, 5.0)]
    assert isinstance(box, BoxAndWhiskerChart)
    assert [(e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers)
            for e in box.elements] == [("load", 1.0, 2.0, 3.0, 4.0, 4.0, [50.0])]
    assert image is not None and image.type == ChartType.UNKNOWN


def test_a_figure_whose_chart_fails_still_arrives_as_png(sandbox: Sandbox) -> None:
    # The extension is no name in the user's namespace; broken on purpose here, for this cell only.
    execution = sandbox.run_code(
        "import sys, matplotlib.pyplot as plt\n"
        "print(sorted({'extensions', 'spec', 'module', 'IPKernelApp', 'charts'} & set(globals())))\n"
        "charts = sys.modules['_callbox_charts']\nkept_reader = charts.axes_chart\n"
        "charts.axes_chart = lambda ax: 1 / 0\n"
        "try:\n    plt.plot([1, 2])\n    plt.show()\nfinally:\n    charts.axes_chart = kept_reader")
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["[]\n"] and execution.logs.stderr == [], execution.logs
    assert [r.formats() for r in execution.results] == [["text", "png"]], execution.results
    _decoded_png(execution.results[0].png)


def test_a_dataframe_arrives_as_html(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'n': [1, 2]})")
    assert execution.error is None, execution.error
    main = [r for r in execution.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].html is not None and "<table" in main[0].html and "<td>b</td>" in main[0].html
    assert main[0].text is not None and "name" in main[0].text


def test_an_exception_arrives_as_an_error(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("def broken():\n    return 1 / 0\nbroken()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", execution.error.traceback)  # colored, as Jupyter's (and E2B's)
    assert "broken()" in plain and "return 1 / 0" in plain and "ZeroDivisionError" in plain, plain
    assert execution.results == []


def test_env_vars_hold_for_one_cell(sandbox: Sandbox) -> None:
    inside = sandbox.run_code("import os\nos.environ.get('CALLBOX_ONE')", envs={"CALLBOX_ONE": "one"})
    assert inside.text == "'one'"
    after = sandbox.run_code("os.environ.get('CALLBOX_ONE', 'gone')")
    assert after.text == "'gone'"


def test_a_timeout_interrupts_the_cell_and_the_kernel_keeps_its_state(sandbox: Sandbox) -> None:
    sandbox.run_code("survivor = 'still here'")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\nfor _ in range(600):\n    time.sleep(0.2)", timeout=3)
    # Not interrupted, the loop would hold the kernel for two minutes and this cell would wait
    # for it (the SDK's own timeout does not bound the wait for a response's head).
    began = time.monotonic()
    after = sandbox.run_code("survivor", timeout=60)
    waited = time.monotonic() - began
    assert after.text == "'still here'"
    assert waited < 60, f"the next cell waited {waited:.0f} s: the timed-out cell was not interrupted"


def test_two_contexts_stay_apart_and_restart_clears_one(sandbox: Sandbox) -> None:
    one = sandbox.create_code_context()
    two = sandbox.create_code_context(cwd="/tmp")
    try:
        assert one.language == "python" and two.cwd == "/tmp"
        sandbox.run_code("where = 'one'", context=one)
        sandbox.run_code("where = 'two'", context=two)
        assert sandbox.run_code("where", context=one).text == "'one'"
        assert sandbox.run_code("import os\nos.getcwd()", context=two).text == "'/tmp'"
        assert {one.id, two.id} <= {c.id for c in sandbox.list_code_contexts()}
        sandbox.restart_code_context(one)
        cleared = sandbox.run_code("where", context=one)
        assert cleared.error is not None and cleared.error.name == "NameError"
        assert sandbox.run_code("where", context=two).text == "'two'"
    finally:
        sandbox.remove_code_context(one)
        sandbox.remove_code_context(two.id)
    assert {one.id, two.id}.isdisjoint({c.id for c in sandbox.list_code_contexts()})


def test_a_bash_context_keeps_its_state_and_reports_a_failing_command(sandbox: Sandbox) -> None:
    shell = sandbox.create_code_context(language="bash", cwd="/home/user")
    try:
        assert shell.language == "bash"
        first = sandbox.run_code("kept=41\ncd /tmp\necho set\necho careful >&2", context=shell)
        assert first.error is None, first.error
        assert first.logs.stdout == ["set\n"] and first.logs.stderr == ["careful\n"], first.logs
        second = sandbox.run_code("echo $((kept + 1)) $PWD", context=shell)
        assert second.logs.stdout == ["42 /tmp\n"], second.logs
        inside = sandbox.run_code("echo $CALLBOX_ONE", context=shell, envs={"CALLBOX_ONE": "one"})
        assert inside.logs.stdout == ["one\n"]
        assert sandbox.run_code("echo ${CALLBOX_ONE:-gone}", context=shell).logs.stdout == ["gone\n"]
        failed = sandbox.run_code("ls /callbox-nothing-here", context=shell)
        assert failed.error is not None, failed
        assert (failed.error.name, failed.error.value) == ("ExitStatus", "2")
        assert any("callbox-nothing-here" in line for line in failed.logs.stderr), failed.logs
    finally:
        sandbox.remove_code_context(shell)


def test_a_bash_timeout_interrupts_the_cell_and_the_shell_keeps_its_state(sandbox: Sandbox) -> None:
    set_up = sandbox.run_code("survivor='still here'; cd /tmp", language="bash")
    assert set_up.error is None, set_up.error
    with pytest.raises(TimeoutException):
        sandbox.run_code("sleep 600; echo too late", language="bash", timeout=3)
    began = time.monotonic()
    after = sandbox.run_code("echo $survivor $PWD", language="bash", timeout=60)
    waited = time.monotonic() - began
    assert after.logs.stdout == ["still here /tmp\n"], after.logs
    assert waited < 60, f"the next cell waited {waited:.0f} s: the timed-out sleep was not interrupted"


def test_a_javascript_context_keeps_its_state_and_returns_the_last_value(sandbox: Sandbox) -> None:
    first = sandbox.run_code("const base = 40; console.log('hello'); console.error('careful')", language="js")
    assert first.error is None, first.error
    assert first.logs.stdout == ["hello\n"] and first.logs.stderr == ["careful\n"], first.logs
    assert first.results == []
    second = sandbox.run_code("base + 2", language="javascript")
    assert second.text == "42" and second.results[0].is_main_result
    env = sandbox.run_code("process.env.CALLBOX_ONE", language="js", envs={"CALLBOX_ONE": "one"})
    assert env.text == "one"
    assert sandbox.run_code("process.env.CALLBOX_ONE || 'gone'", language="js").text == "gone"
    assert any(c.language == "javascript" for c in sandbox.list_code_contexts())


def test_a_javascript_exception_arrives_as_an_error(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("function broken() {\n  throw new TypeError('no good')\n}\nbroken()", language="js")
    assert execution.error is not None, execution
    assert (execution.error.name, execution.error.value) == ("TypeError", "no good")
    assert "at broken" in execution.error.traceback, execution.error.traceback
    assert execution.results == []


def test_a_typescript_context_keeps_its_state_and_returns_the_last_value(sandbox: Sandbox) -> None:
    context = sandbox.create_code_context(language="typescript")
    assert context.language == "typescript"
    declared = sandbox.run_code(
        "interface Point { x: number; y: number }\n"
        "function size(p: Point): number { return Math.abs(p.x) + Math.abs(p.y) }\n"
        "const corner: Point = { x: 3, y: -4 }\nlet label: string = 'size'\nconsole.log('declared')",
        context=context)
    assert declared.error is None, declared.error
    assert declared.logs.stdout == ["declared\n"] and declared.results == [], declared
    used = sandbox.run_code("const twice = (n: number): number => n * 2;\n`${label}=${twice(size(corner))}`",
                            context=context)
    assert used.error is None, used.error
    assert used.text == "size=14" and used.results[0].is_main_result, used
    # Without a context, "ts" is the default TypeScript context: another one, made at its first use.
    assert sandbox.run_code("const seen: Array<number> = [1, 2]; typeof corner + seen.length", language="ts").text \
        == "undefined2"
    assert sandbox.run_code("seen.length", language="typescript").text == "2"


def test_typescript_types_are_stripped_not_checked_and_a_syntax_error_is_an_error(sandbox: Sandbox) -> None:
    unchecked = sandbox.run_code("const wrong: number = 'not a number'; wrong", language="ts")
    assert unchecked.error is None and unchecked.text == "not a number", unchecked
    broken = sandbox.run_code("console.log('never')\nlet half: = 1", language="ts")
    assert broken.error is not None, broken
    assert broken.error.name == "SyntaxError" and broken.error.value == "Type expected.", broken.error
    assert "cell-" in broken.error.traceback and ".ts:2:" in broken.error.traceback, broken.error.traceback
    assert broken.logs.stdout == [], "a cell that does not transpile must not run at all"
    assert sandbox.run_code("wrong.length", language="ts").text == "12"


def test_a_language_not_served_is_refused_naming_the_served_ones(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException) as caught:
        sandbox.run_code("1 + 1", language="r")
    assert "'r' is not available" in str(caught.value) and "bash" in str(caught.value), caught.value


def _tiny_wheel() -> tuple[str, bytes]:
    """A pure-Python wheel of the package ``callbox_tiny`` (made here: no index, no network)."""
    name = "callbox_tiny-0.1-py3-none-any.whl"
    files = {
        "callbox_tiny/__init__.py": b"VALUE = 'from the wheel'\n",
        "callbox_tiny-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: callbox-tiny\nVersion: 0.1\n",
        "callbox_tiny-0.1.dist-info/WHEEL": (b"Wheel-Version: 1.0\nGenerator: callbox-tests\n"
                                             b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + "callbox_tiny-0.1.dist-info/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr("callbox_tiny-0.1.dist-info/RECORD", record)
    return name, buf.getvalue()


def test_pip_install_of_a_local_wheel(sandbox: Sandbox) -> None:
    name, data = _tiny_wheel()
    sandbox.files.write(f"/home/user/{name}", data)
    installed = sandbox.run_code(f"!pip install --no-index --no-deps /home/user/{name}")
    assert installed.error is None, installed.error
    assert any("Successfully installed callbox-tiny-0.1" in line for line in installed.logs.stdout), installed.logs
    imported = sandbox.run_code("import callbox_tiny\ncallbox_tiny.VALUE")
    assert imported.text == "'from the wheel'", imported


def test_a_denied_run_code_is_refused_with_the_reason_and_audited(sandbox: Sandbox, server: E2bServer) -> None:
    with pytest.raises(SandboxException) as caught:
        sandbox.run_code("import shutil\nshutil.rmtree('/home/user/nothing')")
    assert DENIED_REASON in str(caught.value)
    allowed = sandbox.run_code("'audited too'")
    assert allowed.text == "'audited too'"
    assert sandbox.run_code("echo asked for bash", language="bash").error is None
    shell = sandbox.create_code_context(language="bash")
    try:
        assert sandbox.run_code("echo in a bash context", context=shell).error is None
    finally:
        sandbox.remove_code_context(shell)
    with AuditStore(server.directory / "audit.sqlite3") as audit:
        calls = audit.calls_for_run(sandbox.sandbox_id)
    cells = [c for c in calls if c["tool"] == "sandbox.process" and "run_code" in _text(c["arguments"])]
    denied = [c for c in cells if "shutil.rmtree" in _text(c["arguments"])]
    assert denied and denied[-1]["decision"] == "deny" and DENIED_REASON in denied[-1]["reason"], denied
    assert any("audited too" in _text(c["arguments"]) and c["decision"] == "allow" for c in cells)
    # A cell records its language as asked; one that names a context and no language runs in
    # the context's, which the record does not guess.
    def recorded(code: str) -> dict[str, object]:
        found = [c["arguments"] for c in cells if code in _text(c["arguments"])]
        assert found, (code, cells)
        arguments = json.loads(found[-1]) if isinstance(found[-1], str) else found[-1]
        assert isinstance(arguments, dict)
        return arguments
    assert recorded("'audited too'")["language"] == "python"
    assert recorded("echo asked for bash")["language"] == "bash"
    in_context = recorded("echo in a bash context")
    assert in_context["language"] is None and in_context["context_id"], in_context


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def test_a_sandbox_of_another_template_has_no_code_interpreter(server: E2bServer) -> None:
    with sdk_environment(server):
        plain = BaseSandbox.create(timeout=60)
        try:
            headers = {"E2b-Sandbox-Id": plain.sandbox_id, "E2b-Sandbox-Port": "49999",
                       "E2B-Traffic-Access-Token": plain.traffic_access_token or ""}
            answer = httpx.get(f"{server.url}/contexts", headers=headers, timeout=30)
        finally:
            plain.kill()
    assert answer.status_code == 502, answer.text
    assert "port 49999 is not open" in answer.json()["message"]
