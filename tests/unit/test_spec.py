"""Sizes, mounts and SandboxSpec: the hardened defaults and every refusal."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.core.units import format_size, parse_size
from harness.engine.spec import DEFAULT_IMAGE, HOME, Mount, SandboxSpec

MiB = 1 << 20

# ---- parse_size ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512m", 512 * MiB),
        ("1g", 1 << 30),
        ("1G", 1 << 30),
        ("100", 100),
        ("1.5k", 1536),
        ("64MiB", 64 * MiB),
        ("64mb", 64 * MiB),
        ("2kb", 2048),
        ("10b", 10),
        ("1t", 1 << 40),
        (" 8 m ", 8 * MiB),
        ("0", 0),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_passes_integers_through() -> None:
    assert parse_size(4096) == 4096


def test_parse_size_refuses_negative_integers() -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


@pytest.mark.parametrize("text", ["", "abc", "12x", "-5m", "1.2.3k", "m", "5 mega", "0x10", "1e3"])
def test_parse_size_bad_strings_name_the_format(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a size; use a number with an optional unit k, m or g"):
        parse_size(text)


@pytest.mark.parametrize(("n", "text"), [(512 * MiB, "512m"), (1 << 30, "1g"), (2048, "2k"), (1000, "1000")])
def test_format_size_round_trips(n: int, text: str) -> None:
    assert format_size(n) == text
    assert parse_size(format_size(n)) == n


# ---- Mount.parse and targets -----------------------------------------------------------


def test_mount_parse_defaults_to_read_only() -> None:
    mount = Mount.parse("/src:/data")
    assert mount.source == Path("/src")
    assert mount.target == "/data"
    assert mount.read_only is True


def test_mount_parse_ro_explicit() -> None:
    assert Mount.parse("/src:/data:ro").read_only is True


def test_mount_parse_rw() -> None:
    assert Mount.parse("/src:/data:rw").read_only is False


def test_mount_parse_bad_mode() -> None:
    with pytest.raises(ValueError, match="the mode must be ro or rw, not 'rx'"):
        Mount.parse("/src:/data:rx")


@pytest.mark.parametrize("text", ["/src", ":/data", "/src:", "", "/a:/b:ro:extra", "::ro"])
def test_mount_parse_missing_parts(text: str) -> None:
    with pytest.raises(ValueError, match=r"use HOST:CONTAINER\[:ro\|rw\[,uid=N\]\[,gid=N\]\]"):
        Mount.parse(text)


def test_mount_parse_takes_the_tool_uid_and_gid() -> None:
    mount = Mount.parse("/src:/data:rw,uid=1001,gid=1002")
    assert (mount.read_only, mount.uid, mount.gid, mount.tool_ids) == (False, 1001, 1002, (1001, 1002))
    assert Mount.parse("/src:/data:rw,uid=4242").tool_ids == (4242, 4242)  # gid defaults to the uid's number
    assert Mount.parse("/src:/data:rw").tool_ids is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/src:/data:rw,uid=0", "never run as root: pick a uid/gid of 1 or more, not 0"),
        ("/src:/data:rw,uid=5,gid=0", "never run as root"),
        ("/src:/data:rw,uid=abc", "uid takes a number, e.g. uid=1001"),
        ("/src:/data:rw,gid", "gid takes a number"),
        ("/src:/data:rw,gid=7", "gid=7 needs uid= as well"),
        ("/src:/data:ro,uid=7", "uid/gid apply to rw mounts only"),
        ("/src:/data:uid=7", "uid/gid apply to rw mounts only"),
        ("/src:/data:rw,exec", "the mode must be ro or rw, not 'exec'"),
    ],
)
def test_mount_parse_refuses_bad_ids(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Mount.parse(text)


def test_mount_target_is_normalized() -> None:
    assert Mount.parse("/src:/data/./sub/../x/").target == "/data/x"


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/proc",
        "/proc/x",
        "/sys/fs",
        "/dev",
        "/run/callbox",
        "/run/callbox/agent.sock",
        "/etc",
        "/usr/lib",
        "/bin",
        "/data/../etc",
        "/./proc",
    ],
)
def test_reserved_targets_are_refused(target: str) -> None:
    with pytest.raises(ValidationError, match="which the sandbox needs"):
        Mount(source=Path("/src"), target=target)


@pytest.mark.parametrize("target", ["//proc", "//etc", "//run/callbox", "//usr/bin"])
def test_reserved_targets_with_a_double_leading_slash_are_refused(target: str) -> None:
    """POSIX normpath keeps a leading '//', but Docker cleans it to '/': still reserved."""
    with pytest.raises(ValidationError):
        Mount(source=Path("/src"), target=target)


@pytest.mark.parametrize("target", ["/procfs", "/etcetera", "/run", "/data", "/workspace/sub", "/home/u"])
def test_targets_that_only_share_a_prefix_are_allowed(target: str) -> None:
    assert Mount(source=Path("/src"), target=target).target == target


def test_relative_target_is_refused() -> None:
    with pytest.raises(ValidationError, match="must be an absolute path"):
        Mount.parse("/src:data")


def test_mount_is_frozen_and_strict() -> None:
    with pytest.raises(ValidationError):
        Mount(source=Path("/src"), target="/data", mode="rw")  # type: ignore[call-arg]


# ---- Mount.canonical against real directories ------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "allowed" / "proj").mkdir(parents=True)
    (tmp_path / "allowed" / "proj" / "f.txt").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "file.txt").write_text("f")
    return tmp_path


def test_canonical_resolves_symlinks(tree: Path) -> None:
    link = tree / "link"
    link.symlink_to(tree / "allowed" / "proj")
    mount = Mount(source=link, target="/data").canonical(None)
    assert mount.source == (tree / "allowed" / "proj").resolve()
    assert not mount.source.is_symlink()
    assert mount.target == "/data"


def test_canonical_resolves_dotdot(tree: Path) -> None:
    mount = Mount(source=tree / "elsewhere" / ".." / "allowed", target="/data").canonical(None)
    assert mount.source == (tree / "allowed").resolve()


def test_canonical_keeps_mode(tree: Path) -> None:
    mount = Mount.parse(f"{tree / 'allowed'}:/data:rw").canonical(None)
    assert mount.read_only is False


def test_canonical_accepts_a_regular_file(tree: Path) -> None:
    assert Mount(source=tree / "file.txt", target="/f").canonical(None).source == (tree / "file.txt").resolve()


def test_canonical_refuses_a_missing_source(tree: Path) -> None:
    with pytest.raises(ValueError, match="does not exist on the host"):
        Mount(source=tree / "missing", target="/data").canonical(None)


def test_canonical_refuses_a_dangling_symlink(tree: Path) -> None:
    (tree / "dangling").symlink_to(tree / "nowhere")
    with pytest.raises(ValueError, match="does not exist"):
        Mount(source=tree / "dangling", target="/data").canonical(None)


def test_canonical_refuses_a_path_under_a_regular_file_with_a_value_error(tree: Path) -> None:
    """A readable refusal, not a raw OSError (NotADirectoryError) escaping to the caller."""
    with pytest.raises(ValueError, match="does not exist"):
        Mount(source=tree / "file.txt" / "sub", target="/data").canonical(None)


@pytest.mark.parametrize("source", ["/etc", "/proc", "/proc/self", "/sys", "/dev", "/", "/run"])
def test_canonical_refuses_system_paths(source: str) -> None:
    if not os.path.exists(source):
        pytest.skip(f"{source} does not exist on this host")
    with pytest.raises(ValueError, match="system path"):
        Mount(source=Path(source), target="/data").canonical(None)


def test_canonical_refuses_a_symlink_to_a_system_path(tree: Path) -> None:
    (tree / "sneaky").symlink_to("/etc")
    with pytest.raises(ValueError, match="system path"):
        Mount(source=tree / "sneaky", target="/data").canonical(None)


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    try:
        yield path
    finally:
        sock.close()


def test_canonical_refuses_a_unix_socket(unix_socket: Path) -> None:
    assert unix_socket.is_socket()
    with pytest.raises(ValueError, match="is a socket"):
        Mount(source=unix_socket, target="/var/run/x.sock").canonical(None)


def test_canonical_refuses_a_symlink_to_a_unix_socket(unix_socket: Path) -> None:
    link = unix_socket.parent / "innocent"
    link.symlink_to(unix_socket)
    with pytest.raises(ValueError, match="is a socket"):
        Mount(source=link, target="/data").canonical(None)


def test_canonical_accepts_a_source_inside_the_allowed_roots(tree: Path) -> None:
    roots = (tree.resolve() / "allowed",)
    mount = Mount(source=tree / "allowed" / "proj", target="/data").canonical(roots)
    assert mount.source == (tree / "allowed" / "proj").resolve()


def test_canonical_accepts_the_root_itself(tree: Path) -> None:
    root = (tree / "allowed").resolve()
    assert Mount(source=root, target="/data").canonical((root,)).source == root


def test_canonical_refuses_a_source_outside_the_allowed_roots(tree: Path) -> None:
    roots = ((tree / "allowed").resolve(),)
    with pytest.raises(ValueError, match="outside the allowed mount roots"):
        Mount(source=tree / "elsewhere", target="/data").canonical(roots)


def test_canonical_refuses_a_symlink_escaping_the_allowed_roots(tree: Path) -> None:
    root = (tree / "allowed").resolve()
    (root / "escape").symlink_to(tree / "elsewhere")
    with pytest.raises(ValueError, match="outside the allowed mount roots"):
        Mount(source=root / "escape", target="/data").canonical((root,))


def test_canonical_refuses_a_sibling_with_a_common_prefix(tree: Path) -> None:
    root = (tree / "allowed").resolve()
    (tree / "allowed-not").mkdir()
    with pytest.raises(ValueError, match="outside the allowed mount roots"):
        Mount(source=tree / "allowed-not", target="/data").canonical((root,))


def test_spec_allowed_mount_roots_is_what_canonical_receives(tree: Path) -> None:
    root = (tree / "allowed").resolve()
    spec = SandboxSpec(mounts=(Mount(source=tree / "elsewhere", target="/data"),), allowed_mount_roots=(root,))
    with pytest.raises(ValueError, match="outside the allowed mount roots"):
        spec.mounts[0].canonical(spec.allowed_mount_roots)


# ---- SandboxSpec -----------------------------------------------------------------------


def test_defaults_are_the_hardened_ones() -> None:
    spec = SandboxSpec()
    assert spec.network == "none"
    assert spec.memory == 512 * MiB
    assert spec.pids == 256
    assert spec.cpus == 1.0
    assert spec.image == DEFAULT_IMAGE
    assert spec.mounts == ()
    assert spec.allow_hosts == ()
    assert spec.env == {}
    assert spec.workdir == "/workspace"
    assert spec.loosened() == []


def test_default_tmpfs_sizes_leave_room_for_the_agent() -> None:
    spec = SandboxSpec()
    assert spec.effective_tmp_size == 64 * MiB
    assert spec.effective_workspace_size == 128 * MiB
    assert spec.effective_home_size == spec.small_tmpfs_size == 32 * MiB  # room for a pip cache
    assert spec.shm_size == 16 * MiB
    assert spec.scratch_tmpfs() == {"/workspace": 128 * MiB, "/tmp": 64 * MiB, HOME: 32 * MiB}
    assert spec.tmpfs_total == 240 * MiB
    assert spec.tmpfs_total <= spec.memory // 2


@pytest.mark.parametrize("memory", ["32m", "96m", "256m", "1g", "8g"])
def test_default_tmpfs_sizes_stay_under_half_of_any_memory(memory: str) -> None:
    spec = SandboxSpec(memory=memory)
    assert spec.tmpfs_total < spec.memory // 2
    assert spec.effective_home_size == spec.memory // 16


def test_tmpfs_adding_up_past_half_the_memory_is_refused() -> None:
    with pytest.raises(ValidationError, match="keep tmp_size \\+ workspace_size \\+ home_size under half of memory"):
        SandboxSpec(memory="256m", tmp_size="100m", workspace_size="100m")
    with pytest.raises(ValidationError, match="the tmpfs mounts would take 168m of the 256m memory limit"):
        SandboxSpec(memory="256m", home_size="64m")
    assert SandboxSpec(memory="256m", tmp_size="32m", workspace_size="64m").tmpfs_total == 120 * MiB


def test_home_size_must_be_smaller_than_memory() -> None:
    with pytest.raises(ValidationError, match="home_size 256m must be smaller than the memory limit, 256m"):
        SandboxSpec(memory="256m", home_size="256m")
    assert SandboxSpec(memory="1g", home_size="100m").effective_home_size == 100 * MiB


# ---- scratch places and the mounts that replace them -------------------------------------


@pytest.mark.parametrize("target", ["/workspace", "/tmp", HOME])
def test_a_mount_at_a_scratch_place_replaces_its_tmpfs(target: str) -> None:
    spec = SandboxSpec(mounts=(Mount.parse(f"/src:{target}:rw"),))
    assert target not in spec.scratch_tmpfs()
    assert set(spec.scratch_tmpfs()) == {"/workspace", "/tmp", HOME} - {target}
    # its size no longer counts against the memory limit
    assert spec.tmpfs_total == SandboxSpec().tmpfs_total - SandboxSpec().scratch_tmpfs()[target]


def test_a_mount_at_a_parent_of_a_scratch_place_wins_there_too() -> None:
    spec = SandboxSpec(mounts=(Mount.parse("/src:/home"),))
    assert HOME not in spec.scratch_tmpfs()
    assert set(spec.scratch_tmpfs()) == {"/workspace", "/tmp"}


def test_a_mount_below_a_scratch_place_keeps_the_tmpfs_around_it() -> None:
    spec = SandboxSpec(mounts=(Mount.parse("/src:/workspace/project:rw"),))
    assert set(spec.scratch_tmpfs()) == {"/workspace", "/tmp", HOME}


def test_a_mount_that_only_shares_a_prefix_does_not_replace_a_scratch_place() -> None:
    spec = SandboxSpec(mounts=(Mount.parse("/src:/workspace2"), Mount.parse("/src2:/tm")))
    assert set(spec.scratch_tmpfs()) == {"/workspace", "/tmp", HOME}


def test_workdir_gets_a_tmpfs_only_when_nothing_holds_it() -> None:
    assert "/work" in SandboxSpec(workdir="/work").scratch_tmpfs()
    assert "/src" not in SandboxSpec(workdir="/src", mounts=(Mount.parse("/h:/src"),)).scratch_tmpfs()
    # a workdir inside a mount is the host's directory: no tmpfs over it
    covered = SandboxSpec(workdir="/src/sub", mounts=(Mount.parse("/h:/src"),)).scratch_tmpfs()
    assert set(covered) == {"/workspace", "/tmp", HOME}


@pytest.mark.parametrize("place", ["/workspace", "/tmp", HOME])
def test_scratch_places_are_executable_by_default_and_noexec_on_request(place: str) -> None:
    options = SandboxSpec().tmpfs_options(place, 1000, 1000).split(",")
    assert "exec" in options and "noexec" not in options
    assert {"rw", "nosuid", "nodev"} <= set(options)
    tight = SandboxSpec(noexec=True).tmpfs_options(place, 1000, 1000).split(",")
    assert "noexec" in tight and "exec" not in tight
    assert {"rw", "nosuid", "nodev"} <= set(tight)


def test_scratch_ownership() -> None:
    spec = SandboxSpec()
    assert spec.tmpfs_options("/tmp", 1001, 1002).endswith("mode=1777")
    assert spec.tmpfs_options("/workspace", 1001, 1002).endswith("mode=0755,uid=1001,gid=1002")
    assert f"size={32 * MiB}" in spec.tmpfs_options(HOME, 1001, 1002)


def test_var_tmp_is_a_scratch_place_any_user_writes_only_where_sized() -> None:
    assert "/var/tmp" not in SandboxSpec().scratch_tmpfs()  # unset: the image's, read-only
    spec = SandboxSpec(memory="1g", var_tmp_size="48m")
    assert spec.scratch_tmpfs()["/var/tmp"] == 48 * MiB
    assert spec.tmpfs_options("/var/tmp", 1001, 1002).endswith(f"size={48 * MiB},mode=1777")
    assert spec.tmpfs_total == SandboxSpec(memory="1g").tmpfs_total + 48 * MiB
    assert "var_tmp_size" in spec.space_for("/var/tmp/tools/x")
    assert "/var/tmp" not in SandboxSpec(var_tmp_size="8m", mounts=(Mount.parse("/src:/var"),)).scratch_tmpfs()


def test_var_tmp_counts_in_the_tmpfs_half_of_memory() -> None:
    with pytest.raises(ValidationError, match="keep tmp_size \\+ workspace_size \\+ home_size \\+ var_tmp_size under"):
        SandboxSpec(var_tmp_size="48m")  # 240m of 512m are taken by default
    with pytest.raises(ValidationError, match="var_tmp_size 512m must be smaller than the memory limit"):
        SandboxSpec(var_tmp_size="512m")


def test_noexec_is_not_a_loosening() -> None:
    assert SandboxSpec(noexec=True).loosened() == []


def test_two_mounts_at_one_target_are_refused() -> None:
    with pytest.raises(ValidationError, match=(r"mounts\[0\] and mounts\[2\] both mount at /data; a container "
                                               "path takes one mount: pick another target for one of them")):
        SandboxSpec(mounts=(Mount.parse("/a:/data"), Mount.parse("/b:/other"), Mount.parse("/c:/data/:rw")))


@pytest.mark.parametrize(
    ("cpus", "message"),
    [
        (0.001, "0.001 is below the minimum of 0.01 (the smallest CPU quota Docker accepts)"),
        (0, "0 is below the minimum of 0.01"),
        (-1, "-1 is below the minimum of 0.01"),
        (float("nan"), "is not a number of cores"),
        (float("inf"), "is not a number of cores"),
    ],
)
def test_cpus_below_the_minimum_are_refused_with_a_whole_message(cpus: float, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        SandboxSpec(cpus=cpus)
    assert SandboxSpec(cpus=0.01).cpus == 0.01


def test_sizes_accept_docker_notation() -> None:
    spec = SandboxSpec(memory="1g", tmp_size="100m", workspace_size="200m", fsize="2g")
    assert spec.memory == 1 << 30
    assert spec.tmp_size == 100 * MiB
    assert spec.workspace_size == 200 * MiB
    assert spec.fsize == 2 << 30


def test_bad_size_string_is_a_validation_error_naming_the_format() -> None:
    with pytest.raises(ValidationError, match="use a number with an optional unit"):
        SandboxSpec(memory="lots")


def test_too_little_memory_is_refused() -> None:
    with pytest.raises(ValidationError):
        SandboxSpec(memory="1m")


def test_allowlist_mode_takes_hosts_and_normalises_nothing_away() -> None:
    spec = SandboxSpec(network="allowlist", allow_hosts=("example.com:443", "*.pypi.org"))
    assert spec.allow_hosts == ("example.com:443", "*.pypi.org")
    assert spec.loosened() == ["network allowlist (example.com:443, *.pypi.org)"]
    assert SandboxSpec(network="open").loosened() == ["network open"]


def test_allowlist_mode_without_hosts_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs at least one allowed host"):
        SandboxSpec(network="allowlist")


@pytest.mark.parametrize("network", ["none", "open"])
def test_hosts_without_allowlist_mode_are_refused(network: str) -> None:
    with pytest.raises(ValidationError, match="only apply to network 'allowlist'"):
        SandboxSpec(network=network, allow_hosts=("example.com",))  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", ["", "*", "*bad.example.com", "example.com:99999", "exa mple.com", "bücher.de"])
def test_malformed_allowlist_entries_are_refused_with_the_proxys_own_parser(entry: str) -> None:
    with pytest.raises(ValidationError, match="invalid allowlist entry"):
        SandboxSpec(network="allowlist", allow_hosts=(entry,))


def test_unknown_network_mode_is_refused() -> None:
    with pytest.raises(ValidationError):
        SandboxSpec(network="host")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["tmp_size", "workspace_size"])
def test_tmpfs_as_large_as_memory_is_refused(field: str) -> None:
    with pytest.raises(ValidationError, match="smaller than the memory limit"):
        SandboxSpec(memory="256m", **{field: "256m"})
    with pytest.raises(ValidationError, match="smaller than the memory limit"):
        SandboxSpec(memory="256m", **{field: "1g"})
    assert getattr(SandboxSpec(memory="256m", **{field: "32m"}), field) == 32 * MiB


@pytest.mark.parametrize("name", ["PATH_2", "_X", "a", "A1"])
def test_valid_env_names(name: str) -> None:
    assert SandboxSpec(env={name: "v"}).env == {name: "v"}


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A B", "A=B", "É", "X\0"])
def test_invalid_env_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="is not valid"):
        SandboxSpec(env={name: "v"})


def test_env_name_with_a_trailing_newline_is_refused() -> None:
    """``$`` in the name pattern also matches before a final newline: 'A\\n' must still be refused."""
    with pytest.raises(ValidationError, match="is not valid"):
        SandboxSpec(env={"A\n": "v"})


def test_env_value_with_nul_is_refused() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        SandboxSpec(env={"OK": "a\0b"})


def test_env_value_may_contain_anything_else() -> None:
    assert SandboxSpec(env={"OK": "a=b; $(x) \n"}).env["OK"] == "a=b; $(x) \n"


def test_relative_workdir_is_refused() -> None:
    with pytest.raises(ValidationError, match="must be an absolute path"):
        SandboxSpec(workdir="work")


def test_workdir_is_normalized() -> None:
    assert SandboxSpec(workdir="/workspace/a/../b/").workdir == "/workspace/b"


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        SandboxSpec(privileged=True)  # type: ignore[call-arg]


def test_loosened_reports_rw_mounts_only() -> None:
    spec = SandboxSpec(mounts=(Mount.parse("/a:/ro-data"), Mount.parse("/b:/rw-data:rw"), Mount.parse("/c:/out:rw")))
    notes = spec.loosened()
    assert len(notes) == 1
    assert "read-write" in notes[0]
    assert "/rw-data" in notes[0]
    assert "/out" in notes[0]
    assert "/ro-data" not in notes[0]


def test_read_only_mounts_are_not_a_loosening() -> None:
    assert SandboxSpec(mounts=(Mount.parse("/a:/data"),)).loosened() == []
