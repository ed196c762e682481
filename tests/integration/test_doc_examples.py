"""Every console and Python example of the pages (``README.md`` and ``docs/**/*.md``) runs
verbatim, as root and as a normal user; a block marked ``<!-- not run: REASON -->`` is left out.

Each console block runs in one bash, in a fresh copy of the repository (a git repository
with one commit, so examples that mount ``$PWD`` see a real checkout), with ``callbox`` on
PATH and nothing else of the test's environment. Its output must match what the page
shows (see ``tests/doc_examples.py`` for the notation); a command shown without output
must exit 0. Test ids name the page and line (``docs/exec.md:42``). As root the
repository's own ``.venv`` is used. The normal user (``callbox-readme``, created if missing,
in the ``docker`` group) gets a virtualenv of its own made from Debian's ``/usr/bin/python3``,
because the build machine's Python may live where other users cannot read it (``/root``).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.doc_examples import (
    SNIPPET_SOURCES,
    Example,
    all_console_examples,
    all_python_blocks,
    output_matches,
    snippet_in,
    snippet_language,
)

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = all_console_examples()
USER = "callbox-readme"
MARK = "@@callbox-readme-example-exit"
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Shell:
    """Where and as whom the pages' commands run."""

    who: str
    cwd: Path
    env: dict[str, str]
    prefix: tuple[str, ...]
    """Put before ``bash`` (``runuser`` for the normal user)."""


