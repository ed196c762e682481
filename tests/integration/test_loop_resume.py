"""Pause for approval, exit, approve from another process, resume in a third: real engine.

The loop runs in child processes (``python -m tests.integration.test_loop_resume``) with a
scripted Responses-shaped model defined here, the built-in tools and a real sandbox. The
parent waits for each child to exit (no sleeps) and checks the audit store, the sandbox
and a host directory mounted read-write into it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.calls import ToolResult
from harness.core.formats import Format, result_item
from harness.core.registry import ToolDefinition
from harness.models.base import Context, ModelError, ModelToolCall, ModelTurn, ToolChoice
from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
BEFORE = "made before the pause\n"

# The model's turns, in order; the turn to play is chosen from the context, so a new
# process continues where the last one stopped.
SCRIPT: list[dict[str, Any]] = [
    {"calls": [("w1", "write_file", {"path": "/workspace/before.txt", "content": BEFORE})]},
    {"calls": [
        ("r1", "read_file", {"path": "/workspace/before.txt"}),
        ("s1", "shell", {"command": "cat /workspace/before.txt >> /data/side-effect; "
                                    "echo approved-run >> /data/side-effect"}),
        ("r2", "list_dir", {"path": "/workspace"}),
    ]},
    {"calls": [("s2", "shell", {"command": "cat /workspace/before.txt /data/side-effect"})]},
    {"text": "done: the file from before the pause is still there"},
]


class ScriptedResponsesModel:
    """A ModelAdapter replaying SCRIPT as OpenAI Responses items."""

    format: Format = "openai"
    name = "script:resume-test"

    def __init__(self) -> None:
        self.requests = 0

    def start(self, system: str, task: str) -> Context:
        return Context(system=system, items=[{"role": "user", "content": task}])

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        self.requests += 1
        index = _turns_so_far(context.items)
        if index >= len(SCRIPT):
            raise ModelError("the script has no more turns", retryable=False)
        step = SCRIPT[index]
        tool_calls = tuple(ModelToolCall(cid, name, json.dumps(args)) for cid, name, args in step.get("calls", ()))
        items: list[dict[str, Any]] = []
        if step.get("text"):
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": step["text"]}]})
        items += [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
                  for c in tool_calls]
        return ModelTurn(text=step.get("text", ""), tool_calls=tool_calls, items=tuple(items))

    def append_turn(self, context: Context, turn: ModelTurn) -> None:
        context.items.extend(turn.items)

    def append_results(self, context: Context, results: list[ToolResult]) -> None:
        context.items.extend(result_item(r, "openai") for r in results)


def _turns_so_far(items: list[dict[str, Any]]) -> int:
    """Runs of consecutive assistant items (message or function_call) in the context."""
    turns, inside = 0, False
    for item in items:
        assistant = item.get("type") == "function_call" or item.get("role") == "assistant"
        if assistant and not inside:
            turns += 1
        inside = assistant
    return turns


# --------------------------------------------------------------------------- the child process


def child(phase: str, run_id: str, policy_path: str, ttl: str) -> int:
    """``pause``: start the run; ``resume``: continue it. Prints events, then the outcome."""
    from harness.audit.store import AuditStore
    from harness.core.policy import load_policy
    from harness.core.session import Session
    from harness.loop import checkpoint
    from harness.loop.agent_loop import Loop, LoopConfig
    from harness.tools import builtin_registry

    model = ScriptedResponsesModel()

    def show(event: Any) -> None:
        print(json.dumps(event.to_dict()), flush=True)

    with AuditStore() as audit:
        if phase == "pause":
            config = LoopConfig(paused_sandbox_ttl_s=float(ttl) if ttl != "none" else None)
            with Session(builtin_registry(), load_policy(Path(policy_path)), audit, run_id=run_id) as harness:
                outcome = Loop.start(model, harness, task="make a file, then run the guarded command",
                                     config=config, on_event=show).run()
        else:
            saved = checkpoint.load(audit, run_id)
            assert saved is not None
            with Session(builtin_registry(), saved.policy_model(), audit, run_id=run_id,
                         spec=saved.spec_model()) as harness:
                outcome = Loop.resume(run_id, model, harness, on_event=show).run()
    print(json.dumps({"outcome": outcome.reason, "message": outcome.message, "turns": outcome.turns,
                      "approvals": list(outcome.pending_approvals), "model_requests": model.requests}), flush=True)
    return 0


# --------------------------------------------------------------------------- the tests


@pytest.fixture
def setup(engine, tmp_path: Path) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    shared = tmp_path / "shared"
    shared.mkdir()
    if os.geteuid() == 0:
        os.chown(shared, 1000, 1000)
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"

        [[sandbox.mounts]]
        source = "{shared}"
        target = "/data"
        mode = "rw"

        [[tools.shell.rules]]
        action = "ask"
        command = "*>> /data/side-effect*"
        reason = "writes outside the workspace"
    """))
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    kept: list[str] = []
    try:
        yield {"shared": shared, "policy": policy, "env": env, "kept": kept, "engine": engine}
    finally:
        for sandbox_id in kept:
            engine.destroy(sandbox_id)


