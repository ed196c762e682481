"""Living sandboxes without a container: lifetime records, the pause clock, names, gc's
verdicts, the snapshot archive filter and store, and cgroup reading from a made-up tree."""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from harness.core.errors import UsageError
from harness.engine.docker.cgroup_stats import CgroupReader, _parse_mountinfo
from harness.engine.docker.lifetime import (
    PAUSE_LIMIT_FACTOR,
    LifetimeRecord,
    all_records,
    claim_name,
    judge,
    name_holder,
    name_path,
    read_record,
    release_name,
    remove_record,
    remove_stale_claims,
    validate_name,
    validate_ttl,
    write_record,
)
from harness.engine.docker.snapshots import (
    Link,
    SnapshotExists,
    SnapshotNotFound,
    SnapshotStore,
    filter_place,
    link_commands,
)
from harness.engine.spec import Mount, SandboxSpec

NOW = 1_800_000_000.0


def record(**changes: object) -> LifetimeRecord:
    fields: dict[str, object] = dict(
        sandbox_id="abcdef012345", name="web", owner="user:1000", created_at=NOW - 100, ttl_s=3600.0,
        expires=NOW + 3500, container_id="c" * 64, socket_dir="/run/callbox/abcdef012345", spec={},
        tool_uid=1000, tool_gid=1000, process="host/1/1.00",
    )
    fields.update(changes)
    return LifetimeRecord(**fields)  # type: ignore[arg-type]


# ---- records and the clock --------------------------------------------------------------------


def test_record_round_trips_through_json() -> None:
    paused = record().paused(NOW)
    assert LifetimeRecord.from_json(paused.to_json()) == paused
    assert LifetimeRecord.from_json(record(name=None, owner=None).to_json()) == record(name=None, owner=None)


def test_the_clock_stands_still_while_paused() -> None:
    paused = record().paused(NOW)
    assert paused.paused_at == NOW and paused.paused_remaining_s == 3500
    assert paused.expires_at(NOW + 600) == NOW + 600 + 3500  # shown: still 3500 s left
    assert paused.paused(NOW + 5) == paused  # pausing again changes nothing
    resumed = paused.resumed(NOW + 600)
    assert resumed.expires == record().expires + 600  # moved later by exactly the paused time
    assert (resumed.paused_at, resumed.paused_remaining_s, resumed.paused_total_s) == (None, None, 600)
    assert resumed.resumed(NOW + 700) == resumed


def test_keep_alive_extends_running_time_also_while_paused() -> None:
    assert record().extended(NOW, 60).expires == NOW + 60
    assert record().extended(NOW).expires == NOW + 3600
    paused = record().paused(NOW).extended(NOW + 10, 120)
    assert paused.resumed(NOW + 1000).expires == NOW + 1000 + 120


def test_records_on_disk(tmp_path: Path) -> None:
    write_record(tmp_path, record())
    write_record(tmp_path, record(sandbox_id="0123456789ab", name=None))
    (tmp_path / "lifetime" / "junk.json").write_text("{not json")
    assert read_record(tmp_path, "abcdef012345") == record()
    assert {r.sandbox_id for r in all_records(tmp_path)} == {"abcdef012345", "0123456789ab"}
    assert claim_name(tmp_path, "web", "abcdef012345")
    remove_record(tmp_path, "abcdef012345")
    assert read_record(tmp_path, "abcdef012345") is None
    assert name_holder(tmp_path, "web") is None  # removing the record freed the name


# ---- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "web-1", "my.box_2", "0" * 63])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".x", "Web", "a b", "a/b", "0" * 64, "ü"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(UsageError, match="is not valid"):
        validate_name(name)


def test_ttl_bounds() -> None:
    assert validate_ttl(10) == 10.0
    for bad in (9.9, float("nan"), float("inf"), -1):
        with pytest.raises(UsageError):
            validate_ttl(bad)


def test_a_name_is_claimed_once(tmp_path: Path) -> None:
    assert claim_name(tmp_path, "web", "aaaaaaaaaaaa")
    assert not claim_name(tmp_path, "web", "bbbbbbbbbbbb")
    assert name_holder(tmp_path, "web") == "aaaaaaaaaaaa"
    release_name(tmp_path, "web", "bbbbbbbbbbbb")  # not the holder: nothing happens
    assert name_holder(tmp_path, "web") == "aaaaaaaaaaaa"
    release_name(tmp_path, "web", "aaaaaaaaaaaa")
    assert claim_name(tmp_path, "web", "bbbbbbbbbbbb")
    assert [p.name for p in (tmp_path / "names").iterdir()] == ["web"]  # no temporary left


