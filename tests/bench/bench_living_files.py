"""Rows 11 and 13 of ``make bench`` section ``living`` (see :mod:`tests.bench.bench_living`):
``cp`` of a 100 MiB tree both ways against docker's archive API, and snapshot + fork of a
100 MiB workspace against ``docker commit`` + ``docker run``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from harness.engine.docker.engine import Sandbox
from harness.engine.docker.snapshots import SnapshotStore
from harness.engine.exec_result import collect
from harness.engine.spec import TOOL_GID, TOOL_UID, WORKSPACE, Mount, SandboxSpec

if TYPE_CHECKING:
    from tests.bench.bench_living import Case, Resources, Toolkit

KIB = 1024
MIB = 1 << 20
BENCH_LABEL = "callbox.bench"
SNAPSHOT_FILES = 100
"""Files of 1 MiB in the snapshotted workspace."""
DATA = "/data"
"""The read-write bind mount both sides of row 11 copy through."""
CHUNK = MIB


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def run_ok(box: Sandbox, argv: list[str], what: str) -> bytes:
    result = collect(box.agent.exec(argv, timeout_ms=120_000, rpc_timeout=180))
    if result.exit_code != 0:
        raise RuntimeError(f"{what}: exit {result.exit_code}: {result.stderr.data()[-300:]!r}")
    return result.stdout.data()


# ---- 11. cp both ways -------------------------------------------------------------------------------


def tree_layout(scale: int) -> tuple[int, int]:
    """(files of 1 MiB, files of 32 KiB) of the copied tree."""
    return 64 // scale, 1152 // scale


def tree_bytes(scale: int) -> int:
    big, small = tree_layout(scale)
    return big * MIB + small * 32 * KIB


def make_tree(root: Path, scale: int) -> int:
    """A source tree like a checkout with build outputs; its content bytes."""
    big, small = tree_layout(scale)
    (root / "blobs").mkdir(parents=True)
    for i in range(big):
        (root / "blobs" / f"blob{i:03}.bin").write_bytes(os.urandom(MIB))
    for i in range(small):
        sub = root / "src" / f"pkg{i % 16:02}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i:04}.py").write_bytes(os.urandom(32 * KIB))
    return tree_bytes(scale)


def content_bytes(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def tar_chunks(source: Path, arcname: str) -> Iterator[bytes]:
    """A tar of ``source`` as it is written (a thread writes it into a pipe), in 1 MiB chunks."""
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            with os.fdopen(write_fd, "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|", bufsize=CHUNK) as tar:
                tar.add(source, arcname=arcname)
        except BaseException as exc:  # a broken pipe when the reader gave up, reported below
            failure.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with os.fdopen(read_fd, "rb") as pipe:
        try:
            while chunk := pipe.read(CHUNK):
                yield chunk
        finally:
            pipe.close()
            thread.join()
    if failure:
        raise failure[0]


def host_scratch(res: Resources) -> Path:
    """Where the host side of the copies lives: /dev/shm when it has room, so the disk's
    writeback (and other work on it) stays out of the figures, else the run's directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 << 30:
        return Path(tempfile.mkdtemp(prefix="callbox-bench-living-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="living-", dir=res.mount_root))


def bench_copy(res: Resources, spec: SandboxSpec, samples: int, kit: Toolkit, scale: int) -> dict[str, list[float]]:
    # The bind mount's host directory cannot be on /dev (the spec refuses it): it is on the
    # run's directory, the same for both sides.
    mount_dir = res.mount_root / "living-data"
    mount_dir.mkdir(mode=0o755)
    os.chown(mount_dir, TOOL_UID, TOOL_GID)
    work = host_scratch(res)
    box: Sandbox | None = None
    try:
        tree, host_out = work / "tree", work / "out"
        host_out.mkdir()
        size = make_tree(tree, scale)
        n_files = content_bytes(tree)[0]
        kit.progress(f"living: cp of a {size / MIB:.0f} MiB tree ({n_files} files) from and to {work.parent}, "
                     f"{samples} samples each way")
        cp_spec = spec.model_copy(update={
            "memory": 1 << 30, "workspace_size": 256 << 20,
            "mounts": (Mount(source=mount_dir, target=DATA, read_only=False),),
        })
        box = res.create_sandbox(cp_spec)
        transfer = box.transfer
        api = box.engine.client.api
        result = transfer.copy_in(tree, DATA)  # the source of the copies out
        if result.bytes != size:
            raise RuntimeError(f"setup copy_in to {DATA}: {result.bytes} of {size} bytes")

        def fresh_host_out(name: str) -> Path:
            path = host_out / name
            shutil.rmtree(path, ignore_errors=True)
            return path

        def check_host(path: Path, what: str) -> None:
            files, got = content_bytes(path)
            if (files, got) != (n_files, size):
                raise RuntimeError(f"{what}: {files} files, {got} bytes; expected {n_files}, {size}")

        def cb_in(place: str, key: str) -> Case:
            def run() -> dict[str, float]:
                if place == DATA:
                    shutil.rmtree(mount_dir / "cb_in", ignore_errors=True)
                else:
                    run_ok(box, ["rm", "-rf", f"{place}/cb_in"], "clearing the copy_in destination")
                t0 = time.perf_counter_ns()
                result = transfer.copy_in(tree, f"{place}/cb_in")
                elapsed = ms_since(t0)
                if result.bytes != size or result.files != n_files:
                    raise RuntimeError(f"copy_in to {place}: {result.to_json()}")
                return {key: elapsed}
            return run

        def cb_out(place: str, key: str) -> Case:
            def run() -> dict[str, float]:
                dest = fresh_host_out("cb")
                t0 = time.perf_counter_ns()
                result = transfer.copy_out(f"{place}/tree", dest)
                elapsed = ms_since(t0)
                if result.bytes != size or result.files != n_files:
                    raise RuntimeError(f"copy_out from {place}: {result.to_json()}")
                check_host(dest, "copy_out")  # untimed
                return {key: elapsed}
            return run

        def docker_put() -> dict[str, float]:
            shutil.rmtree(mount_dir / "dk_in", ignore_errors=True)
            t0 = time.perf_counter_ns()
            if not api.put_archive(box.container_id, DATA, tar_chunks(tree, "dk_in")):
                raise RuntimeError("put_archive refused the archive")
            elapsed = ms_since(t0)
            check_host(mount_dir / "dk_in", "put_archive")  # untimed
            return {"living_cp_in_docker": elapsed}

        def docker_get() -> dict[str, float]:
            dest = fresh_host_out("dk")
            dest.mkdir()
            t0 = time.perf_counter_ns()
            stream, _stat = api.get_archive(box.container_id, f"{DATA}/tree", chunk_size=CHUNK)
            with tarfile.open(fileobj=_Chunks(stream), mode="r|") as tar:
                for member in tar:
                    tar.extract(member, dest, filter="data")
            elapsed = ms_since(t0)
            check_host(dest / "tree", "get_archive")  # untimed
            return {"living_cp_out_docker": elapsed}

        cases = [cb_in(DATA, "living_cp_in"), docker_put, cb_in(WORKSPACE, "living_cp_in_ws"),
                 cb_out(DATA, "living_cp_out"), docker_get]
        # No warm-up round (it would cost as much as a sample): the setup copy warmed the paths.
        return kit.interleaved("living: cp", cases, samples, 0, every=1)
    finally:
        if box is not None:
            res.destroy_sandbox(box)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(mount_dir, ignore_errors=True)


class _Chunks:
    """A forward-only file object over an iterator of byte strings (for ``tarfile`` ``r|``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._buf = memoryview(chunk)
        n = len(self._buf) if size < 0 else size
        piece, self._buf = self._buf[:n], self._buf[n:]
        return bytes(piece)


# ---- 13. snapshot and fork ----------------------------------------------------------------------------


def snapshot_files(scale: int) -> int:
    return max(1, SNAPSHOT_FILES // scale)


def bench_snapshot(res: Resources, spec: SandboxSpec, samples: int, kit: Toolkit,
                   scale: int) -> dict[str, list[float]]:
    engine = res.engine
    n_files = snapshot_files(scale)
    fill = ["sh", "-c", f"for i in $(seq 1 {n_files}); do head -c {MIB} /dev/urandom > {WORKSPACE}/f$i; done"]
    snap_spec = spec.model_copy(update={"memory": 1 << 30, "workspace_size": 256 << 20})
    kit.progress(f"living: snapshot and fork of {n_files} MiB in {WORKSPACE}, {samples} samples")
    store, engine.snapshot_store = engine.snapshot_store, SnapshotStore(res.mount_root / "living-snapshots")
    client = engine.client
    bind_dir = res.mount_root / "living-commit"
    bind_dir.mkdir(mode=0o700)
    # The committed image runs hardened like the sandbox, but without the /workspace tmpfs
    # that would hide what the commit captured.
    run_kwargs = kit.hardened_run_kwargs(snap_spec, bind_dir)
    run_kwargs["tmpfs"] = {k: v for k, v in run_kwargs["tmpfs"].items() if k != WORKSPACE}
    bare_name = res.new_container_name()
    images: list[str] = []
    box = res.create_sandbox(snap_spec)
    try:
        run_ok(box, fill, "filling the workspace")
        bare = client.containers.run(spec.image, entrypoint=["sleep", "infinity"], name=bare_name, detach=True,
                                     user="0:0", network_mode="none", labels={BENCH_LABEL: "1"},
                                     mem_limit=snap_spec.memory)
        filled = bare.exec_run(fill)
        if filled.exit_code != 0:
            raise RuntimeError(f"filling the bare container: {filled.output[-300:]!r}")

        def callbox_case() -> dict[str, float]:
            name = f"bench-{uuid.uuid4().hex[:10]}"
            t0 = time.perf_counter_ns()
            info = box.snapshot(name)
            snapped = ms_since(t0)
            t1 = time.perf_counter_ns()
            fork = engine.fork(name, from_snapshot=True)
            forked = ms_since(t1)
            res.sandboxes[fork.id] = fork
            try:
                if info.bytes < n_files * MIB:
                    raise RuntimeError(f"snapshot {name} holds {info.bytes} bytes")
                run_ok(fork, ["test", "-s", f"{WORKSPACE}/f{n_files}"], "the fork's files")  # untimed
            finally:
                res.destroy_sandbox(fork)
                engine.remove_snapshot(name)
            return {"living_snapshot": snapped, "living_fork": forked, "living_snapshot_fork": snapped + forked}

        def docker_case() -> dict[str, float]:
            name = res.new_container_name()
            t0 = time.perf_counter_ns()
            image_id = str(client.api.commit(bare.id)["Id"])
            committed = ms_since(t0)
            images.append(image_id)
            t1 = time.perf_counter_ns()
            run = client.containers.run(image_id, entrypoint=["true"], name=name, detach=True, **run_kwargs)
            status = run.wait()
            ran = ms_since(t1)
            res.remove_container(name)  # untimed
            with contextlib.suppress(Exception):
                client.api.remove_image(image_id, force=True)
                images.remove(image_id)
            if status.get("StatusCode") != 0:
                raise RuntimeError(f"docker run of the committed image: {status}")
            return {"living_commit": committed, "living_commit_run": ran, "living_commit_total": committed + ran}

        # No warm-up round: a round costs seconds, and creating sandboxes is warm by now.
        return kit.interleaved("living: snapshot/fork", [callbox_case, docker_case], samples, 0, every=1)
    finally:
        res.destroy_sandbox(box)
        res.remove_container(bare_name)
        for image_id in images:
            with contextlib.suppress(Exception):
                client.api.remove_image(image_id, force=True)
        engine.snapshot_store = store
