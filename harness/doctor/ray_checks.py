"""``callbox doctor``'s items for the Ray engine (run when the engine is ``ray``).

* ``ray.installed``: ray importable here, 2.52 or later (token authentication);
* ``ray.token``: the harness authenticates (a token file readable by its owner only; a
  warning when ``allow_unauthenticated`` is set, a failure naming the fix otherwise);
* ``ray.cluster-auth``: the cluster refuses a call without a token (a cluster that answers
  one runs whatever anyone who reaches it sends);
* ``ray.reachable``: the cluster answers with the token and this machine joins it as a
  driver (``ray.init``), then leaves (the driver is never left connected);
* ``ray.nodes``: the nodes that hold sandboxes (``callbox_sandboxes``), each with its
  address, liveness and capacity;
* ``ray.images``: per node, whether its sandbox image is this machine's (by content hash).

As with the other items the checks are pure functions, of a :class:`RayEvidence` that
:func:`gather_ray` collects; only that touches the cluster, and always within seconds (the
GCS is probed with a deadline before ``ray.init``, which alone would wait for minutes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import CallboxError
from harness.doctor.report import CheckResult, Status, result_maker
from harness.engine.ray.preflight import NodeView
from harness.engine.ray.settings import RaySettings, check_token_file

NOT_CHECKED = "not checked"


@dataclass
class RayEvidence:
    """What ``callbox doctor`` found out about a Ray engine's settings and cluster."""

    settings: RaySettings
    version: str | None = None
    """The installed ray's version (None: see ``version_problem``)."""
    version_problem: str | None = None
    token_problem: str | None = None
    """Why the token file is not fit now (None: it is, or there is none)."""
    auth_mode_env: str | None = None
    """``RAY_AUTH_MODE`` of this process's environment, as found."""
    unauthenticated_answer: str | None = None
    """What a call without a token got: ``refused``, ``answered``, or why it got neither."""
    reach_problem: str | None = None
    """Why the cluster cannot be used from here (None: it answered and was joined)."""
    join_s: float | None = None
    """Seconds from the first call to a joined driver."""
    nodes: list[NodeView] | None = None
    images: dict[str, str | None] | None = None
    """Per sandbox node: its image's content hash (None: missing); None: not checked."""
    images_note: str | None = None
    """Why the images were not checked, or what checking them did."""
    local_image: str | None = None
    """This machine's image's content hash (the one nodes are given), when known."""
    extra: dict[str, Any] = field(default_factory=dict)


# ---- the checks ---------------------------------------------------------------------------


