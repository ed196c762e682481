"""The OpenAI Agents SDK's ``SandboxAgent`` on ``callbox serve --e2b``, run in its own virtualenv.

tests/interop/test_agents_sandbox.py runs this program with the harness's Python
(tests/interop/requirements/openai-agents-sandbox.txt: ``openai-agents[e2b]`` and the e2b
pins of its extra) and an environment that carries only what a user sets: ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY``. Everything below is the SDK's own API, written as its
sandbox example (examples/sandbox/extensions/e2b_runner.py) and its testing guide write it;
``agents.testing.ScriptedModel`` plays the model, so no model is called.

Each step is one section of the JSON line printed last; a step that raises is recorded with
its error (type and message) and the others still run, so each test names its own failure.
The code between ``# README: NAME snippet start`` and ``... end`` is copied, as it stands, into
docs/use-from/openai-agents-sandbox.md (tests/unit/test_doc_examples.py keeps them identical).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import RunConfig, Runner, set_tracing_disabled
from agents.extensions.sandbox import E2BSandboxClient, E2BSandboxClientOptions
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from e2b import AsyncSandbox
from openai.types.responses import ResponseCustomToolCall

NOTE = "written by the model through apply_patch"
# A 1x1 PNG, for the model's view_image.
DOT = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f2a0"
                    "a40000000049454e44ae426082")
DRAW = f"python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))' {DOT.hex()} > dot.png"
PORT = 8000
report: dict[str, Any] = {}


def outputs(model: ScriptedModel) -> dict[str, str]:
    """What the model received: each tool call's output, by call id."""
    seen: dict[str, str] = {}
    for call in model.calls:
        for item in call.input if isinstance(call.input, list) else []:
            if isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output"):
                output = item.get("output")
                seen[str(item["call_id"])] = output if isinstance(output, str) else json.dumps(output)
    return seen


def tool_calls(model: ScriptedModel) -> dict[str, str]:
    """The model's tool calls as the runner recorded them (``NAME ARGUMENTS``), by call id."""
    made: dict[str, str] = {}
    for call in model.calls:
        for item in call.input if isinstance(call.input, list) else []:
            if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call"):
                made[str(item["call_id"])] = f"{item['name']} {item.get('arguments', item.get('input'))}"
    return made


def patch_call(call_id: str, patch: str) -> ResponseCustomToolCall:
    """The model's call of the freeform ``apply_patch`` tool (a Responses custom tool call)."""
    return ResponseCustomToolCall(type="custom_tool_call", id=call_id, call_id=call_id, name="apply_patch",
                                  input=patch)


def said_to(call: ModelCall, prefix: str) -> str:
    """Everything the model was told for its calls whose id starts with ``prefix``, in order."""
    return "".join(str(item["output"]) for item in call.input if isinstance(item, dict)
                   and item.get("type") == "function_call_output" and str(item.get("call_id")).startswith(prefix))


def once_seen(model: ScriptedModel, prefix: str, text: str, then: Callable[[ModelCall, int], list[Any]]) -> ModelStep:
    """The model's step once the output of its calls ``prefix*`` shows ``text``: ``then``
    (given the session id of the process still running); until then it polls that process
    with an empty ``write_stdin``, however slow the machine, and waits no longer than that.
    Steps after this one are for ``then`` to add: a poll's check goes at the script's end."""
    polls = 0

    def respond(call: ModelCall) -> list[Any]:
        nonlocal polls
        told = said_to(call, prefix)
        found = re.search(r"session ID (\d+)", told)
        if found is None:
            raise AssertionError(f"the call {prefix!r} left no session running: {told!r}")
        if text in told:
            return then(call, int(found[1]))
        polls += 1
        if polls > 30:
            raise AssertionError(f"{text!r} never came from the call {prefix!r}: {told!r}")
        model.enqueue(ModelStep.respond(respond))
        return [function_call("write_stdin", {"session_id": int(found[1]), "yield_time_ms": 1000},
                              call_id=f"{prefix}-poll-{polls}")]

    return ModelStep.respond(respond)