def run_child(ctx: dict[str, Any], phase: str, run_id: str, ttl: str = "none") -> tuple[list[dict[str, Any]],
                                                                                      dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_loop_resume", phase, run_id, str(ctx["policy"]), ttl],
        cwd=REPO, env=ctx["env"], capture_output=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    return lines[:-1], lines[-1]


def kept_sandbox_id(events: list[dict[str, Any]], ctx: dict[str, Any], run_id: str) -> str:
    from harness.audit.store import AuditStore

    with AuditStore(Path(ctx["env"]["CALLBOX_AUDIT_DB"])) as audit:
        record = audit.load_checkpoint(run_id)
    assert record is not None
    sandbox = json.loads(record.state)["sandbox"]
    assert sandbox is not None
    ctx["kept"].append(sandbox["id"])
    return str(sandbox["id"])


def container_exists(engine: Any, sandbox_id: str) -> bool:
    return any(info.sandbox_id == sandbox_id for info in engine.list_sandboxes())


def test_pause_exit_approve_resume_in_new_processes(setup) -> None:  # type: ignore[no-untyped-def]
    ctx, engine, shared = setup, setup["engine"], setup["shared"]
    run_id = "loop-resume-it"

    events, outcome = run_child(ctx, "pause", run_id)
    assert outcome["outcome"] == "approval_pending", outcome
    assert outcome["turns"] == 2
    (approval_id,) = outcome["approvals"]
    decisions = {e["call_id"]: e["decision"] for e in events if e["event"] == "tool_result"}
    assert decisions == {"w1": "allow", "r1": "allow", "s1": "ask", "r2": "allow"}
    assert not (shared / "side-effect").exists()

    # the pausing process is gone; its sandbox is kept, also through a gc that reaps orphans
    sandbox_id = kept_sandbox_id(events, ctx, run_id)
    engine.gc()
    assert container_exists(engine, sandbox_id)
    assert any(info.owner == f"run:{run_id}" for info in engine.list_sandboxes() if info.sandbox_id == sandbox_id)

    approved = callbox("approvals", "approve", approval_id, env=ctx["env"])
    assert approved.returncode == 0, approved.stderr

    events, outcome = run_child(ctx, "resume", run_id)
    assert outcome["outcome"] == "final", outcome
    assert outcome["turns"] == 4
    # the approved call ran exactly once, in the sandbox that still had the file from before
    assert (shared / "side-effect").read_text() == BEFORE + "approved-run\n"
    results = {e["call_id"]: e for e in events if e["event"] == "tool_result"}
    assert results["s1"]["decision"] == "approved"
    assert "r1" not in results  # held in the checkpoint, not re-run
    assert BEFORE.strip() in results["s2"]["result"]["text"]
    assert results["s2"]["result"]["text"].count("approved-run") == 1

    # the finished run's harness destroyed the sandbox and its keep record
    assert not container_exists(engine, sandbox_id)
    assert engine.kept_sandbox(sandbox_id) is None
    audit = callbox("audit", "--run", run_id, "--json", env=ctx["env"])
    calls = {c["call_id"]: c for c in json.loads(audit.stdout)}
    assert calls["s1"]["state"] == "done" and calls["s1"]["exit_code"] == 0

    # nothing more to resume; the approved call is never run again
    again = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_loop_resume", "resume", run_id, str(ctx["policy"]), "none"],
        cwd=REPO, env=ctx["env"], capture_output=True, timeout=120, check=False,
    )
    assert again.returncode != 0
    assert b"already ended (final)" in again.stderr
    assert (shared / "side-effect").read_text() == BEFORE + "approved-run\n"


