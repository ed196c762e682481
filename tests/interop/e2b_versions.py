"""The door measured against many ``e2b`` SDK versions, not only the pinned one.

Each version gets a virtualenv of its own under ``.cache/e2b-sdks/VERSION`` (ignored by git),
made once with pip (and pip's cache) and reused: a stamp file holds the version, so a
half-made venv is made again. In it :mod:`tests.interop.e2b_conformance` runs against one
``callbox serve --e2b`` and reports each step.

``make test`` runs only :data:`SUITE_VERSIONS` (tests/interop/test_e2b_versions.py). The
whole matrix, every version from :data:`OLDEST` on as PyPI lists them, runs by hand and
prints the table docs/doors/e2b.md records::

    .venv/bin/python -m tests.interop.e2b_versions            # every version >= OLDEST
    .venv/bin/python -m tests.interop.e2b_versions 2.31.0     # just these

``e2b_code_interpreter`` is measured the same way, each version with the ``e2b`` it is used
with (a venv of both pins), on the code interpreter's steps::

    .venv/bin/python -m tests.interop.e2b_versions --code-interpreter 2.31.0:2.8.1 2.20.3:2.6.2
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "e2b-sdks"
PROGRAM = Path(__file__).with_name("e2b_conformance.py")
OLDEST = "2.7.0"
"""The oldest SDK version the door is measured against."""
PINNED = "2.63.0"
"""pyproject.toml's pin (the .venv's SDK): measured in the .venv itself."""
PINNED_INTERPRETER = "2.11.5"
"""pyproject.toml's pin of ``e2b-code-interpreter`` (in the .venv too)."""
AGENTS_SDK_PINS = ("2.31.0", "2.8.1")
"""The ``e2b`` and ``e2b-code-interpreter`` the OpenAI Agents SDK's ``e2b`` extra pins."""
SUITE_VERSIONS = (OLDEST, AGENTS_SDK_PINS[0], PINNED)
"""What ``make test`` measures: the oldest, the OpenAI Agents SDK's pin (like every SDK before
2.51 it sends ``allow_internet_access=true`` by default, and like those before 2.46 it checks
the key's form), and the pinned one (the newest when it was pinned)."""
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300


def key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def published(oldest: str = OLDEST) -> list[str]:
    """The e2b versions PyPI lists from ``oldest`` on, oldest first (``pip index versions``)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "e2b"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    listed = re.search(r"Available versions:\s*(.+)", out)
    if listed is None:
        raise RuntimeError(f"pip index versions e2b said: {out!r}")
    found = [v.strip() for v in listed.group(1).split(",")]
    return sorted((v for v in found if re.fullmatch(r"[\d.]+", v) and key(v) >= key(oldest)), key=key)


def python_for(version: str, interpreter: str | None = None) -> Path:
    """The Python of a virtualenv with ``e2b==version`` (and ``e2b-code-interpreter==interpreter``
    when given), made on first use, then cached."""
    if version == PINNED and interpreter in (None, PINNED_INTERPRETER):
        return Path(sys.executable)
    requirements = [f"e2b=={version}"] + ([f"e2b-code-interpreter=={interpreter}"] if interpreter else [])
    venv = CACHE / (version if interpreter is None else f"{version}+ci{interpreter}")
    python = venv / "bin" / "python"
    stamp = venv / ".callbox-e2b"
    made = version if interpreter is None else " ".join(requirements)
    if stamp.is_file() and stamp.read_text() == made and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
    # pip's own constraints file (global.constraint) pins the .venv's e2b: not this venv's.
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True, env=env,
                   timeout=INSTALL_TIMEOUT_S)
    stamp.write_text(made)
    return python


def run_program(python: Path, env: dict[str, str], *, interpreter: bool = False) -> dict[str, Any]:
    """Run the conformance program with ``python`` in ``env`` (``interpreter``: its code
    interpreter's steps); its JSON report."""
    from tests.interop.e2b_conformance import INTERPRETER
    args = [str(python), str(PROGRAM)] + ([INTERPRETER] if interpreter else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=str(ROOT))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the conformance program exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def table(reports: Sequence[dict[str, Any]]) -> str:
    """The markdown table of ``reports``: one row per version, one column per step."""
    from tests.interop.e2b_conformance import FALLBACK, INTERPRETER_STEPS, STEPS
    interpreter = any("code_interpreter" in r for r in reports)
    steps = INTERPRETER_STEPS if interpreter else STEPS
    head = "e2b, e2b-code-interpreter" if interpreter else "e2b"
    rows = [f"| {head} | " + " | ".join(f"`{s}`" for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for report in reports:
        results = report["results"]
        cells = [("ok" if results[s] == "ok" else f"refused: {results[s]}") for s in steps]
        fallback = results.get(FALLBACK)
        if fallback is not None:  # the default create was refused: the rest ran on this one
            cells[0] += f"; the rest with `{FALLBACK}`" + ("" if fallback == "ok" else f": {fallback}")
        name = f"{report['version']}, {report['code_interpreter']}" if interpreter else report["version"]
        rows.append(f"| {name} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


@contextlib.contextmanager
def standalone_server() -> Iterator[dict[str, str]]:
    """A ``callbox serve --e2b`` for the command line (the tests use their fixture); the
    environment a child SDK program needs."""
    import docker

    from tests.interop.e2b_server import serve_e2b

    class _Engine:
        client = docker.from_env()

    with serve_e2b(_Engine()) as server:
        yield server.child_env()


def main(argv: Sequence[str]) -> int:
    interpreter = bool(argv) and argv[0] == "--code-interpreter"
    if interpreter:  # E2B:INTERPRETER pairs, e.g. 2.31.0:2.8.1
        pairs = [tuple(pair.split(":", 1)) for pair in argv[1:]] or [(PINNED, PINNED_INTERPRETER)]
    else:
        pairs = [(version, "") for version in (list(argv) or published())]
    reports = []
    with standalone_server() as env:
        for version, code in pairs:
            started = time.monotonic()
            python = python_for(version, code or None)
            installed = time.monotonic()
            report = run_program(python, env, interpreter=interpreter)
            print(f"{version}: venv {installed - started:.1f} s, run {time.monotonic() - installed:.1f} s, "
                  f"{json.dumps(report['results'])}", file=sys.stderr, flush=True)
            reports.append(report)
    print(table(reports))
    return 0 if all(v == "ok" for r in reports for v in r["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