async def step(name: str, body: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    section: dict[str, Any] = {}
    report[name] = section
    try:
        await body(section)
        section["ok"] = True
    except BaseException as error:  # recorded for the test, which names the step
        section["ok"] = False
        section["error"] = f"{type(error).__name__}: {error}"
        section["traceback"] = traceback.format_exc()[-4000:]


async def read_text(session: Any, path: str) -> str:
    data = (await session.read(Path(path))).read()
    return data.decode() if isinstance(data, bytes) else str(data)


async def state_of(sandbox_id: str) -> str:
    """The sandbox's state as the e2b SDK sees it (``gone`` once it was killed)."""
    listed = {info.sandbox_id: info.state.value for info in await AsyncSandbox.list().next_items()}
    return listed.get(sandbox_id, "gone")


async def defaults(section: dict[str, Any]) -> None:
    """Default options: the model runs commands (with and without a TTY) and writes a file; the
    SDK writes and reads files; at the end the sandbox is killed, and a new client resumes the
    session in a new sandbox from the workspace's snapshot."""
    after_the_terminal = [
        [function_call("exec_command", {"cmd": DRAW}, call_id="draw")],
        [function_call("view_image", {"path": "dot.png"}, call_id="image")],
        [patch_call("patch", f"*** Begin Patch\n*** Add File: notes.txt\n+{NOTE}\n*** End Patch\n")],
        [function_call("exec_command", {"cmd": "cat notes.txt; exit 3"}, call_id="status")],
        [assistant_message("The workspace holds README.md and notes.txt.")],
    ]

    def exit_terminal(_call: ModelCall, session_id: int) -> list[Any]:
        """The model types ``exit`` into the terminal its ``tty`` call left open, then goes on."""
        model.extend(after_the_terminal)
        return [function_call("write_stdin", {"session_id": session_id, "chars": "exit\n", "yield_time_ms": 2000},
                              call_id="stdin")]

    model = ScriptedModel()
    model.extend([
        [function_call("exec_command", {"cmd": "id -un; pwd; cat README.md; [ -t 1 ] || echo no-tty"},
                       call_id="plain")],
        [function_call("exec_command", {"cmd": "tty; echo $((6 * 7))", "tty": True, "yield_time_ms": 1000},
                       call_id="tty")],
        once_seen(model, "tty", "\r\n42\r\n", exit_terminal),
    ])
    # README: agents-sandbox snippet start
    import io
    import tempfile
    from pathlib import Path

    from agents import RunConfig, Runner
    from agents.extensions.sandbox import E2BSandboxClient, E2BSandboxClientOptions
    from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxRunConfig
    from agents.sandbox.entries import File

    client = E2BSandboxClient()  # reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
    session = await client.create(
        manifest=Manifest(entries={"README.md": File(content=b"# Renewal notes\n")}),
        snapshot=LocalSnapshotSpec(base_path=Path(tempfile.mkdtemp())),  # where stop() keeps the workspace
        options=E2BSandboxClientOptions(sandbox_type="e2b"),
    )
    agent = SandboxAgent(name="Workspace assistant", model=model,
                         instructions="Inspect the workspace before answering.")
    async with session:  # starts the sandbox; at the end, snapshots the workspace and kills it
        result = await Runner.run(agent, "What is in the workspace?",
                                  run_config=RunConfig(sandbox=SandboxRunConfig(session=session)))
        await session.write(Path("from-sdk.txt"), io.BytesIO(b"written by session.write\n"))
        notes = (await session.read(Path("notes.txt"))).read()
    # README: agents-sandbox snippet end
        section["sandbox_id"] = session.state.sandbox_id
        section["readme"] = await read_text(session, "README.md")
        # What the sandbox holds, seen by the e2b SDK itself rather than the Agents SDK.
        raw = await AsyncSandbox.connect(session.state.sandbox_id)
        section["raw_files"] = {name: await raw.files.read(f"/workspace/{name}")
                                for name in ("README.md", "notes.txt", "from-sdk.txt")}
    model.assert_complete()
    section["final_output"] = result.final_output
    section["notes"] = notes.decode()
    section["outputs"] = outputs(model)
    section["calls"] = tool_calls(model)
    section["tools"] = sorted(tool.name for tool in model.calls[0].tools)
    section["after_exit"] = await state_of(section["sandbox_id"])
    # README: agents-sandbox-resume snippet start
    import json

    saved = session.state.model_dump_json()  # keep it with the run: a file, a database...

    # Later, in this process or another one:
    client = E2BSandboxClient()
    resumed = await client.resume(client.deserialize_session_state(json.loads(saved)))
    async with resumed:  # a paused sandbox is resumed; a killed one is made again from the snapshot
        restored = (await resumed.read(Path("notes.txt"))).read()
        print(resumed.state.sandbox_id, restored)
    # README: agents-sandbox-resume snippet end
        section["exec"] = (await resumed.exec("cat", "from-sdk.txt", shell=False)).stdout.decode()
        section["resumed_id"] = resumed.state.sandbox_id
        section["restored"] = restored.decode()
        section["restored_sdk_file"] = await read_text(resumed, "from-sdk.txt")
    section["resumed_after_exit"] = await state_of(section["resumed_id"])


async def paused(section: dict[str, Any]) -> None:
    """``pause_on_exit`` and ``exposed_ports``: a server the model starts is fetched from here
    through the endpoint ``resolve_exposed_port`` gives (``get_host``); the session pauses on
    exit and a new client resumes the same sandbox with its files."""
    model = ScriptedModel()
    model.extend([
        [function_call("exec_command", {"cmd": f"python3 -u -m http.server {PORT}", "yield_time_ms": 1000},
                       call_id="serve")],
        once_seen(model, "serve", "Serving HTTP",
                  lambda _call, _session: [assistant_message("Serving the workspace.")]),
    ])
    agent = SandboxAgent(name="Web server", model=model, instructions="Serve the workspace.")
    # README: agents-sandbox-ports snippet start
    import os

    import httpx

    client = E2BSandboxClient()
    options = E2BSandboxClientOptions(sandbox_type="e2b", pause_on_exit=True, exposed_ports=(8000,))
    session = await client.create(manifest=Manifest(entries={"index.html": File(content=b"hello\n")}),
                                  options=options)
    async with session:  # pauses the sandbox at the end (pause_on_exit)
        await Runner.run(agent, "Serve the workspace on port 8000.",
                         run_config=RunConfig(sandbox=SandboxRunConfig(session=session)))
        endpoint = await session.resolve_exposed_port(8000)  # the sandbox's get_host(8000)
        # callbox routes by that host name: send the request to E2B_SANDBOX_URL with it.
        page = httpx.get(os.environ["E2B_SANDBOX_URL"] + "/index.html", headers={"Host": endpoint.host})
        print(page.status_code, page.text)
    # README: agents-sandbox-ports snippet end
        await session.write(Path("kept.txt"), io.BytesIO(b"kept across the pause\n"))
        section["sandbox_id"] = sandbox_id = session.state.sandbox_id
    try:
        model.assert_complete()
        section["outputs"] = outputs(model)
        section["calls"] = tool_calls(model)
        section["endpoint"] = {"host": endpoint.host, "port": endpoint.port, "tls": endpoint.tls}
        section["page"] = {"status": page.status_code, "body": page.text}
        section["after_exit"] = await state_of(sandbox_id)
        state = session.state.model_dump(mode="json")
        client = E2BSandboxClient()
        resumed = await client.resume(client.deserialize_session_state(state))
        async with resumed:
            section["resumed_id"] = resumed.state.sandbox_id
            section["after_resume"] = await state_of(sandbox_id)
            section["kept"] = await read_text(resumed, "kept.txt")
        section["after_second_exit"] = await state_of(sandbox_id)
    finally:
        await AsyncSandbox.kill(sandbox_id)


async def code_interpreter(section: dict[str, Any]) -> None:
    """``sandbox_type="e2b_code_interpreter"``, the sandbox made and ended by the runner; the
    model's command that the policy denies comes back to it as a result, and the run goes on."""
    model = ScriptedModel([
        [function_call("exec_command", {"cmd": "python3 -c 'import numpy; print(numpy.arange(10).sum())'; id -un"},
                       call_id="sum")],
        [function_call("exec_command", {"cmd": "git push origin main"}, call_id="push")],
        [assistant_message("45")],
    ])
    # README: agents-sandbox-runner snippet start
    agent = SandboxAgent(name="Calculator", model=model, instructions="Compute with Python.")
    run_config = RunConfig(
        sandbox=SandboxRunConfig(  # the runner makes the sandbox, and kills it at the end
            client=E2BSandboxClient(),
            options=E2BSandboxClientOptions(sandbox_type="e2b_code_interpreter"),
        ),
    )
    result = await Runner.run(agent, "What is the sum of 0..9?", run_config=run_config)
    print(result.final_output)
    # README: agents-sandbox-runner snippet end
    model.assert_complete()
    section["final_output"] = result.final_output
    section["outputs"] = outputs(model)
    section["calls"] = tool_calls(model)
    section["leftover"] = [info.sandbox_id for info in await AsyncSandbox.list().next_items()]


async def run_as(section: dict[str, Any]) -> None:
    """``SandboxAgent(run_as=...)`` provisions its user with ``useradd`` as the default command
    user: unprivileged in callbox, so the run fails at the sandbox's start, before the model."""
    model = ScriptedModel([[assistant_message("never")]])
    agent = SandboxAgent(name="Restricted", model=model, run_as="analyst")
    run_config = RunConfig(sandbox=SandboxRunConfig(client=E2BSandboxClient(),
                                                    options=E2BSandboxClientOptions(sandbox_type="e2b")))
    try:
        await Runner.run(agent, "Who are you?", run_config=run_config)
    except Exception as error:  # the failure is what this step reports
        section["raised"] = f"{type(error).__name__}: {error}"
    section["model_calls"] = len(model.calls)
    section["leftover"] = [info.sandbox_id for info in await AsyncSandbox.list().next_items()]


STEPS = {"defaults": defaults, "paused": paused, "code_interpreter": code_interpreter, "run_as": run_as}


async def main() -> None:
    for name in sys.argv[1:] or list(STEPS):
        await step(name, STEPS[name])
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    set_tracing_disabled(True)  # no trace leaves the machine (no OpenAI key either)
    asyncio.run(main())