def test_stale_claims_are_freed_young_ones_spared(tmp_path: Path) -> None:
    claim_name(tmp_path, "old", "aaaaaaaaaaaa")
    claim_name(tmp_path, "young", "bbbbbbbbbbbb")
    claim_name(tmp_path, "recorded", "abcdef012345")
    write_record(tmp_path, record(name="recorded"))
    hour_ago = time.time() - 3600
    os.utime(name_path(tmp_path, "old"), (hour_ago, hour_ago))
    os.utime(name_path(tmp_path, "recorded"), (hour_ago, hour_ago))
    remove_stale_claims(tmp_path)
    assert [name_holder(tmp_path, n) for n in ("old", "young", "recorded")] == [None, "bbbbbbbbbbbb", "abcdef012345"]


# ---- gc's verdicts ----------------------------------------------------------------------------


def test_without_a_record_gc_decides_as_before() -> None:
    assert not judge(state="running", record=None, kept_until=None, now=NOW).remove
    for flag in ("label_expired", "orphaned", "expiry_file_passed"):
        assert judge(state="running", record=None, kept_until=None, now=NOW, **{flag: True}).remove
    assert judge(state="exited", record=None, kept_until=None, now=NOW).remove
    # a paused run's keep: only its time counts (not the dead creator, not a stop)
    assert not judge(state="exited", record=None, kept_until=NOW + 1, now=NOW, orphaned=True).remove
    assert judge(state="running", record=None, kept_until=NOW - 1, now=NOW).remove


def test_a_named_sandbox_outlives_its_process_until_its_expiry() -> None:
    live = judge(state="running", record=record(), kept_until=None, now=NOW, orphaned=True, label_expired=True)
    assert live == judge(state="running", record=record(), kept_until=None, now=NOW)
    assert not live.remove
    expired = judge(state="running", record=record(expires=NOW - 1), kept_until=None, now=NOW)
    assert (expired.remove, expired.drop_record) == (True, True)


def test_a_named_sandbox_whose_container_stopped_or_vanished_stays_recorded() -> None:
    for state in ("exited", None):
        gone = judge(state=state, record=record(), kept_until=None, now=NOW)
        assert (gone.remove, gone.drop_record) == (True, False)  # listed as gone, restorable
    assert judge(state=None, record=record(expires=NOW - 1), kept_until=None, now=NOW).drop_record


def test_an_unnamed_recorded_sandbox_still_dies_with_its_process() -> None:
    plain = record(name=None)
    assert judge(state="running", record=plain, kept_until=None, now=NOW, orphaned=True).drop_record
    assert not judge(state="running", record=plain, kept_until=NOW + 10, now=NOW, orphaned=True).remove
    assert judge(state="exited", record=plain, kept_until=None, now=NOW).drop_record
    assert not judge(state="running", record=plain, kept_until=None, now=NOW, label_expired=True).remove


def test_a_paused_sandbox_is_never_reaped_for_its_expiry_only_past_the_hard_limit() -> None:
    paused = record(expires=NOW + 10).paused(NOW)
    later = NOW + 3 * 3600  # well past its expiry
    assert not judge(state="paused", record=paused, kept_until=NOW + 5, now=later, expiry_file_passed=True).remove
    limit = NOW + PAUSE_LIMIT_FACTOR * 3600
    assert not judge(state="paused", record=paused, kept_until=None, now=limit).remove
    over = judge(state="paused", record=paused, kept_until=None, now=limit + 1)
    assert (over.remove, over.drop_record) == (True, True)
    orphan = judge(state="paused", record=record(name=None).paused(NOW), kept_until=None, now=NOW + 1, orphaned=True)
    assert orphan.remove
    # the record says paused but the container runs (a resume cut short): the clock counts again
    assert judge(state="running", record=paused, kept_until=None, now=later).remove


def test_the_paused_ttl_of_the_spec_is_the_hard_limit_of_a_pause() -> None:
    paused = record(spec=SandboxSpec(paused_ttl_seconds=600).model_dump(mode="json")).paused(NOW)
    assert not judge(state="paused", record=paused, kept_until=None, now=NOW + 600).remove
    over = judge(state="paused", record=paused, kept_until=None, now=NOW + 601)
    assert (over.remove, over.drop_record) == (True, True)
    assert "paused TTL" in over.why