def _tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _copy_repository(dest: Path) -> None:
    """The working tree's files (what a clone of this commit holds) as a one-commit repository."""
    for name in _tracked_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    git = ["git", "-C", str(dest), "-c", "user.name=readme", "-c", "user.email=readme@callbox.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "README examples"], check=True)


def _base_env(home: Path) -> dict[str, str]:
    env = {"HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "CI": os.environ.get("CI", "")}
    if "DOCKER_HOST" in os.environ:
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return env


def _root_shell(base: Path) -> Shell:
    home = base / "root-home"
    home.mkdir(mode=0o700)
    repo = base / "root-repo"
    _copy_repository(repo)
    env = _base_env(home) | {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}
    return Shell("root", repo, env, ())


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    groups = ["--groups", "docker"] if _group_exists("docker") else []
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", *groups, USER], check=True)
    return pwd.getpwnam(USER)


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _user_venv() -> Path:
    """A virtualenv any user can run, from Debian's Python, with callbox installed from this tree.
    The dependencies are kept between sessions (keyed by the pins); callbox is reinstalled."""
    python = Path("/usr/bin/python3")
    if not python.exists():
        unavailable("/usr/bin/python3 is missing, so no virtualenv can be made for a normal user")
    pins = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "requirements/constraints.txt").read_bytes())
    venv = Path("/var/tmp") / f"callbox-readme-venv-{pins.hexdigest()[:12]}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not (venv / "bin" / "callbox").exists():
        probe = subprocess.run([str(python), "-c", "import ensurepip, venv"], capture_output=True)
        if probe.returncode != 0:
            subprocess.run(["apt-get", "install", "-y", "-qq", "python3-venv"], check=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
        subprocess.run([*pip, "-c", str(ROOT / "requirements/constraints.txt"), "setuptools>=77", str(ROOT)],
                       check=True, cwd=ROOT)
    else:
        subprocess.run([*pip, "--no-deps", "--no-build-isolation", "--force-reinstall", str(ROOT)],
                       check=True, cwd=ROOT)
    venv.chmod(0o755)
    return venv


def _user_shell(base: Path) -> Shell:
    """``callbox-readme``'s shell, with its own virtualenv and copy of the repository under ``base``."""
    account = _ensure_user()
    venv = _user_venv()
    repo = base / "user-repo"
    _copy_repository(repo)
    # A home of its own for this run, as root's: what an example keeps in the home (the state
    # dir, memories) starts empty, as on a new machine, however often the suite runs.
    home = base / "user-home"
    home.mkdir(mode=0o700)
    for path in (base, repo):
        path.chmod(0o755)
    subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", str(repo), str(home)], check=True)
    env = _base_env(home) | {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "USER": USER}
    return Shell(USER, repo, env, ("runuser", "-u", USER, "--"))


@pytest.fixture(scope="module")
def normal_user_shell(engine: object) -> Iterator[Shell]:
    """The normal user's shell: ``callbox-readme`` when the tests run as root, else the tests' own user."""
    if os.geteuid() != 0:
        base = Path(tempfile.mkdtemp(prefix="callbox-readme-"))
        try:
            _copy_repository(base / "repo")
            env = _base_env(Path.home()) | {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
            yield Shell(pwd.getpwuid(os.getuid()).pw_name, base / "repo", env, ())
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    # pytest's own temporary directories are private to root: the normal user's copy lives
    # in a directory of its own that every user can traverse.
    base = Path(tempfile.mkdtemp(prefix="callbox-readme-", dir="/var/tmp"))
    try:
        yield _user_shell(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module", params=["root", "normal user"])
def shell(request: pytest.FixtureRequest, engine: object, tmp_path_factory: pytest.TempPathFactory) -> Shell:
    if request.param == "normal user":
        user_shell: Shell = request.getfixturevalue("normal_user_shell")
        return user_shell
    if os.geteuid() != 0:
        unavailable("the pages' examples are run as root only when the tests run as root")
    base = tmp_path_factory.mktemp("readme")
    return _root_shell(base)


def run_block(shell: Shell, examples: list[Example]) -> list[tuple[int, list[str]]]:
    """Run the commands of one block in one bash; each command's exit status and output lines."""
    script = "".join(f"{ex.command}\nprintf '\\n{MARK} %s\\n' \"$?\"\n" for ex in examples)
    argv = [*shell.prefix, "env", "-i", *(f"{k}={v}" for k, v in shell.env.items()),
            "bash", "--noprofile", "--norc", "-c", script]
    done = subprocess.run(argv, cwd=shell.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S)
    results: list[tuple[int, list[str]]] = []
    current: list[str] = []
    for line in done.stdout.decode(errors="replace").splitlines():
        if line.startswith(MARK + " "):
            if current and current[-1] == "":
                current.pop()  # the newline the marker printed before itself
            results.append((int(line.split()[-1]), current))
            current = []
        else:
            current.append(line)
    if len(results) != len(examples):
        pytest.fail(f"the block stopped after {len(results)} of {len(examples)} commands "
                    f"(bash exited {done.returncode}); output after the last one:\n" + "\n".join(current))
    return results


def _block_id(examples: list[Example]) -> str:
    return examples[0].name if examples else "empty"


def test_the_pages_have_console_examples() -> None:
    assert sum(len(b) for b in BLOCKS) >= 10, "the pages' console examples were not found"


@pytest.mark.parametrize("examples", [b for b in BLOCKS if b], ids=_block_id)
def test_doc_console_block(shell: Shell, examples: list[Example]) -> None:
    failures = []
    for example, (status, lines) in zip(examples, run_block(shell, examples), strict=True):
        text = "\n".join(lines)
        if "Traceback (most recent call last)" in text:
            failures.append(f"{example.name}: `{example.command}` printed a traceback:\n{text}")
        elif example.expected and not output_matches(example.expected, lines):
            failures.append(f"{example.name}: `{example.command}` (exit {status}) printed:\n{text}\n"
                            f"--- {example.source} shows:\n" + "\n".join(example.expected))
        elif not example.expected and status != 0:
            failures.append(f"{example.name}: `{example.command}` exited {status}:\n{text}")
    assert not failures, f"as {shell.who}:\n\n" + "\n\n".join(failures)


def test_a_normal_user_is_not_told_about_another_users_kept_sandbox(normal_user_shell: Shell, make_sandbox) -> None:  # type: ignore[no-untyped-def]
    """Root's kept sandboxes (a paused run) live under root's private run root: another
    user's callbox leaves them alone without printing a warning about them."""
    if os.geteuid() != 0:
        unavailable("this needs root beside a normal user (the tests run as root in CI)")
    from tests.conftest import IMAGE

    box = make_sandbox(image=IMAGE)
    box.engine.keep(box, run_id="readme-kept")
    status, lines = run_block(normal_user_shell, [Example(0, 0, "callbox exec -- true && callbox ps", ())])[0]
    assert status == 0, lines
    assert not [line for line in lines if "keep record" in line], lines
    assert box.engine.kept_sandbox(box.id) is not None  # still kept: the other user's gc did not touch it


# The agent-framework snippets run inside the interop tests they are copied from (a unit
# test keeps the copies identical); the rest run here as they stand.
_TESTED_ELSEWHERE = {snippet_in((ROOT / path).read_text(), name) for name, path in SNIPPET_SOURCES.items()
                     if snippet_language(path) == "python"}
PYTHON_BLOCKS = [(f"{b.source}:{b.first_line}", b.body) for b in all_python_blocks()
                 if b.body not in _TESTED_ELSEWHERE]
GRPC_ADDRESS = "unix:/run/callbox/executor.sock"


def test_the_pages_have_python_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 2, "the pages' Python examples were not found"


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[where for where, _ in PYTHON_BLOCKS])
def test_doc_python_block(where: str, code: str, shell: Shell, tmp_path: Path) -> None:
    """Each Python example runs as written. One that talks to `callbox serve --grpc` at its
    default socket gets a server of its own on a socket of the test's (the only change)."""
    env = dict(shell.env)
    server = None
    try:
        if GRPC_ADDRESS in code:
            sock = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp")) / "executor.sock"
            sock.parent.chmod(0o777)
            tokens = tmp_path / "tokens"
            tokens.write_text("readme:" + "r" * 32 + "\n")
            tokens.chmod(0o600)
            server = subprocess.Popen(
                [str(ROOT / ".venv" / "bin" / "callbox"), "serve", "--grpc", f"unix:{sock}", "--token-file",
                 str(tokens), "--audit-db", str(tmp_path / "audit.sqlite3")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            assert server.stdout is not None
            for out_line in server.stdout:  # wait for the server to say it listens
                if "listening" in out_line or str(sock) in out_line:
                    break
            else:
                pytest.fail(f"callbox serve exited {server.wait()} before listening")
            sock.chmod(0o777)
            code = code.replace(GRPC_ADDRESS, f"unix:{sock}")
            env["CALLBOX_TOKEN"] = "r" * 32
        argv = [*shell.prefix, "env", "-i", *(f"{k}={v}" for k, v in env.items()), "python3", "-"]
        done = subprocess.run(argv, cwd=shell.cwd, input=code.encode(), capture_output=True, timeout=300)
        out = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode == 0 and "Traceback" not in out, f"{where} as {shell.who}:\n{out}"
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
