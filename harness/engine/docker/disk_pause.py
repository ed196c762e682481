"""Pause to disk: a gVisor sandbox's processes and memory saved to disk and its container
stopped, so a paused sandbox holds no memory; resume restores them into the same container
(``callbox sandbox pause NAME --to-disk``, ``Sandbox.pause(to_disk=True)``, and the E2B
door's pause of a gVisor sandbox).

It is a memory snapshot (:mod:`harness.engine.docker.memory_snapshots`) that does not leave
the sandbox running: the agent closes its socket, ``runsc checkpoint`` writes the image into
``<run root>/paused-to-disk/<sandbox id>/`` (root's, beside the socket directories, never
inside one: those are mounted into the container) and stops the sandbox, and its container
exits. The lifetime record says ``paused_to_disk``, so every process and gc take the stopped
container for a paused one: the expiry clock stands still and ``paused_ttl_seconds`` bounds
the pause, as for a freezer pause.

Resume starts the same container again (same id, name, socket directory and spec) with a
restore request for the image: callbox's runsc wrapper turns that start into ``runsc
restore``, the agent wakes where it closed its socket and listens again, and the image is
removed. Removing the sandbox, by ``rm`` or gc, removes the image with it.

The same limits as a memory snapshot: runtime runsc, network ``none``, root; under runc it
is refused (CRIU does not work here, see :mod:`.memory_snapshots`), never replaced by a
freezer pause.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import docker.errors
import requests

from harness.core.errors import CallboxError, SandboxStartError, short_reason
from harness.engine.docker import memory_snapshots
from harness.engine.docker.kept import STALE_AFTER_S
from harness.engine.docker.lifetime import LifetimeRecord, locked, read_record, write_record

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.sandbox import Sandbox

WaitHealthy = Callable[["Sandbox", float], None]
SetExpiry = Callable[[float], None]

IMAGES_DIR = "paused-to-disk"
"""Under the run root: one memory image directory per sandbox paused to disk."""
ASKED = ("a pause to disk (--to-disk)",
         "a pause without --to-disk freezes it in memory (`callbox sandbox pause NAME`)")
STOP_TIMEOUT_S = 30
"""How long the container may take to exit once gVisor saved it."""


def image_dir(run_root: Path, sandbox_id: str) -> Path:
    return run_root / IMAGES_DIR / sandbox_id


def remove_image(run_root: Path, sandbox_id: str) -> None:
    """Remove the memory image of ``sandbox_id`` (none: no error)."""
    shutil.rmtree(image_dir(run_root, sandbox_id), ignore_errors=True)


def remove_stale_images(run_root: Path, live_ids: set[str]) -> None:
    """Remove the images of sandboxes that are no longer there (gc's sweep); a young one is
    spared, its pause may be under way."""
    directory = run_root / IMAGES_DIR
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        with contextlib.suppress(OSError):
            if entry.name not in live_ids and time.time() - entry.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(entry, ignore_errors=True)


def pause(engine: DockerEngine, sandbox: Sandbox, ensure_record: Callable[[], LifetimeRecord],
          wait_healthy: WaitHealthy) -> None:
    """Save ``sandbox`` to disk and stop its container; its record says it is paused to disk.
    Refused, before anything changes, where its processes cannot be saved."""
    memory_snapshots.refuse_unless_possible(sandbox.spec, sandbox.label, ASKED)
    command = memory_snapshots.runtime_command(engine, sandbox.container_id)
    image = image_dir(engine.run_root, sandbox.id)
    with memory_snapshots.locked(sandbox):
        with locked(engine.run_root):
            before = ensure_record()
            write_record(engine.run_root, replace(before.paused(time.time()), paused_to_disk=True))
        shutil.rmtree(image, ignore_errors=True)
        image.mkdir(parents=True, mode=0o700)
        try:
            memory_snapshots.checkpoint(engine, sandbox, image, command, leave_running=False)
            _wait_stopped(engine, sandbox)
        except BaseException:
            with locked(engine.run_root):
                write_record(engine.run_root, before)
            shutil.rmtree(image, ignore_errors=True)
            (sandbox.socket_dir / memory_snapshots.RESUME_FILE).write_text("1\n")
            with contextlib.suppress(CallboxError):
                memory_snapshots.listening_again(sandbox, wait_healthy)
            raise
    sandbox.paused_here = True


def _wait_stopped(engine: DockerEngine, sandbox: Sandbox) -> None:
    try:
        engine.client.api.wait(sandbox.container_id, timeout=STOP_TIMEOUT_S)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise CallboxError(f"sandbox {sandbox.label} was saved to disk but its container did not stop: "
                           f"{short_reason(exc)}") from None


def resume(engine: DockerEngine, sandbox: Sandbox, record: LifetimeRecord, set_expiry: SetExpiry,
           wait_healthy: WaitHealthy, timeout: float) -> float:
    """Start the container of ``sandbox`` again, restoring its image; its new expiry. A
    restore that fails leaves it paused to disk (resume again, or remove it)."""
    image = image_dir(engine.run_root, sandbox.id)
    request = memory_snapshots.restore_request(image)
    resumed = record.resumed(time.time())
    set_expiry(resumed.expires)  # the agent reads its expiry file as soon as it wakes
    (sandbox.socket_dir / memory_snapshots.RESUME_FILE).write_text("1\n")
    request(sandbox.container_id)
    try:
        engine.client.api.start(sandbox.container_id)
        memory_snapshots.check_restored(sandbox.container_id)
    except docker.errors.DockerException as exc:
        memory_snapshots.forget_request(sandbox.container_id)
        set_expiry(record.expires)
        raise SandboxStartError(f"cannot resume sandbox {sandbox.label} from its image on disk: "
                                f"{short_reason(exc)}") from None
    try:
        memory_snapshots.listening_again(sandbox, wait_healthy, timeout)
    finally:
        with locked(engine.run_root):
            current = read_record(engine.run_root, sandbox.id)
            if current is not None and current.paused_to_disk:
                write_record(engine.run_root, resumed)
        sandbox.paused_here = False
        remove_image(engine.run_root, sandbox.id)
    sandbox.expires = resumed.expires
    return resumed.expires
