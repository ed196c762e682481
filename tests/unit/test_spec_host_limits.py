"""A spec checked against the host that runs it: cpus, memory, mount sources and the tool
user's right to write every rw mount. Each refusal is one readable line, also through the
CLI (exit 2, no traceback) and before any engine is contacted."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

from harness.cli.main import main
from harness.core.errors import CallboxError
from harness.engine.host_files import can_write
from harness.engine.spec import HostLimits, Mount, SandboxSpec, SpecError

GiB = 1 << 30
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to other users needs root")


def refusal(spec: SandboxSpec, host: HostLimits | None = None) -> SpecError:
    with pytest.raises(SpecError) as caught:
        spec.for_host(host if host is not None else HostLimits())
    return caught.value


def owned_dir(path: Path, uid: int, gid: int, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


# ---- cpus and memory ---------------------------------------------------------------------


def test_spec_error_is_a_value_error_and_a_callbox_error() -> None:
    error = SpecError("cpus", "too many")
    assert isinstance(error, ValueError) and isinstance(error, CallboxError)
    assert (error.key, error.message, error.exit_code) == ("cpus", "too many", 2)


def test_cpus_above_the_hosts_count_are_refused_naming_the_count() -> None:
    error = refusal(SandboxSpec(cpus=4), HostLimits(cpus=2))
    assert error.key == "cpus"
    assert error.message == "cpus 4 is more than the 2 CPU(s) of this host; use at most 2"
    assert SandboxSpec(cpus=2).for_host(HostLimits(cpus=2)).cpus == 2


def test_the_engines_host_is_named_as_such() -> None:
    host = HostLimits(cpus=2, where="the Docker engine's host")
    assert "the 2 CPU(s) of the Docker engine's host" in refusal(SandboxSpec(cpus=2.5), host).message


def test_memory_above_the_hosts_is_refused_naming_both_numbers() -> None:
    error = refusal(SandboxSpec(memory="1t"), HostLimits(memory=24 * GiB))
    assert error.key == "memory"
    assert error.message == "memory 1t is more than the 24.0 GiB of memory of this host; use at most 24576m"
    assert error.problem == "1t is more than the 24.0 GiB of memory of this host; use at most 24576m"
    assert SandboxSpec(memory="24g").for_host(HostLimits(memory=24 * GiB)).memory == 24 * GiB


def test_local_limits_are_this_machines() -> None:
    local = HostLimits.local()
    if os.environ.get("DOCKER_HOST", "unix://").startswith("unix://"):
        assert (local.cpus, local.memory) == (os.cpu_count(), psutil.virtual_memory().total)


def test_a_remote_engine_is_not_held_to_this_machines_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://builder.example:2376")
    assert (HostLimits.local().cpus, HostLimits.local().memory) == (None, None)
    assert SandboxSpec(cpus=500, memory="4t").for_host().cpus == 500


def test_for_host_defaults_to_this_machine() -> None:
    if not os.environ.get("DOCKER_HOST", "unix://").startswith("unix://"):
        pytest.skip("the engine is remote")
    count = os.cpu_count() or 1
    with pytest.raises(SpecError, match=f"cpus {count + 1} is more than the {count} CPU"):
        SandboxSpec(cpus=count + 1).for_host()


# ---- mount sources -----------------------------------------------------------------------


def test_a_missing_mount_source_names_its_key(tmp_path: Path) -> None:
    spec = SandboxSpec(mounts=(Mount.parse(f"{tmp_path}:/a"), Mount.parse(f"{tmp_path}/gone:/b")))
    error = refusal(spec)
    assert error.key == "mounts[1].source"
    assert error.message == f"mount source {tmp_path}/gone does not exist on the host"


def test_for_host_canonicalizes_the_sources(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    spec = SandboxSpec(mounts=(Mount.parse(f"{tmp_path}/link:/a"),)).for_host(HostLimits())
    assert spec.mounts[0].source == (tmp_path / "real").resolve()


def test_allowed_roots_are_checked(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    spec = SandboxSpec(mounts=(Mount.parse(f"{tmp_path}/out:/a"),), allowed_mount_roots=(tmp_path / "in",))
    assert "outside the allowed mount roots" in refusal(spec).message


@pytest.mark.parametrize("source", ["/var/lib/docker", "/var/lib/docker/volumes", "/var/lib", "/var/run/docker.sock"])
def test_the_docker_data_root_and_what_holds_it_are_system_paths(source: str) -> None:
    if not os.path.exists(source):
        pytest.skip(f"{source} does not exist on this host")
    error = refusal(SandboxSpec(mounts=(Mount.parse(f"{source}:/data"),)))
    assert error.key == "mounts[0].source"
    assert "is a system path" in error.message and "never mounted into a sandbox" in error.message


def test_the_engines_own_data_root_is_refused_with_everything_under_and_above_it(tmp_path: Path) -> None:
    root = tmp_path / "engine" / "data"
    (root / "overlay2").mkdir(parents=True)
    host = HostLimits(engine_paths=(str(root),))
    for source in (root, root / "overlay2", tmp_path / "engine"):
        error = refusal(SandboxSpec(mounts=(Mount.parse(f"{source}:/data"),)), host)
        assert f"it exposes the container engine's {root}" in error.message
    (tmp_path / "project").mkdir()
    assert SandboxSpec(mounts=(Mount.parse(f"{tmp_path}/project:/data"),)).for_host(host).mounts


def test_the_directory_of_docker_hosts_socket_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/run/docker.sock")
    error = refusal(SandboxSpec(mounts=(Mount.parse(f"{tmp_path}/run:/data"),)))
    assert "is a system path" in error.message


# ---- who the tool user is and whether it can write each rw mount -----------------------------


def test_without_rw_mounts_tools_run_as_the_sandbox_user(tmp_path: Path) -> None:
    spec = SandboxSpec(mounts=(Mount.parse(f"{tmp_path}:/data:ro"),)).for_host(HostLimits())
    assert spec.tool_identity() == (1000, 1000)


@needs_root
def test_tools_run_as_the_owner_of_a_rw_mount(tmp_path: Path) -> None:
    project = owned_dir(tmp_path / "p", 4242, 4343)
    spec = SandboxSpec(mounts=(Mount.parse(f"{project}:/workspace:rw"),)).for_host(HostLimits())
    assert spec.tool_identity() == (4242, 4343)


@needs_root
def test_a_root_owned_rw_mount_is_refused_naming_path_owner_group_mode_and_fixes(tmp_path: Path) -> None:
    project = owned_dir(tmp_path / "demo-project", 0, 0, 0o755)
    error = refusal(SandboxSpec(mounts=(Mount.parse(f"{project}:/workspace/project:rw"),)))
    assert error.key == "mounts[0].source"
    assert error.message == (
        f"rw mount {project} (at /workspace/project) is not writable by the tool user uid 1000, gid 1000 "
        "(the sandbox user; no rw mount is owned by a non-root user): owner root (uid 0), group root (gid 0), "
        f"mode 0755; chown it to a non-root user (`chown -R 1000:1000 {project}`), make it writable for uid "
        "1000, pick the tool uid/gid that can write it (--mount HOST:CONTAINER:rw,uid=N,gid=N, or uid and gid "
        "on its [[sandbox.mounts]] entry), or mount it :ro"
    )
    assert "\n" not in error.message
    # the same directory read-only is fine
    assert SandboxSpec(mounts=(Mount.parse(f"{project}:/workspace/project:ro"),)).for_host(HostLimits())


@needs_root
def test_a_world_writable_root_owned_rw_mount_is_accepted(tmp_path: Path) -> None:
    shared = owned_dir(tmp_path / "shared", 0, 0, 0o777)
    assert SandboxSpec(mounts=(Mount.parse(f"{shared}:/out:rw"),)).for_host(HostLimits()).tool_identity() == (
        1000, 1000)


@needs_root
def test_the_uid_option_picks_a_user_that_can_write_through_its_group(tmp_path: Path) -> None:
    shared = owned_dir(tmp_path / "shared", 0, 1001, 0o775)
    assert "not writable" in refusal(SandboxSpec(mounts=(Mount.parse(f"{shared}:/out:rw"),))).message
    spec = SandboxSpec(mounts=(Mount.parse(f"{shared}:/out:rw,uid=1001,gid=1001"),)).for_host(HostLimits())
    assert spec.tool_identity() == (1001, 1001)


@needs_root
def test_a_uid_that_cannot_write_is_refused_saying_who_asked(tmp_path: Path) -> None:
    project = owned_dir(tmp_path / "p", 1000, 1000, 0o755)
    error = refusal(SandboxSpec(mounts=(Mount.parse(f"{project}:/w:rw,uid=2000"),)))
    assert f"not writable by the tool user uid 2000, gid 2000 (asked for by {project})" in error.message
    assert "owner 1000" in error.message or "owner sandbox" in error.message or "(uid 1000)" in error.message


@needs_root
def test_two_rw_mounts_with_different_owners_are_refused_loudly(tmp_path: Path) -> None:
    mine = owned_dir(tmp_path / "a", 1000, 1000)
    theirs = owned_dir(tmp_path / "b", 4242, 4242)
    spec = SandboxSpec(mounts=(Mount.parse(f"{mine}:/a:rw"), Mount.parse(f"{theirs}:/b:rw")))
    error = refusal(spec)
    assert error.key == "mounts[1].source"
    assert error.message.startswith(
        f"rw mounts {mine} and {theirs} have different owners (uid 1000 and uid 4242); tool processes run as "
        f"one user, the owner of {mine} (uid 1000, gid 1000), which cannot write {theirs} (owner "
    )
    assert "or mount it :ro" in error.message


@needs_root
def test_rw_mounts_asking_for_different_users_are_refused(tmp_path: Path) -> None:
    a = owned_dir(tmp_path / "a", 0, 0, 0o777)
    b = owned_dir(tmp_path / "b", 0, 0, 0o777)
    spec = SandboxSpec(mounts=(Mount.parse(f"{a}:/a:rw,uid=1001"), Mount.parse(f"{b}:/b:rw,uid=1002")))
    error = refusal(spec)
    assert error.key == "mounts"
    assert "the rw mounts ask for different tool users" in error.message
    assert f"{a} uid=1001,gid=1001" in error.message and f"{b} uid=1002,gid=1002" in error.message


def test_a_rw_file_needs_only_the_write_bit(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("x")
    uid, gid = os.getuid(), os.getgid()
    note.chmod(0o644)
    assert can_write(note.stat(), uid, gid)
    (tmp_path / "d").mkdir(mode=0o600)
    assert not can_write((tmp_path / "d").stat(), uid, gid)  # a directory also needs search (x)


def test_mode_bits_are_checked_owner_then_group_then_others(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir()
    st = path.stat()
    path.chmod(0o077)  # others and group may write, but the owner may not: the owner is refused
    assert not can_write(path.stat(), st.st_uid, st.st_gid)
    path.chmod(0o707)
    assert not can_write(path.stat(), st.st_uid + 1, st.st_gid)  # same group: group bits (none)
    assert can_write(path.stat(), st.st_uid + 1, st.st_gid + 1)  # a stranger: other bits


# ---- through the CLI: one line, exit 2, before any engine ------------------------------------


def cli_refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", [["exec"], ["call", "shell", '{"command": "true"}']])
def test_cli_host_refusals_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # An unreachable engine proves nothing was contacted before the refusal.
    (tmp_path / "engine").mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/engine/none.sock")
    count = os.cpu_count() or 1
    tail = ["--", "true"] if command == ["exec"] else ["--audit-db", str(tmp_path / "a.db")]
    cases = [
        (["--cpus", "0.001"], "callbox: --cpus: 0.001 is below the minimum of 0.01 (the smallest CPU quota Docker "
                              "accepts)\n"),
        (["--cpus", str(count + 1)], f"callbox: --cpus: {count + 1} is more than the {count} CPU(s) of this host"),
        (["--memory", "64t"], f"callbox: --memory: 64t is more than the {psutil.virtual_memory().total / GiB:.1f} GiB"),
        (["--mount", f"{tmp_path}/gone:/data"], f"mount source {tmp_path}/gone does not exist on the host"),
        (["--mount", f"{tmp_path}:/data", "--mount", f"{tmp_path}:/data"], "both mount at /data"),
        (["--mount", f"{tmp_path}:/data:rw,uid=0"], "never run as root"),
    ]
    if ROOT:
        root_owned = owned_dir(tmp_path / "root-owned", 0, 0, 0o755)
        cases.append((["--mount", f"{root_owned}:/workspace/project:rw"],
                      f"rw mount {root_owned} (at /workspace/project) is not writable by the tool user"))
    for flags, message in cases:
        err = cli_refusal(capsys, [*command, *flags, *tail])
        assert err.startswith("callbox: "), err
        assert message in err, (flags, err)
    if ROOT:
        assert re.search(r"mode 0755; chown it to a non-root user", err)


def test_a_policy_with_a_missing_mount_stops_run_and_call_before_anything_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[sandbox.mounts]]\nsource = "missing"\ntarget = "/workspace/project"\nmode = "rw"\n')
    transcript = Path(__file__).resolve().parents[2] / "examples" / "demo-transcript.jsonl"
    expected = (f"callbox: policy file {policy}: key 'sandbox.mounts[0].source': mount source {tmp_path}/missing "
                "does not exist on the host")
    for argv in (["run", str(transcript)], ["call", "shell", '{"command": "true"}']):
        err = cli_refusal(capsys, [*argv, "--policy", str(policy), "--audit-db", str(tmp_path / "a.db")])
        assert err.startswith(expected), err


def test_a_workdir_inside_a_mount_must_exist_there(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    mount = Mount.parse(f"{tmp_path}:/workspace/project:ro")
    assert SandboxSpec(mounts=(mount,), workdir="/workspace/project/sub").for_host(HostLimits()).workdir
    assert SandboxSpec(mounts=(mount,), workdir="/workspace/project").for_host(HostLimits())
    error = refusal(SandboxSpec(mounts=(mount,), workdir="/workspace/project/nope"))
    assert error.key == "workdir"
    assert f"{tmp_path}/nope is not a directory" in str(error)
    # A workdir beside the mount (not inside it) gets a scratch tmpfs of its own, as before.
    assert SandboxSpec(mounts=(mount,), workdir="/workspace/projects").for_host(HostLimits())