def test_a_sandbox_paused_to_disk_waits_stopped_for_its_resume_within_the_paused_ttl() -> None:
    on_disk = replace(record(expires=NOW + 10, spec=SandboxSpec(paused_ttl_seconds=600).model_dump(mode="json"))
                      .paused(NOW), paused_to_disk=True)
    assert LifetimeRecord.from_json(on_disk.to_json()) == on_disk
    # its container exited on purpose: neither its expiry nor the stop reaps it, the paused TTL does
    assert not judge(state="exited", record=on_disk, kept_until=None, now=NOW + 600, expiry_file_passed=True).remove
    over = judge(state="exited", record=on_disk, kept_until=None, now=NOW + 601)
    assert (over.remove, over.drop_record) == (True, True)
    # running while its resume (or pause) is under way: kept, though its expiry passed
    assert not judge(state="running", record=on_disk, kept_until=None, now=NOW + 100).remove
    # a container that stopped while the record says a freezer pause is gone, as before
    assert judge(state="exited", record=record(expires=NOW + 10).paused(NOW), kept_until=None, now=NOW + 1).remove
    resumed = on_disk.resumed(NOW + 100)
    assert not resumed.paused_to_disk and resumed.expires == NOW + 110


def test_a_keep_and_a_record_the_later_expiry_wins() -> None:
    assert not judge(state="running", record=record(expires=NOW - 5), kept_until=NOW + 5, now=NOW).remove
    assert not judge(state="running", record=record(expires=NOW + 5), kept_until=NOW - 5, now=NOW).remove


# ---- snapshot archives ------------------------------------------------------------------------


