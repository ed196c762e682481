"""Virtualenvs for the agent harnesses that drive callbox from outside (tests/interop/).

A harness such as Inspect AI, Harbor or the Agents SDK's E2B extra cannot live in the
project's .venv: it pins an ``e2b`` other than ours, or needs a newer Python than the one
callbox is tested on. Each gets a virtualenv of its own, made from one committed file,
``tests/interop/requirements/NAME.txt``: exact pins (``pkg==X.Y.Z``), and optionally a first
line ``# python >= 3.12`` naming the oldest Python it installs on.

The venv lives under ``.cache/interop/NAME`` (ignored by git). It is made once with pip (and
pip's cache) and reused while a stamp file matches the requirements file and the Python it
was made with; a half-made venv is made again. Python for a venv is, in order: this
interpreter when it is new enough, then ``python3.X`` on PATH, then pyenv's versions
(``$PYENV_ROOT`` or ``~/.pyenv``). None found is a loud error naming the fix.

A test runs a driver program of its own in the venv with :func:`run_driver`, which returns
the last JSON line the program printed and, on failure, raises naming the harness and
everything the program wrote.

``make test`` makes every harness's venv at once, in the background, while the main run
starts (``python -m tests.interop.harness_venvs --all``): pip waits on the network, not on
the CPU, so the installs overlap each other and the tests before them. A test that needs a
venv still being made waits for it on the venv's lock file, then finds it made.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).with_name("requirements")
CACHE = ROOT / ".cache" / "interop"
INSTALL_TIMEOUT_S = 900
PYTHON_LINE = re.compile(r"^#\s*python\s*>=\s*(\d+)\.(\d+)\s*$")


class HarnessSetupError(RuntimeError):
    """A harness's virtualenv could not be made; the message names the harness and the fix."""


def requirements_file(name: str) -> Path:
    path = REQUIREMENTS / f"{name}.txt"
    if not path.is_file():
        raise HarnessSetupError(f"no requirements for harness {name!r}: expected {path.relative_to(ROOT)}")
    return path


def minimum_python(requirements: str) -> tuple[int, int]:
    """The ``# python >= X.Y`` line of a requirements text; (3, 11) without one."""
    for line in requirements.splitlines():
        found = PYTHON_LINE.match(line.strip())
        if found:
            return int(found.group(1)), int(found.group(2))
    return 3, 11


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out[0]), int(out[1])


def candidates() -> list[str]:
    """Interpreters to try, in order of preference."""
    found = [sys.executable]
    for minor in range(14, 10, -1):
        on_path = shutil.which(f"python3.{minor}")
        if on_path:
            found.append(on_path)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        versions = [p for p in pyenv.iterdir() if re.fullmatch(r"3\.\d+\.\d+", p.name)]
        for version in sorted(versions, key=lambda p: [int(x) for x in p.name.split(".")], reverse=True):
            python = version / "bin" / "python3"
            if python.exists():
                found.append(str(python))
    return found


def find_python(minimum: tuple[int, int]) -> str:
    """The first of :func:`candidates` at least ``minimum``, with ``venv``."""
    for python in candidates():
        version = _version(python)
        if version is not None and version >= minimum:
            return python
    wanted = ".".join(map(str, minimum))
    raise HarnessSetupError(
        f"no Python >= {wanted} with venv found (tried {', '.join(candidates())}): install one "
        f"(python3.{minimum[1]} on PATH, or `pyenv install {wanted}`)")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Hold harness ``name``'s venv lock: one maker at a time, across processes."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def venv_python(name: str) -> Path:
    """The Python of harness ``name``'s virtualenv, made on first use, then cached."""
    with _locked(name):
        return _made(name)


def _made(name: str) -> Path:
    requirements = requirements_file(name)
    text = requirements.read_text()
    base = find_python(minimum_python(text))
    venv = CACHE / name
    python = venv / "bin" / "python"
    stamp = venv / ".callbox-harness"
    made = hashlib.sha256(f"{base}\n{text}".encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == made and python.exists():
        return python
    print(f"callbox interop: making the {name} virtualenv ({requirements.relative_to(ROOT)}, "
          f"{base})...", file=sys.stderr, flush=True)
    try:
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
        # pip's own constraints file pins the .venv's packages: not this venv's.
        env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
                       check=True, env=env, timeout=INSTALL_TIMEOUT_S)
    except subprocess.SubprocessError as exc:
        raise HarnessSetupError(f"could not install harness {name!r} from {requirements}: {exc}") from exc
    stamp.write_text(made)
    return python


def run_driver(name: str, program: Path, args: Sequence[str] = (), *, env: Mapping[str, str],
               timeout: float = 600, cwd: Path | None = None) -> dict[str, Any]:
    """Run ``program`` with harness ``name``'s Python in ``env``; the last JSON object line it
    printed on stdout. A non-zero exit, a timeout or no JSON line raises, naming the harness."""
    python = venv_python(name)
    try:
        done = subprocess.run([str(python), str(program), *args], env=dict(env), capture_output=True,
                              text=True, timeout=timeout, cwd=str(cwd or ROOT))
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{name}: {program.name} did not finish in {timeout:.0f} s:\n"
                             f"{exc.stdout!r}\n{exc.stderr!r}") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"{name}: {program.name} exited with {done.returncode}:\n"
                             f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def harnesses() -> list[str]:
    """Every harness with a requirements file."""
    return sorted(p.stem for p in REQUIREMENTS.glob("*.txt"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.harness_venvs",
                                     description="Make the agent harnesses' virtualenvs (.cache/interop/).")
    parser.add_argument("names", nargs="*", help="harnesses to make (tests/interop/requirements/NAME.txt)")
    parser.add_argument("--all", action="store_true", help="every harness, at once")
    args = parser.parse_args(argv)
    if not args.all and not args.names:
        parser.error("name a harness or pass --all")
    names = harnesses() if args.all else list(args.names)
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {pool.submit(venv_python, name): name for name in names}
        for future in concurrent.futures.as_completed(futures):
            try:
                print(f"callbox interop: {futures[future]}: {future.result()}", file=sys.stderr)
            except HarnessSetupError as exc:
                failed += 1
                print(f"callbox interop: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