def check_installed(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.installed")
    if ev.version is None:
        return make("FAIL", ev.version_problem or "ray is not installed: pip install 'callbox[ray]'")
    return make("PASS", f"ray {ev.version}")


def check_token(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.token")
    s = ev.settings
    if ev.auth_mode_env not in (None, "token") and s.token_file is not None:
        return make("FAIL", f"RAY_AUTH_MODE={ev.auth_mode_env} in this environment turns token authentication off "
                            "for the drivers started from it; unset it (the engine sets RAY_AUTH_MODE=token itself)")
    if s.token_file is None:
        return make("WARN", "ray.allow_unauthenticated = true and no token_file: the harness connects without a "
                            "token, which works only with a cluster anyone who reaches it can run code on; set "
                            "token_file to the cluster's token (mode 0600) and remove allow_unauthenticated")
    if ev.token_problem is not None:
        return make("FAIL", f"{ev.token_problem}")
    if s.allow_unauthenticated:
        return make("WARN", f"token file {s.token_file} (owner-only) is used, but ray.allow_unauthenticated = true "
                            "is set too: remove it, so a missing token is an error rather than a silent fallback")
    return make("PASS", f"RAY_AUTH_MODE=token with the token file {s.token_file}, readable by its owner only")


def check_cluster_auth(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.cluster-auth")
    answer = ev.unauthenticated_answer
    if answer == "refused":
        return make("PASS", f"a call without a token to {ev.settings.address} was refused (UNAUTHENTICATED)")
    if answer == "answered":
        return make("FAIL", f"the cluster at {ev.settings.address} answered a call without a token: whoever reaches "
                            "it can run any code on every node. Start every node with RAY_AUTH_MODE=token and "
                            "RAY_AUTH_TOKEN_PATH=<the token file> (`ray start ...`), the head first")
    return make("WARN", f"{NOT_CHECKED}: {answer or 'the cluster was not asked'}")


def check_reachable(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.reachable")
    if ev.reach_problem is not None:
        return make("FAIL", ev.reach_problem)
    took = f" in {ev.join_s:.1f} s" if ev.join_s is not None else ""
    return make("PASS", f"joined {ev.settings.address} (namespace {ev.settings.namespace}){took}, then left")


def check_nodes(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.nodes")
    if ev.nodes is None:
        return make("WARN", f"{NOT_CHECKED}: the cluster was not reached")
    # A node that died and came back is listed twice: its dead earlier life is history, not a problem.
    back = {(n.address, n.name) for n in ev.nodes if n.alive}
    holders = [n for n in ev.nodes if n.capacity > 0 and (n.alive or (n.address, n.name) not in back)]
    shown = "; ".join(f"{n.name} {n.address} {'alive' if n.alive else 'dead'}, capacity {n.capacity}"
                      for n in sorted(holders, key=lambda n: (not n.alive, n.name)))
    alive = [n for n in holders if n.alive]
    if not alive:
        return make("FAIL", (f"none alive ({shown}); " if holders else "no node advertises callbox_sandboxes; ")
                    + "start workers with `ray start --address=... --resources='{\"callbox_sandboxes\": N}'`")
    total = sum(n.capacity for n in alive)
    status: Status = "WARN" if len(alive) < len(holders) else "PASS"
    return make(status, f"{len(alive)} alive, {total} sandboxes in all: {shown}")


def check_images(ev: RayEvidence) -> CheckResult:
    make = result_maker("ray.images", f"each node holds the sandbox image {ev.settings.image}")
    if ev.images is None:
        return make("WARN", f"{NOT_CHECKED}: {ev.images_note or 'the cluster was not reached'}")
    if not ev.images:
        return make("WARN", f"{NOT_CHECKED}: no sandbox node answered")
    rows: list[str] = []
    bad = 0
    for node, digest in sorted(ev.images.items()):
        if digest is None:
            rows.append(f"{node} missing")
            bad += 1
        elif ev.local_image is not None and digest != ev.local_image:
            rows.append(f"{node} stale ({_short(digest)}, this machine has {_short(ev.local_image)})")
            bad += 1
        else:
            rows.append(f"{node} {_short(digest)}" + (" (current)" if ev.local_image is not None else ""))
    note = f" ({ev.images_note})" if ev.images_note else ""
    if bad:
        return make("FAIL", "; ".join(rows) + note + ": the engine loads the image where it is missing or stale "
                            "when it connects; see its log if it did not")
    if ev.local_image is None:
        return make("WARN", "; ".join(rows) + note + "; this machine's image was not found to compare with")
    return make("PASS", "; ".join(rows) + note)


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def ray_checks(ev: RayEvidence) -> list[CheckResult]:
    return [check_installed(ev), check_token(ev), check_cluster_auth(ev), check_reachable(ev), check_nodes(ev),
            check_images(ev)]


# ---- gathering ----------------------------------------------------------------------------


def gather_ray(settings: RaySettings, *, local_image: Callable[[str], str | None] | None = None) -> RayEvidence:
    """Ask the cluster (bounded: see the module's docstring); ``local_image`` gives this
    machine's image hash (default: from its Docker engine, None when there is none)."""
    from harness.engine.ray import preflight

    ev = RayEvidence(settings=settings, auth_mode_env=os.environ.get("RAY_AUTH_MODE"))
    try:
        ev.version = preflight.ray_version()
    except CallboxError as exc:
        ev.version_problem = exc.message
    if settings.token_file is not None:
        try:
            check_token_file(settings.token_file)
        except ValueError as exc:
            ev.token_problem = f"ray.{exc}"
    ev.unauthenticated_answer = _unauthenticated_answer(settings)
    if ev.version is None:
        ev.reach_problem = f"{NOT_CHECKED}: {ev.version_problem}"
        return ev
    started = time.monotonic()
    try:
        preflight.probe_gcs(settings)
        if settings.gcs is not None:
            ev.nodes = preflight.cluster_nodes(settings)
            preflight.check_driver_node(settings, ev.nodes)
    except CallboxError as exc:
        ev.reach_problem = exc.message
        return ev
    _join(ev, started, local_image or _local_image)
    return ev


def _unauthenticated_answer(settings: RaySettings) -> str:
    from harness.engine.ray import preflight

    if settings.gcs is None:
        return "ray.address is \"auto\": give the head's HOST:PORT to check it"
    try:
        preflight.probe_gcs(settings, with_token=False)
    except CallboxError as exc:
        return "refused" if "refused the connection" in exc.message else f"the cluster does not answer ({exc.message})"
    return "answered"


def _join(ev: RayEvidence, started: float, local_image: Callable[[str], str | None]) -> None:
    """Join the cluster as a driver (``ray.init``, as the engine does), then as the engine to
    read each sandbox node's image; leave in any case."""
    from harness.engine.ray.engine import RayEngine, connect_driver
    from harness.engine.ray.preflight import disconnect_driver

    try:
        try:
            connect_driver(ev.settings)
        except CallboxError as exc:
            ev.reach_problem = exc.message
            return
        ev.join_s = time.monotonic() - started
        if not any(node.alive and node.capacity > 0 for node in ev.nodes or []):
            ev.images_note = "no sandbox node is alive"
            return
        if not hasattr(RayEngine, "image_status"):
            ev.images_note = "this Ray engine cannot say its nodes' images yet"
            return
        try:
            engine = RayEngine.connect(ev.settings)
        except CallboxError as exc:
            ev.images_note = f"the engine did not start: {exc.message}"
            return
        try:
            ev.images = engine.image_status()
            ev.images_note = "after the engine's own check at connect, which loads a missing or stale image"
            ev.local_image = local_image(ev.settings.image)
        except CallboxError as exc:
            ev.images, ev.images_note = None, exc.message
        finally:
            engine.close()
    finally:
        disconnect_driver()


def _local_image(image: str) -> str | None:
    """This machine's ``image``'s id (its content hash), or None without it or a Docker engine."""
    try:
        from harness.engine.docker.client import connect_client

        found = connect_client().images.get(image).id
    except Exception:  # no engine here, no such image: the doctor says so instead
        return None
    return str(found) if found else None