def download_tar(members: list[tuple[str, str, bytes | str]]) -> bytes:
    """A tar as the agent's Download makes it: (name, kind, data or link target)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            else:
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def chunks(data: bytes, size: int = 700) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


WORKSPACE_TAR = download_tar([
    ("workspace", "dir", b""), ("workspace/src", "dir", b""), ("workspace/src/a.py", "file", b"print(1)\n" * 500),
    ("workspace/link", "sym", "src/a.py"), ("workspace/project", "dir", b""),
    ("workspace/project/host.txt", "file", b"host data"), ("workspace/" + "d/" * 60 + "deep.txt", "file", b"deep"),
])


def test_the_filter_keeps_files_and_dirs_relative_to_the_place() -> None:
    out = io.BytesIO()
    result = filter_place(chunks(WORKSPACE_TAR), "/workspace", out, mounts=("/workspace/project",))
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        names = tar.getnames()
        assert tar.extractfile("src/a.py").read() == b"print(1)\n" * 500  # type: ignore[union-attr]
    assert "src" in names and "src/a.py" in names and "d/" * 59 + "d/deep.txt" in names
    assert not any(n.startswith("project") or n == "link" or n.startswith("workspace") for n in names)
    assert (result.files, result.dirs, result.bytes) == (2, 1, 4504)  # the mount point is not kept
    assert result.links == [Link("/workspace/link", "src/a.py")]
    assert result.skipped == ["/workspace/project (a mount: the host's data, not copied)"]


def test_the_filter_leaves_out_the_agents_runtime_in_tmp() -> None:
    data = download_tar([("tmp", "dir", b""), ("tmp/callbox-shell-x1", "dir", b""),
                         ("tmp/callbox-shell-x1/fifo-ish", "file", b"x"), ("tmp/mine", "file", b"y")])
    out = io.BytesIO()
    filter_place(chunks(data), "/tmp", out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        assert tar.getnames() == ["mine"]


def test_link_commands_batch_and_put_hard_links_last() -> None:
    links = [Link("/workspace/h", "/workspace/a", hard=True)] + [Link(f"/workspace/l{i}", "a") for i in range(250)]
    commands = list(link_commands(links))
    assert len(commands) == 2
    assert commands[0][:4] == ["sh", "-c", commands[0][2], "sh"] and commands[0][4:7] == ["sym", "a", "/workspace/l0"]
    assert commands[-1][-3:] == ["hard", "/workspace/a", "/workspace/h"]


def test_the_store_writes_lists_replaces_and_removes(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    project = tmp_path / "project"
    project.mkdir()
    spec = SandboxSpec(mounts=(Mount(source=project, target="/workspace/project", read_only=False),),
                       env={"A": "1"})
    trees = {"/workspace": WORKSPACE_TAR, "/tmp": download_tar([("tmp", "dir", b"")]),
             "/home/sandbox": download_tar([("sandbox", "dir", b""), ("sandbox/.profile", "file", b"x=1\n")])}

    def download(path: str) -> Iterator[bytes]:
        return chunks(trees[path])

    info = store.write("snap1", spec=spec, download=download, source_sandbox_id="abcdef012345", source_name="web",
                       owner="user:1000")
    assert info.captured == ["/home/sandbox", "/tmp", "/workspace"]
    assert info.directory == tmp_path / "snaps" / "snap1" and info.bytes > 0
    assert any("read-write mount /workspace/project" in note and str(project) in note for note in info.not_captured)
    assert any("running processes" in note for note in info.not_captured)
    assert store.get("snap1") == info
    assert store.spec(info) == spec
    assert [s.name for s in store.list()] == ["snap1"]
    with pytest.raises(SnapshotExists):
        store.write("snap1", spec=spec, download=download, source_sandbox_id="x")
    replaced = store.write("snap1", spec=spec, download=download, source_sandbox_id="y", replace=True)
    assert store.get("snap1").source_sandbox_id == "y" == replaced.source_sandbox_id

    def broken(path: str) -> Iterator[bytes]:
        yield trees[path][:1000]
        raise RuntimeError("the agent went away")

    with pytest.raises(RuntimeError):
        store.write("snap2", spec=spec, download=broken, source_sandbox_id="z")
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["snap1"]  # nothing half written
    store.remove("snap1")
    assert store.list() == []
    with pytest.raises(SnapshotNotFound):
        store.remove("snap1")


# ---- cgroup files -----------------------------------------------------------------------------


MOUNTINFO = """\
25 20 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 25 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
35 25 0:31 /nested /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
"""


def test_mountinfo_names_each_controllers_tree() -> None:
    unified, v1 = _parse_mountinfo(MOUNTINFO)
    assert unified is not None and unified.point == Path("/sys/fs/cgroup/unified")
    assert v1["cpuacct"].point == Path("/sys/fs/cgroup/cpu,cpuacct") and "cpu" not in v1
    assert v1["pids"].directory("/nested/docker/x") == Path("/sys/fs/cgroup/pids/docker/x")
    assert v1["pids"].directory("/elsewhere") is None


def test_reading_v2_and_v1_files(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    v2 = tmp_path / "cg2"
    (proc / "self" / "mountinfo").write_text(f"30 25 0:26 / {v2} rw - cgroup2 cgroup2 rw\n")
    box = v2 / "docker" / "c1"
    box.mkdir(parents=True)
    (box / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (box / "memory.current").write_text("10485760\n")
    (box / "memory.stat").write_text("anon 1\ninactive_file 1048576\n")
    (box / "pids.current").write_text("7\n")
    stats = CgroupReader(version="2", proc=proc).read("c1")
    assert stats is not None and (stats.cpu_usage_s, stats.memory_bytes, stats.pids) == (2.5, 9 << 20, 7)
    assert CgroupReader(version="2", proc=proc).read("c2") is None

    v1 = tmp_path / "cg1"
    (proc / "self" / "mountinfo").write_text(
        f"33 25 0:29 / {v1}/cpuacct rw - cgroup cgroup rw,cpuacct\n"
        f"34 25 0:30 / {v1}/memory rw - cgroup cgroup rw,memory\n")
    scope = "system.slice/docker-c3.scope"
    (v1 / "cpuacct" / scope).mkdir(parents=True)
    (v1 / "memory" / scope).mkdir(parents=True)
    (v1 / "cpuacct" / scope / "cpuacct.usage").write_text("1500000000\n")
    (v1 / "memory" / scope / "memory.usage_in_bytes").write_text("4096\n")
    (v1 / "memory" / scope / "memory.stat").write_text("total_inactive_file 1024\n")
    stats = CgroupReader(driver="systemd", version="1", proc=proc).read("c3")
    assert stats is not None and (stats.cpu_usage_s, stats.memory_bytes, stats.source) == (1.5, 3072, "cgroup v1")
