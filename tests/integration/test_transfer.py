"""Files both ways with a real sandbox: copy_in / copy_out of 200 MB at streaming speed with bounded
harness memory, special files left out, move (also across the /tmp and /workspace tmpfs), watch.

One sandbox serves the module: 1 GiB of memory and a 256 MiB workspace, because the default
workspace (a quarter of 512 MiB) cannot hold the 200 MB copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import AgentCallError
from harness.engine.spec import SandboxSpec
from harness.engine.transfer import WatchChange
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
FILES, FILE_BYTES = 20, 10_000_000
MAX_RSS_GROWTH = 64 << 20

# Runs in a fresh interpreter so that its memory is the transfer's alone. The peak is the kernel's
# VmHWM, reset to the current RSS (clear_refs 5) after the warm-up and again between directions.
# (ru_maxrss would not do: a child starts with its parent's peak from before the exec.)
MEASURE = r"""
import json, sys
from pathlib import Path
from harness.engine.agent_client import AgentClient

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

def reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status("VmRSS")

socket, source, sandbox_dir, host_out = sys.argv[1:]
with AgentClient(socket) as client:
    client.health(10)
    # Imports and the first streams both ways are in the baseline, with one tiny file.
    tiny = Path(host_out) / "tiny"
    tiny.write_bytes(b"tiny")
    client.transfer.copy_in(tiny, "/tmp")
    client.transfer.copy_out("/tmp/tiny", Path(host_out) / "tiny-back")
    base = reset()
    into = client.transfer.copy_in(Path(source), sandbox_dir)
    growth_in = status("VmHWM") - base
    base_out = reset()
    out = client.transfer.copy_out(f"{sandbox_dir}/{Path(source).name}", Path(host_out))
    growth_out = status("VmHWM") - base_out
print(json.dumps({"in": into.to_json(), "out": out.to_json(), "base": base,
                  "growth_in": growth_in, "growth_out": growth_out}))
"""


@pytest.fixture(scope="module")
def box(engine):  # type: ignore[no-untyped-def]
    sandbox = engine.create(SandboxSpec(image=IMAGE, memory=1 << 30, workspace_size=256 << 20))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def socket_of(box: Any) -> str:
    return str(box.agent.target).removeprefix("unix:")


def test_200_mb_copy_in_and_out_streams_with_bounded_memory(box: Any, tmp_path: Path) -> None:
    source = tmp_path / "data"
    source.mkdir()
    block = os.urandom(FILE_BYTES)
    digests = {}
    for i in range(FILES):
        content = i.to_bytes(8, "big") + block[8:]  # every file differs, generated fast
        (source / f"f{i:02d}").write_bytes(content)
        digests[f"f{i:02d}"] = hashlib.sha256(content).hexdigest()
    out = tmp_path / "out"
    out.mkdir()
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE, socket_of(box), str(source), "/workspace", str(out)],
        capture_output=True, timeout=240, check=False, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert measured.returncode == 0, measured.stderr.decode()[-3000:]
    report = json.loads(measured.stdout)
    total_mb = FILES * FILE_BYTES / 1e6
    print(f"\ncopy_in  {total_mb / report['in']['seconds']:.0f} MB/s, peak RSS growth "
          f"{report['growth_in'] / 2**20:.1f} MiB (baseline {report['base'] / 2**20:.0f} MiB)")
    print(f"copy_out {total_mb / report['out']['seconds']:.0f} MB/s, peak RSS growth "
          f"{report['growth_out'] / 2**20:.1f} MiB")
    for direction in ("in", "out"):
        assert (report[direction]["files"], report[direction]["bytes"]) == (FILES, FILES * FILE_BYTES)
        assert report[direction]["skipped"] == []
    assert report["growth_in"] < MAX_RSS_GROWTH and report["growth_out"] < MAX_RSS_GROWTH, report
    listing = run(box, "cd /workspace/data && sha256sum f*").stdout.data().decode().split("\n")
    assert {line.split()[1]: line.split()[0] for line in listing if line} == digests
    for name, digest in digests.items():
        assert hashlib.sha256((out / "data" / name).read_bytes()).hexdigest() == digest, name
    run(box, "rm -rf /workspace/data /tmp/tiny")


def test_copy_out_leaves_out_special_files_and_copies_onto_a_new_name(box: Any, tmp_path: Path) -> None:
    script = ("set -e; mkdir -p /workspace/tree/sub; echo hi > /workspace/tree/sub/a.txt; "
              "ln -s sub/a.txt /workspace/tree/inner; ln -s /etc/passwd /workspace/tree/outer; "
              "mkfifo /workspace/tree/pipe")
    assert run(box, script).exit_code == 0
    result = box.agent.transfer.copy_out("/workspace/tree", tmp_path / "copy")
    assert (tmp_path / "copy" / "sub" / "a.txt").read_text() == "hi\n"
    assert os.readlink(tmp_path / "copy" / "inner") == "sub/a.txt"
    assert not (tmp_path / "copy" / "outer").is_symlink() and not (tmp_path / "copy" / "pipe").exists()
    assert [s.split(" ")[0] for s in result.skipped] == ["tree/pipe", "copy/outer"]
    # Back in: the symlink cannot be uploaded, so it is left out and listed.
    back = box.agent.transfer.copy_in(tmp_path / "copy", "/workspace/back")
    assert (back.files, [s.split(" ")[0] for s in back.skipped]) == (1, ["back/inner"])
    assert run(box, ["cat", "/workspace/back/sub/a.txt"]).stdout.data() == b"hi\n"


def test_move_within_and_across_filesystems(box: Any) -> None:
    assert run(box, "set -e; mkdir -p /workspace/mv/d; echo 1 > /workspace/mv/one; echo t > /tmp/t.txt").exit_code == 0
    transfer = box.agent.transfer
    transfer.move("/workspace/mv/one", "/workspace/mv/d/two")
    transfer.move("/tmp/t.txt", "/workspace/mv/t.txt")  # /tmp and /workspace are separate tmpfs
    listing = run(box, "cd /workspace/mv && find . -type f | sort && stat -c %u d/two t.txt && cat t.txt")
    assert listing.stdout.data().decode().split() == ["./d/two", "./t.txt", "1000", "1000", "t"]
    assert run(box, ["test", "-e", "/tmp/t.txt"]).exit_code == 1
    with pytest.raises(AgentCallError) as caught:
        transfer.move("/workspace/mv/d", "/tmp/d")
    assert caught.value.reason == "WRONG_TYPE" and "copy it instead" in str(caught.value)


def test_watch_reports_a_created_and_a_removed_file(box: Any) -> None:
    assert run(box, "mkdir -p /workspace/watched").exit_code == 0
    changes: queue.Queue[WatchChange | None] = queue.Queue()
    watch = box.agent.transfer.watch("/workspace/watched")

    def read() -> None:
        try:
            for change in watch:
                changes.put(change)
        finally:
            changes.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert run(box, "echo x > /workspace/watched/new.txt && rm /workspace/watched/new.txt").exit_code == 0
        seen = list(until(changes, "removed"))
        assert WatchChange("created", "/workspace/watched/new.txt", False) in seen
        assert seen[-1] == WatchChange("removed", "/workspace/watched/new.txt", False)
    finally:
        watch.close()
        reader.join(10)
    assert not reader.is_alive()


def until(changes: queue.Queue[WatchChange | None], kind: str) -> Iterator[WatchChange]:
    while True:
        change = changes.get(timeout=20)
        assert change is not None, "the watch ended early"
        yield change
        if change.kind == kind:
            return
