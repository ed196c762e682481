"""Real workloads in the sandbox, as a coding agent does them, through both doors.

Each workload is a few shell steps run from /workspace: once as one ``callbox exec`` of the
real CLI in a child process, once as consecutive ``shell`` tool calls of a Session (one
sandbox for the run, so later calls see what earlier ones left). Host directories are
mounted under /mnt: a local wheelhouse (pip and venv installs with no network) and a git
repository owned by another uid, read-only (git's ownership check must not trip).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import subprocess
import textwrap
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import Policy
from harness.core.session import Session
from harness.engine.spec import Mount, SandboxSpec
from harness.tools import builtin_registry
from tests.conftest import IMAGE, unavailable
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

WHEELS = "/mnt/wheels"
HOST_REPO = "/mnt/hostrepo"
STEP_TIMEOUT_S = 180
BIG_BYTES = 100 << 20
BIG_LINE = b"callbox large file line\n"
HOST_REPO_OWNER = 4242


@dataclass(frozen=True)
class Workload:
    name: str
    steps: tuple[str, ...]
    check: Callable[[str], None]


# --- host-side fixtures: a wheel and a repository owned by someone else -------------------------------


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def probe_wheel() -> tuple[str, bytes]:
    """A tiny pure-Python wheel with a console script: (file name, bytes)."""
    dist = "callbox_probe-1.0.dist-info"
    files = {
        "callbox_probe/__init__.py": b'VALUE = 42\n\n\ndef main() -> None:\n    print("probe says", VALUE)\n',
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: callbox-probe\nVersion: 1.0\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: callbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": b"[console_scripts]\ncallbox-probe = callbox_probe:main\n",
        f"{dist}/top_level.txt": b"callbox_probe\n",
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    record += f"{dist}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr(f"{dist}/RECORD", record)
    return "callbox_probe-1.0-py3-none-any.whl", buf.getvalue()


@pytest.fixture(scope="module")
def host_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("workloads")
    wheels = root / "wheels"
    wheels.mkdir()
    name, data = probe_wheel()
    (wheels / name).write_bytes(data)
    repo = root / "hostrepo"
    repo.mkdir()
    git = ["git", "-c", "user.name=Host Person", "-c", "user.email=host@example.invalid", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("from the host\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "host commit"], check=True)
    if os.geteuid() == 0:
        for path in (repo, *repo.rglob("*")):
            os.lchown(path, HOST_REPO_OWNER, HOST_REPO_OWNER)
    elif os.getuid() == 1000:
        unavailable("the host repository must belong to a uid other than the sandbox's 1000: run as root")
    for path in (root, wheels, repo):
        path.chmod(0o755)
    yield {"wheels": wheels, "hostrepo": repo}


def _mount_args(dirs: dict[str, Path]) -> list[str]:
    return ["--mount", f"{dirs['wheels']}:{WHEELS}:ro", "--mount", f"{dirs['hostrepo']}:{HOST_REPO}:ro"]


def _mount_specs(dirs: dict[str, Path]) -> tuple[Mount, ...]:
    return (Mount(source=dirs["wheels"], target=WHEELS), Mount(source=dirs["hostrepo"], target=HOST_REPO))


# --- the workloads ----------------------------------------------------------------------------------


def _check_c(out: str) -> None:
    assert "hello from C: 6 * 7 = 42, argc = 3" in out, out
    assert re.search(r"hello: ELF 64-bit LSB (pie )?executable", out), out


def _check_venv(out: str) -> None:
    assert "in venv: True /workspace/venv" in out, out
    assert re.search(r"^pip \d+(\.\d+)+ from /workspace/venv/\S+ \(python 3\.\d+\)$", out, re.MULTILINE), out
    assert "venv import: 42 /workspace/venv/" in out, out
    assert "probe says 42" in out, out
    assert "user import: 42 /home/sandbox/.local/" in out, out
    assert "/home/sandbox/.local/bin/callbox-probe" in out, out


def _check_git(out: str) -> None:
    assert "branch: main" in out, out
    assert "callbox sandbox <sandbox@callbox.invalid> second commit" in out, out
    assert "callbox sandbox <sandbox@callbox.invalid> first commit" in out, out
    assert f"owner: {HOST_REPO_OWNER if os.geteuid() == 0 else os.getuid()}" in out, out
    assert "Host Person <host@example.invalid> host commit" in out, out
    assert "dubious ownership" not in out, out


def _check_big(out: str) -> None:
    expected = hashlib.sha256((BIG_LINE * (BIG_BYTES // len(BIG_LINE) + 1))[:BIG_BYTES]).hexdigest()
    assert f"size: {BIG_BYTES}" in out, out
    assert out.count(f"{expected}  big.bin") == 2, out  # checksum while writing, then reading it back


def _check_make(out: str) -> None:
    assert "cc -O2 -Wall -Werror -c main.c -o main.o" in out, out
    assert "cc -O2 -Wall -Werror -c sum.c -o sum.o" in out, out
    assert "sum(1..100) = 5050" in out, out
    assert "make: 'app' is up to date." in out, out
    assert "after clean: no objects" in out, out


def _check_extension(out: str) -> None:
    assert "extension says 5" in out, out
    assert re.search(r"spam\.cpython-3\d+-\S+\.so", out), out


WORKLOADS = (
    Workload("c-extension", (
        textwrap.dedent("""\
            mkdir -p ext && cd ext
            cat > spam.c <<'EOF'
            #define PY_SSIZE_T_CLEAN
            #include <Python.h>
            static PyObject *add(PyObject *self, PyObject *args) {
                long a, b;
                if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
                return PyLong_FromLong(a + b);
            }
            static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b"}, {NULL, NULL, 0, NULL}};
            static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "spam", NULL, -1, methods};
            PyMODINIT_FUNC PyInit_spam(void) { return PyModule_Create(&module); }
            EOF
            cat > setup.py <<'EOF'
            from setuptools import Extension, setup
            setup(name="spam", version="1.0", ext_modules=[Extension("spam", ["spam.c"])])
            EOF"""),
        "cd ext && python3 setup.py -q build_ext --inplace && ls spam*.so",
        "cd ext && python3 -c 'import spam; print(\"extension says\", spam.add(2, 3))'",
    ), _check_extension),
    Workload("c", (
        textwrap.dedent("""\
            cat > hello.c <<'EOF'
            #include <stdio.h>
            int main(int argc, char **argv) {
                (void)argv;
                printf("hello from C: 6 * 7 = %d, argc = %d\\n", 6 * 7, argc);
                return 0;
            }
            EOF"""),
        "gcc -O2 -Wall -Werror -o hello hello.c && file hello",
        "./hello a b",
    ), _check_c),
    Workload("venv", (
        "python3 -m venv venv",
        "venv/bin/python -c 'import sys; print(\"in venv:\", sys.prefix != sys.base_prefix, sys.prefix)'",
        "venv/bin/pip --version",
        f"venv/bin/pip install -q --no-index --find-links {WHEELS} callbox-probe",
        "venv/bin/python -c 'import callbox_probe as p; print(\"venv import:\", p.VALUE, p.__file__)'",
        "venv/bin/callbox-probe",
        f"python3 -m pip install -q --user --no-index --find-links {WHEELS} callbox-probe",
        "python3 -c 'import callbox_probe as p; print(\"user import:\", p.VALUE, p.__file__)'",
        "callbox-probe && command -v callbox-probe",  # ~/.local/bin is on PATH
    ), _check_venv),
    Workload("git", (
        "git init -q project && cd project && echo one > a.txt && git add a.txt && git commit -q -m 'first commit'",
        "cd project && echo two >> a.txt && git commit -q -am 'second commit' && git status --short",
        "cd project && echo \"branch: $(git branch --show-current)\" && git log --format='%an <%ae> %s'",
        f"echo \"owner: $(stat -c %u {HOST_REPO})\" && git -C {HOST_REPO} log --format='%an <%ae> %s' 2>&1",
        f"git -C {HOST_REPO} status --short 2>&1",
    ), _check_git),
    Workload("big-file", (
        f"yes '{BIG_LINE.decode().rstrip()}' | head -c {BIG_BYTES} | tee big.bin | sha256sum | sed 's/-$/big.bin/'",
        "echo \"size: $(stat -c %s big.bin)\" && sha256sum big.bin",
    ), _check_big),
    Workload("make", (
        textwrap.dedent("""\
            mkdir -p proj && cd proj
            cat > sum.h <<'EOF'
            int sum_to(int n);
            EOF
            cat > sum.c <<'EOF'
            #include "sum.h"
            int sum_to(int n) { int s = 0; for (int i = 1; i <= n; i++) s += i; return s; }
            EOF
            cat > main.c <<'EOF'
            #include <stdio.h>
            #include "sum.h"
            int main(void) { printf("sum(1..100) = %d\\n", sum_to(100)); return 0; }
            EOF
            cat > Makefile <<'EOF'
            CFLAGS = -O2 -Wall -Werror
            OBJS = main.o sum.o
            app: $(OBJS)
            \t$(CC) -o $@ $(OBJS)
            %.o: %.c sum.h
            \t$(CC) $(CFLAGS) -c $< -o $@
            clean:
            \trm -f app $(OBJS)
            .PHONY: clean
            EOF"""),
        "cd proj && make -j2 && ./app",
        "cd proj && make",
        "cd proj && make clean >/dev/null && ls *.o 2>/dev/null || echo 'after clean: no objects'",
    ), _check_make),
)


# --- the two doors ----------------------------------------------------------------------------------


def _via_exec(workload: Workload, dirs: dict[str, Path]) -> str:
    script = "set -e\n" + "\n".join(f"(\n{step}\n)" for step in workload.steps) + "\n"
    proc = callbox("exec", "--image", IMAGE, "--timeout", str(STEP_TIMEOUT_S), *_mount_args(dirs),
                   "--", "bash", "-c", script, timeout=STEP_TIMEOUT_S + 60)
    out = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, out
    return out


def _via_shell_tool(workload: Workload, dirs: dict[str, Path], engine: Any, tmp_path: Path) -> str:
    spec = SandboxSpec(image=IMAGE, mounts=_mount_specs(dirs))
    outputs: list[str] = []
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        builtin_registry(), Policy(), audit, spec=spec, engine_factory=lambda: engine
    ) as harness:
        for i, step in enumerate(workload.steps):
            args = {"command": step, "timeout_ms": STEP_TIMEOUT_S * 1000}
            result = harness.call(ToolCall("shell", args, f"{workload.name}-{i}"))
            assert not result.is_error, f"step {i} ({step!r}) failed:\n{result.text}"
            assert result.text.startswith("Exit code: 0\n"), result.text
            outputs.append(result.text)
    return "".join(outputs)


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_workload_through_callbox_exec(engine, host_dirs, workload):
    workload.check(_via_exec(workload, host_dirs))


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_workload_through_the_shell_tool(engine, host_dirs, workload, tmp_path):
    workload.check(_via_shell_tool(workload, host_dirs, engine, tmp_path))


def test_pip_with_the_default_index_fails_quickly_offline(engine):
    """Without --no-index pip tries PyPI; with no network that is a prompt, plain failure, not a hang."""
    started = time.monotonic()
    proc = callbox("exec", "--image", IMAGE, "--timeout", "120", "--",
                   "python3", "-m", "pip", "install", "callbox-no-such-package", timeout=180)
    elapsed = time.monotonic() - started
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, err
    assert "No matching distribution found for callbox-no-such-package" in err, err
    assert elapsed < 60, f"pip took {elapsed:.0f} s to give up"
