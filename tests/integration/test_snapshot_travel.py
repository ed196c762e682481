"""A snapshot that travels, on the real engine: exported by the CLI from one snapshot store,
imported into another (a second host's store and engine object, over the same dockerd: the
Ray lane's tests/ray/test_ray_cli.py sends one to another node), then forked there with
every file byte for byte; a changed byte in the archive is refused naming its member."""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.docker.engine import DockerEngine
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE
from tests.integration.helpers import callbox, run

pytestmark = pytest.mark.docker

FILES = (
    "mkdir -p /workspace/src $HOME/.config && echo source > /workspace/src/a.txt && "
    "ln -s src/a.txt /workspace/link && printf '#!/bin/sh\\necho ran\\n' > /workspace/run.sh && "
    "chmod 750 /workspace/run.sh && echo home > $HOME/.config/x && echo tmp > /tmp/t.txt && "
    "head -c 3000000 /dev/urandom > /workspace/blob"
)
CHECK = ("cd /workspace && sha256sum src/a.txt run.sh blob $HOME/.config/x /tmp/t.txt && readlink link && "
         "stat -c %a run.sh && ./run.sh")


@pytest.fixture(scope="module")
def hosts(engine) -> Iterator[tuple[DockerEngine, DockerEngine]]:  # type: ignore[no-untyped-def]
    """Two engines with their own run roots and snapshot stores: the exporting host and the importing one."""
    made: list[Path] = []
    engines = []
    for _ in range(2):
        root = Path(tempfile.mkdtemp(prefix="cbx-travel-run-", dir="/tmp"))
        snapshots = Path(tempfile.mkdtemp(prefix="cbx-travel-snapshots-"))
        made += [root, snapshots]
        engines.append(DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=snapshots))
    try:
        yield engines[0], engines[1]
    finally:
        for eng in engines:
            for info in eng.list_sandboxes(stats=False):
                if info.name is not None and info.name.startswith("t-travel-"):
                    eng.remove(info.sandbox_id)
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def test_export_import_on_another_store_then_fork_is_byte_identical(
        hosts: tuple[DockerEngine, DockerEngine], tmp_path: Path) -> None:
    here, there = hosts
    tag = uuid.uuid4().hex[:6]
    original = here.create(SandboxSpec(image=IMAGE), name=f"t-travel-{tag}", owner="user:test")
    forked = None
    try:
        wrote = run(original, f"{FILES} && {CHECK}")
        assert wrote.exit_code == 0, wrote.stderr.data()
        before = wrote.stdout.data()
        here.snapshot(original, f"t-travel-{tag}")
        original.destroy()

        archive = tmp_path / "snap.tar"
        exported = callbox("sandbox", "export-snapshot", f"t-travel-{tag}", "-o", str(archive), "--json",
                           env={"CALLBOX_SNAPSHOT_DIR": str(here.snapshot_store.root)})
        assert exported.returncode == 0, exported.stderr
        digest = json.loads(exported.stdout)["sha256"]

        # A changed byte in the workspace's archive: refused, naming the member, nothing stored.
        with tarfile.open(archive) as tar:
            (member,) = [m for m in tar.getmembers() if m.name.endswith("_workspace.tar")]
        spoiled = bytearray(archive.read_bytes())
        spoiled[member.offset_data + member.size // 2] ^= 0x40
        (tmp_path / "spoiled.tar").write_bytes(spoiled)
        env = {"CALLBOX_SNAPSHOT_DIR": str(there.snapshot_store.root)}
        refused = callbox("sandbox", "import-snapshot", str(tmp_path / "spoiled.tar"), env=env)
        assert refused.returncode != 0
        assert f"snapshot archive refused: {member.name}: its SHA-256 is".encode() in refused.stderr, refused.stderr
        assert list(there.snapshot_store.root.iterdir()) == []

        imported = callbox("sandbox", "import-snapshot", str(archive), "--name", f"t-travel-{tag}-moved",
                           "--sha256", digest, env=env)
        assert imported.returncode == 0, imported.stderr
        assert f"imported snapshot t-travel-{tag}-moved".encode() in imported.stdout

        forked = there.fork(f"t-travel-{tag}-moved", from_snapshot=True, name=f"t-travel-{tag}-fork")
        after = run(forked, CHECK)
        assert after.exit_code == 0, after.stderr.data()
        assert after.stdout.data() == before
    finally:
        original.destroy()
        if forked is not None:
            forked.destroy()
