"""The sandbox image, built for real (harness/engine/image/) and inspected with the real engine.

The first test builds the image if needed (a cold build debootstraps a base: about a minute);
every later call must find it up to date within seconds.
"""

from __future__ import annotations

import io
import json
import time
from importlib import resources

import pytest

from harness.engine.image import DEFAULT_TAG, ImageBuildError, build_image, default_repo_root, find_image
from tests.conftest import unavailable

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
    import docker

    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:  # any failure means no usable engine
        unavailable(f"no Docker engine: {exc}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def built(client):
    lines: list[str] = []
    result = build_image(client, repo_root=default_repo_root(), progress=lines.append)
    assert result.tag == DEFAULT_TAG
    assert lines, "the builder must report progress"
    return result


def run(client, cmd, *, user="0", entrypoint=None, image=DEFAULT_TAG, **kwargs):
    """Run a command in the image (no network) and return its output; raises ContainerError on failure."""
    out = client.containers.run(
        image,
        entrypoint=entrypoint if entrypoint is not None else ["/bin/sh", "-c"],
        command=[cmd] if entrypoint is None else cmd,
        user=user,
        network_mode="none",
        remove=True,
        stdout=True,
        stderr=True,
        **kwargs,
    )
    return out.decode()


@pytest.mark.timeout(900)
def test_build_then_rebuild_is_up_to_date(client, built):
    started = time.monotonic()
    lines: list[str] = []
    again = build_image(client, repo_root=default_repo_root(), progress=lines.append)
    elapsed = time.monotonic() - started
    assert again.built is False
    assert elapsed < 30
    assert again.image_id == built.image_id
    assert again.content_hash == built.content_hash
    assert any(line.startswith("up to date") for line in lines)
    assert find_image(client, DEFAULT_TAG) == built.image_id
    assert find_image(client, f"callbox-sandbox:{built.content_hash[:12]}") == built.image_id


def test_an_image_built_from_it_is_never_taken_for_it(client, built):
    # A user's image FROM callbox's inherits its labels, the content hash among them; the next
    # build must neither take it as "up to date" nor tag it as callbox's image.
    dockerfile = f"FROM {DEFAULT_TAG}\nLABEL someone.else=1\n".encode()
    derived, _ = client.images.build(fileobj=io.BytesIO(dockerfile), tag="cbx-test-derived:latest", rm=True)
    try:
        assert derived.labels["callbox.image.hash"] == built.content_hash and derived.id != built.image_id
        again = build_image(client, repo_root=default_repo_root(), progress=lambda _line: None)
        assert again.built is False and again.image_id == built.image_id
        assert find_image(client, DEFAULT_TAG) == built.image_id
    finally:
        client.images.remove("cbx-test-derived:latest", force=True)


def test_image_metadata(client, built):
    attrs = client.images.get(built.image_id).attrs
    config = attrs["Config"]
    assert config["Entrypoint"] == ["/usr/bin/python3", "-I", "-S", "/opt/callbox/agent.py"]
    assert config["Labels"]["callbox.image.hash"] == built.content_hash
    assert config["Labels"]["callbox.image.version"] == "1"
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    assert set(env) <= {"PATH"}, env  # nothing but the builder's default PATH
    assert config.get("User") in ("", None)  # the agent starts as root; tool processes drop to 1000


def test_sandbox_user_and_workspace(client, built):
    # The tool user is named `user` (E2B's name); `sandbox`, its earlier name, is the same uid.
    assert run(client, "id user").strip() == "uid=1000(user) gid=1000(user) groups=1000(user)"
    assert run(client, "id -u sandbox").strip() == "1000"
    assert run(client, "getent passwd user").strip() == "user:x:1000:1000::/home/sandbox:/bin/bash"
    assert run(client, "stat -c '%u:%g %a' /workspace").strip() == "1000:1000 755"
    assert run(client, "pwd").strip() == "/workspace"


def test_tools_present(client, built):
    out = run(
        client,
        "rg --version && git --version && curl --version && patch --version && ps --version && bash --version && "
        "gcc --version && g++ --version && cc --version && make --version && python3 -m pip --version && "
        "python3 -m venv --help && xz --version && file --version && unzip -v && less --version",
        user="1000",
    )
    for word in ("ripgrep", "git version", "curl", "GNU patch", "procps", "GNU bash", "gcc (Debian", "g++ (Debian",
                 "GNU Make", "pip ", "usage: venv", "xz (XZ Utils)", "file-", "UnZip", "less "):
        assert word in out, word


def test_system_git_and_pip_config(client, built):
    git = run(client, "git config --system --list", user="1000").split()
    assert set(git) == {"safe.directory=*", "user.name=callbox", "sandbox", "user.email=sandbox@callbox.invalid",
                        "init.defaultbranch=main"}, git
    assert run(client, "git config --show-origin user.email", user="1000").split() == [
        "file:/etc/gitconfig", "sandbox@callbox.invalid"]
    pip = run(client, "python3 -m pip config list", user="1000").splitlines()
    assert sorted(pip) == ["global.break-system-packages='true'", "global.disable-pip-version-check='true'"]


def test_image_size_and_pruned_docs(client, built):
    size = client.images.get(built.image_id).attrs["Size"]
    assert size < 600_000_000, f"the image grew to {size / 1e6:.0f} MB"
    out = run(client, "find /usr/share/man /usr/share/info -type f | wc -l; "
                      "find /usr/share/doc -type f ! -name copyright | wc -l; "
                      "find /usr/share/locale -type f ! -name locale.alias | wc -l")
    assert out.split() == ["0", "0", "0"]


def test_agent_libraries_only_on_the_agents_path(client, built):
    code = (
        "import sys; sys.path.insert(0, '/opt/callbox/lib'); "
        "import grpc, google.protobuf, psutil, sandbox, sandbox.v1; "
        "print(grpc.__version__, google.protobuf.__version__, psutil.__version__)"
    )
    out = run(client, ["-I", "-S", "-c", code], entrypoint=["/usr/bin/python3"], user="1000")
    from importlib.metadata import version

    assert out.split() == [version("grpcio"), version("protobuf"), version("psutil")]

    import docker.errors

    for mod in ("grpc", "google.protobuf", "psutil", "sandbox"):
        with pytest.raises(docker.errors.ContainerError):
            run(client, f"python3 -c 'import {mod}'", user="1000")


def test_no_wheels_or_apt_lists_left_in_the_image(client, built):
    out = run(client, "ls -A /wheels 2>/dev/null | wc -l; ls /var/lib/apt/lists | grep -v partial | wc -l")
    assert out.split() == ["0", "0"]


def test_agent_entrypoint_starts(client, built):
    out = client.containers.run(
        DEFAULT_TAG, command=["--help"], network_mode="none", remove=True, stdout=True, stderr=True
    )
    assert b"usage" in out.lower()


def test_seccomp_profile_blocks_io_uring_in_a_container(client, built):
    profile = resources.files("harness").joinpath("data/seccomp.json").read_text()
    json.loads(profile)
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "fd = libc.syscall(425, 4, params)\n"  # io_uring_setup on x86_64 and aarch64
        "print(fd, ctypes.get_errno())\n"
    )
    out = run(
        client,
        ["-c", probe],
        entrypoint=["python3"],
        user="1000",
        security_opt=["no-new-privileges:true", f"seccomp={profile}"],
        cap_drop=["ALL"],
    )
    fd, err = out.split()
    assert int(fd) == -1
    assert int(err) == 1  # EPERM: the profile's default errno
    # ordinary work still runs under the profile
    ok = run(
        client,
        "cd /tmp && git init -q r && echo hi > r/f && rg -c hi r/f && python3 -c "
        "'import os; pid = os.fork(); os._exit(0) if pid == 0 else print(os.waitpid(pid, 0)[1] == 0)'",
        user="1000",
        security_opt=["no-new-privileges:true", f"seccomp={profile}"],
        cap_drop=["ALL"],
    )
    assert ok.split() == ["1", "True"]


