"""``make bench`` section ``desktop``: the ``computer`` tool on the desktop image variant (built first
when missing), its display up and Chromium showing a page served in the sandbox (opened with the
tool's keys, as a model would).

Rows:

25a. ``computer`` ``screenshot`` of the 1280x800 display, the whole call (the tool's handler: an exec of
     the image's computer.py, xwd, PNG encoding, base64 back), vs an exec of ``true`` in the same
     sandbox (the floor of any call that runs a command); target p50 ≤ 150 ms;
25b. of which the capture in the sandbox (xwd and PNG encoding, as computer.py times it);
25c. ``left_click`` → its screenshot (the click, the 150 ms the display gets to repaint, the screenshot);
25d. cold start: create a desktop sandbox → its first screenshot (the display started by it), the
     destroy untimed;
25e. memory of a desktop sandbox (cgroup): its display up and Chromium showing the page (read once,
     in the sandbox of 25a);
25f. from the warm pool: create (a claim of a pooled desktop sandbox, whose display the pool started)
     → first screenshot, against the cold start of 25d; the pool refilled and the destroy drained
     untimed before each sample, and its refill held back while the sample is timed (a refill starts
     a display and Chromium beside the claimer: on 2 CPUs that triples the figure).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.context import ToolContext
from harness.engine.docker.engine import DockerEngine
from harness.engine.exec_result import collect
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from harness.engine.spec import SandboxSpec
from harness.tools.computer import COMPUTER, ComputerArgs
from tests.bench.bench_e2b import ms_since
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_pool import FILL_TIMEOUT_S
from tests.bench.bench_results import p50

TARGET_SCREENSHOT_P50_MS = 150.0
REFILL_PAUSE_S = 5.0
PAGE = "<!doctype html><body style='margin:0'><h1>callbox desktop bench</h1><button>a button</button></body>"


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def bench_desktop(res: Resources, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    """Rows 25a-25f; the sandbox started here is gone when it returns."""
    kit.progress("desktop: the desktop image variant (built when missing)")
    image = build_variant(res.engine.client, "desktop", repo_root=default_repo_root(), progress=kit.progress).tag
    box = res.create_sandbox(SandboxSpec(image=image))
    try:
        ctx = ToolContext(run_id="bench-desktop", call_id="c", provider=_Provider(box), default_timeout_s=30.0,
                          timeout_ceiling_s=60.0, output_budget=30_000)

        def computer(**args: Any) -> Any:
            out = COMPUTER.handler(ctx, ComputerArgs(**args))
            if out.is_error or not out.images:
                raise RuntimeError(f"computer {args}: {out.text}")
            return out

        box.agent.write_file("/workspace/index.html", PAGE.encode())
        box.agent.jobs.start(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"], cwd="/workspace")
        computer(action="screenshot")  # starts the display, with Chromium on a blank page
        computer(action="wait", duration=3)  # Chromium's window is up (untimed set-up)
        for keys in ({"action": "key", "text": "ctrl+l"}, {"action": "type", "text": "127.0.0.1:8765/"},
                     {"action": "key", "text": "Return"}):
            computer(**keys)
        computer(action="wait", duration=2)  # the page loaded and painted

        def screenshot() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            out = computer(action="screenshot")
            return {"desktop_screenshot": ms_since(t0), "desktop_capture": float(out.structured["capture_ms"])}

        def true() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            result = collect(box.agent.exec(["true"]))
            elapsed = ms_since(t0)
            if result.exit_code != 0:
                raise RuntimeError(f"true: {result.to_json()}")
            return {"desktop_exec_true": elapsed}

        def click() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            computer(action="left_click", coordinate=[640, 700])
            return {"desktop_click_screenshot": ms_since(t0)}

        data = kit.interleaved("desktop screenshot", [screenshot, true], samples, warmup, every=10)
        data.update(kit.interleaved("desktop click → screenshot", [click], max(10, samples // 3), 1, every=10))
        data["desktop_memory_chromium"] = [float(box.stats().memory_bytes)]
    finally:
        res.destroy_sandbox(box)

    def cold() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        fresh = res.create_sandbox(SandboxSpec(image=image))
        try:
            COMPUTER.handler(ToolContext(run_id="bench-desktop-cold", call_id="c", provider=_Provider(fresh),
                                         default_timeout_s=30.0, timeout_ceiling_s=60.0, output_budget=30_000),
                             ComputerArgs(action="screenshot"))
            return {"desktop_cold_first_screenshot": ms_since(t0)}
        finally:
            res.destroy_sandbox(fresh)

    data.update(kit.interleaved("desktop cold start", [cold], max(3, samples // 6), 1, every=5))
    data.update(_pooled_first_screenshots(res, image, max(3, samples // 6), kit))
    return data


def _pooled_first_screenshots(res: Resources, image: str, samples: int, kit: Toolkit) -> dict[str, list[float]]:
    """Row 25f: claim a pooled desktop sandbox → its first screenshot, ``samples`` times (one warm-up)."""
    kit.progress(f"desktop: warm pool claim → first screenshot, {samples} samples")
    root = Path(tempfile.mkdtemp(prefix="cbx-bdesk-", dir="/tmp"))
    engine = DockerEngine(res.engine.client, run_root=root, reap_on_start=False)
    spec = SandboxSpec(image=image)
    pool = engine.enable_pool([spec], size=1, pause_s=REFILL_PAUSE_S)  # no refill (a display's start) while timed
    taken: list[float] = []
    try:
        for index in range(samples + 1):
            if not pool.wait_filled(FILL_TIMEOUT_S):
                raise RuntimeError("the desktop pool did not refill")
            before = pool.claims
            t0 = time.perf_counter_ns()
            box = engine.create(spec)
            try:
                out = COMPUTER.handler(ToolContext(run_id="bench-desktop-pool", call_id="c", provider=_Provider(box),
                                                   default_timeout_s=30.0, timeout_ceiling_s=60.0,
                                                   output_budget=30_000), ComputerArgs(action="screenshot"))
                elapsed = ms_since(t0)
            finally:
                box.destroy()
                engine.drain(FILL_TIMEOUT_S)
            if pool.claims != before + 1 or out.is_error:
                raise RuntimeError(f"a pooled desktop create did not claim, or its screenshot failed: {out.text}")
            if index:
                taken.append(elapsed)
    finally:
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"desktop_pool_first_screenshot": taken}


def add_desktop_rows(data: dict[str, list[float]], add: Callable[..., Any]) -> None:
    """Rows 25a-25f of the report (``add`` takes ``Row``'s arguments)."""
    if "desktop_screenshot" not in data:
        return
    shots = data["desktop_screenshot"]
    add(f"25a. desktop: `computer` screenshot, 1280x800 display, whole call ({len(shots)} samples)", "time", shots,
        "exec of `true`, same sandbox", data["desktop_exec_true"], f"p50 ≤ {TARGET_SCREENSHOT_P50_MS:g} ms",
        lambda r: r.cb(p50) <= TARGET_SCREENSHOT_P50_MS)
    add("25b. of which the capture in the sandbox (xwd + PNG encoding)", "time", data["desktop_capture"], "—", None,
        "— (info)")
    add("25c. desktop: `computer` left_click → its screenshot (150 ms repaint wait included)", "time",
        data["desktop_click_screenshot"], "—", None, "— (info)")
    add("25d. desktop: cold start, create → first screenshot (display started)", "time",
        data["desktop_cold_first_screenshot"], "—", None, "— (info)")
    add("25e. desktop: memory (cgroup), display + Chromium on a page", "mem", data["desktop_memory_chromium"],
        "—", None, "— (info)")
    if "desktop_pool_first_screenshot" in data:
        add("25f. desktop: warm pool, create (claim) → first screenshot (display started by the pool)", "time",
            data["desktop_pool_first_screenshot"], "25d. cold start → first screenshot",
            data["desktop_cold_first_screenshot"], "— (info)")