def test_an_expired_sandbox_ends_the_resumed_run_with_a_clear_message(setup) -> None:  # type: ignore[no-untyped-def]
    ctx, engine, shared = setup, setup["engine"], setup["shared"]
    run_id = "loop-resume-expired"

    events, outcome = run_child(ctx, "pause", run_id, ttl="0")  # kept until the moment of the pause
    assert outcome["outcome"] == "approval_pending", outcome
    sandbox_id = kept_sandbox_id(events, ctx, run_id)
    assert callbox("approvals", "approve", outcome["approvals"][0], env=ctx["env"]).returncode == 0

    events, outcome = run_child(ctx, "resume", run_id)
    assert outcome["outcome"] == "error:sandbox_expired"
    assert outcome["message"].startswith(f"the sandbox of run {run_id} expired at ")
    assert outcome["message"].endswith("; its files are gone")
    assert outcome["model_requests"] == 0  # no fresh start behind the model's back
    assert not [e for e in events if e["event"] == "tool_result"]
    assert not (shared / "side-effect").exists()
    assert not container_exists(engine, sandbox_id)
    listed = callbox("audit", "--json", env=ctx["env"])
    runs = {r["id"]: r for r in json.loads(listed.stdout)}
    assert runs[run_id]["end_reason"] == "error:sandbox_expired"


def test_gc_still_reaps_an_orphan_that_is_not_kept(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = textwrap.dedent(f"""
        import os
        from harness.engine.docker.engine import DockerEngine
        from harness.engine.spec import SandboxSpec
        box = DockerEngine.connect().create(SandboxSpec(image={IMAGE!r}))
        print(box.id, flush=True)
        os._exit(0)  # dies without destroying it
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120, check=True)
    sandbox_id = proc.stdout.decode().strip()
    try:
        assert container_exists(engine, sandbox_id)
        assert sandbox_id in engine.gc()
        assert not container_exists(engine, sandbox_id)
    finally:
        engine.destroy(sandbox_id)


def test_keep_and_attach_in_process(engine, make_sandbox) -> None:  # type: ignore[no-untyped-def]
    import time

    from harness.engine.docker.engine import SandboxExpired
    from sandbox.health import SERVING

    box = make_sandbox()
    kept = engine.keep(box, run_id="r-attach", until=time.time() + 600)
    assert kept.owner == "run:r-attach"
    again = engine.attach(box.id)
    assert again.agent.health() == SERVING
    assert box.id not in engine.gc()
    engine.keep(box, run_id="r-attach", until=time.time() - 1)  # now expired
    with pytest.raises(SandboxExpired, match=r"expired at .*; its files are gone") as info:
        engine.attach(box.id)
    assert info.value.expired_at is not None
    assert not container_exists(engine, box.id)
    with pytest.raises(SandboxExpired, match="is not kept"):
        engine.attach(box.id)


if __name__ == "__main__":
    from harness.core.errors import CallboxError

    try:
        sys.exit(child(*sys.argv[1:]))
    except CallboxError as exc:
        print(f"callbox: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