def test_missing_base_is_a_clear_error(client):
    with pytest.raises(ImageBuildError, match="not found locally; there is no registry here"):
        build_image(client, repo_root=default_repo_root(), base="callbox-no-such-image:1", progress=lambda _: None)


def test_base_with_old_python_is_refused(client, built):
    base = client.images.get(built.image_id).labels["callbox.image.base"]
    fake = "callbox-test-oldpython:latest"
    dockerfile = (
        f"FROM {base}\n"
        "RUN printf '%s\\n' '#!/bin/sh' "
        '\'echo "{\\"python\\": [3, 9], \\"glibc\\": [2, 36], \\"machine\\": \\"x86_64\\"}"\' '
        "> /usr/local/bin/fakepy && chmod 755 /usr/local/bin/fakepy && ln -sf /usr/local/bin/fakepy /usr/bin/python3\n"
    )
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=fake, rm=True, pull=False)
    try:
        with pytest.raises(ImageBuildError, match=r"Python 3\.9.*3\.11 or newer"):
            build_image(client, repo_root=default_repo_root(), base=fake, tag="callbox-test-never:1",
                        progress=lambda _: None)  # fmt: skip
        assert find_image(client, "callbox-test-never:1") is None
    finally:
        client.images.remove(fake, force=True)


def test_user_base_keeps_its_pip_config_and_needs_no_git(client, built):
    base = client.images.get(built.image_id).labels["callbox.image.base"]
    fake, tag = "callbox-test-userbase:latest", "callbox-test-userbase-sandbox:1"
    dockerfile = (
        f"FROM {base}\n"
        "RUN rm -f /usr/bin/git && printf '[global]\\ntimeout = 7\\n' > /etc/pip.conf\n"
    )
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=fake, rm=True, pull=False)
    result = None
    try:
        result = build_image(client, repo_root=default_repo_root(), base=fake, tag=tag, progress=lambda _: None)
        assert result.built and result.image_id != built.image_id
        out = run(client, "cat /etc/pip.conf; ls /etc/gitconfig 2>&1; command -v git || echo no-git", image=tag,
                  user="1000")
        assert out.splitlines() == ["[global]", "timeout = 7", "ls: cannot access '/etc/gitconfig': "
                                    "No such file or directory", "no-git"]
        help_out = client.containers.run(tag, command=["--help"], network_mode="none", remove=True)
        assert b"usage" in help_out.lower()
    finally:
        if result is not None:
            for name in (tag, f"callbox-sandbox:{result.content_hash[:12]}"):
                client.images.remove(name, force=True)
        client.images.remove(fake, force=True)
