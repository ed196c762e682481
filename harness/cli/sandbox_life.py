"""``callbox sandbox new | ls | pause | resume | keep-alive | rm | snapshot | snapshots |
rm-snapshot | fork | restore``: a living sandbox's lifetime and its snapshots.

``new`` takes the sandbox flags of ``callbox exec``; without ``--name`` the sandbox gets one
(``sb-XXXXXX``), because the name is what keeps it past the command. Its owner is
``user:<uid>``, its time-to-live ``--ttl`` (default an hour), pushed by ``keep-alive``.
``pause`` freezes it (the clock stops), ``resume`` thaws it (the expiry moves later by the
paused time). ``snapshot`` stores its writable places on the host; ``fork`` starts a new
sandbox from a live one (a temporary snapshot) or, with ``--from-snapshot``, from a stored
snapshot; ``restore`` brings a gone named sandbox back from its latest snapshot. ``rm``
removes a sandbox (live, paused or gone) and ends its run in the audit store (``removed``),
``rm-snapshot`` a snapshot.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.options import sandbox_options, spec_from_args
from harness.cli.sandbox_common import (
    actor,
    age,
    connect,
    end_sandbox_run,
    gate_options,
    guarded,
    load_gate_policy,
    new_name,
    opened,
    print_json,
    run_of,
    sandbox_json,
    say_sandbox,
    size,
    until,
)
from harness.core.errors import ErrorCode
from harness.core.units import parse_seconds

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.living import SandboxInfo
    from harness.engine.docker.snapshots import SnapshotInfo

MAX_TTL_S = 30 * 86400


def ttl_seconds(text: str) -> float:
    """An argparse ``type`` for ``--ttl``: seconds, at least 10 and at most 30 days."""
    try:
        seconds = parse_seconds(text, maximum=MAX_TTL_S)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 10:
        raise argparse.ArgumentTypeError(f"{text} is shorter than the shortest time-to-live, 10 seconds")
    return seconds


def add_verbs(verbs: Any) -> None:
    new = verbs.add_parser("new", help="create a named sandbox that outlives this command")
    sandbox_options(new)
    new.add_argument("--name", help="its name (default sb-XXXXXX): 1-63 of a-z 0-9 _ . -")
    new.add_argument("--ttl", type=ttl_seconds, help="time-to-live in seconds (default 3600)")
    _json(new, "print {name, sandbox_id, owner, created_at, expires_at, expires_in_s, image, network, workdir}")

    ls = verbs.add_parser("ls", help="list sandboxes: name, owner, age, expiry, state, CPU, memory")
    _json(ls, "print a JSON list of {name, sandbox_id, owner, run_id, state, paused_to_disk, created_at, age_s, "
              "expires_at, expires_in_s, cpu_usage_s, memory_bytes, pids, image}")

    for verb, what in (("pause", "freeze a sandbox (its expiry clock stops)"),
                       ("resume", "thaw a paused sandbox (its expiry moves later by the paused time)")):
        p = verbs.add_parser(verb, help=what)
        p.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
        if verb == "pause":
            p.add_argument("--to-disk", action="store_true",
                           help="save its processes and memory to disk and stop its container, freeing its memory "
                                "(gVisor: runtime runsc, network none, as root); resume restores them")
        gate_options(p)
        _json(p, "print {name, sandbox_id, state, paused_to_disk, expires_at}")

    keep = verbs.add_parser("keep-alive", help="push a sandbox's expiry")
    keep.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    keep.add_argument("--ttl", type=ttl_seconds, help="seconds from now (default: its time-to-live)")
    _json(keep, "print {name, sandbox_id, expires_at, expires_in_s}")

    rm = verbs.add_parser("rm", help="remove a sandbox (running, paused or gone) and free its name")
    rm.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    rm.add_argument("--audit-db", type=Path,
                    help="audit store whose run of the sandbox it ends (default $CALLBOX_AUDIT_DB or the state dir)")
    _json(rm, "print {removed: sandbox id, name, run_ended}")

    snap = verbs.add_parser("snapshot", help="store a sandbox's files (its writable places) on the host")
    snap.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    snap.add_argument("snapshot", help="the snapshot's name")
    snap.add_argument("--replace", action="store_true", help="replace a snapshot of that name")
    snap.add_argument("--memory", action="store_true",
                      help="also save its processes and memory (gVisor: runtime runsc, network none); a restore "
                           "or fork resumes them")
    gate_options(snap)
    _json(snap, "print the snapshot's manifest")

    snaps = verbs.add_parser("snapshots", help="list the stored snapshots")
    _json(snaps, "print a JSON list of the snapshots' manifests")

    rms = verbs.add_parser("rm-snapshot", help="remove a stored snapshot")
    rms.add_argument("snapshot", help="the snapshot's name")
    _json(rms, "print {removed_snapshot: name}")

    fork = verbs.add_parser("fork", help="a new sandbox with the files of a live sandbox or of a snapshot")
    source = fork.add_mutually_exclusive_group(required=True)
    source.add_argument("source", nargs="?", help="the sandbox to fork (name, id, or a server sandbox's E2B or run id)")
    source.add_argument("--from-snapshot", metavar="SNAP", help="fork a stored snapshot instead")
    fork.add_argument("--name", help="the new sandbox's name (default sb-XXXXXX)")
    fork.add_argument("--ttl", type=ttl_seconds, help="its time-to-live in seconds (default the source's spec)")
    gate_options(fork)
    _json(fork, "print the new sandbox as `new` does")

    restore = verbs.add_parser("restore", help="recreate a gone named sandbox from its latest snapshot")
    restore.add_argument("name", help="the sandbox's name")
    gate_options(restore)
    _json(restore, "print the sandbox as `new` does")


def _json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=what)


# ---- verbs --------------------------------------------------------------------------------------


def _new(args: argparse.Namespace) -> int:
    from harness.engine.docker.lifetime import validate_name

    if args.name is not None:
        validate_name(args.name)
    spec = spec_from_args(args)
    engine = connect(args)
    # Always cold: a warm pool lives in the process that holds it (see harness.core.shared_engine).
    sandbox = engine.create(spec, name=args.name or new_name(), ttl_s=args.ttl, owner=actor())
    sandbox.agent.close()
    if args.json:
        print_json(sandbox_json(sandbox))
    else:
        say_sandbox("created", sandbox)
    return 0


def _ls(args: argparse.Namespace) -> int:
    engine = connect(args)
    now = time.time()
    rows = [_info_json(info, now) for info in engine.list_sandboxes()]
    if args.json:
        print_json(rows, listing=True)
        return 0
    name_w = max([6, *(len(r["name"] or r["sandbox_id"]) + 2 for r in rows)])
    owner_w = max([7, *(len(r["owner"]) + 2 for r in rows)])
    state_w = max([9, *(len(_shown_state(r)) + 2 for r in rows)])
    print(f"{'NAME':<{name_w}}{'OWNER':<{owner_w}}{'AGE':<9}{'EXPIRES':<11}{'STATE':<{state_w}}{'CPU':>8}  MEMORY")
    for r in rows:
        expires = "expired" if r["expires_in_s"] <= 0 else age(r["expires_in_s"])
        cpu = "-" if r["cpu_usage_s"] is None else f"{r['cpu_usage_s']:.2f}s"
        print(f"{r['name'] or r['sandbox_id']:<{name_w}}{r['owner']:<{owner_w}}{age(r['age_s']):<9}"
              f"{expires:<11}{_shown_state(r):<{state_w}}{cpu:>8}  {size(r['memory_bytes'])}")
    return 0


def _shown_state(row: dict[str, Any]) -> str:
    """``paused (disk)`` for a sandbox paused to disk, else its state."""
    return "paused (disk)" if row["paused_to_disk"] else str(row["state"])


def _info_json(info: SandboxInfo, now: float) -> dict[str, Any]:
    from harness.engine.base import owner_run

    return {
        "name": info.name, "sandbox_id": info.sandbox_id, "owner": info.owner, "run_id": owner_run(info.owner),
        "state": info.state, "paused_to_disk": info.paused_to_disk,
        "created_at": round(info.created, 3), "age_s": round(now - info.created),
        "expires_at": round(info.expires, 3), "expires_in_s": round(info.expires - now),
        "cpu_usage_s": None if info.cpu_usage_s is None else round(info.cpu_usage_s, 3),
        "memory_bytes": info.memory_bytes, "pids": info.pids, "image": info.image,
    }


def _pause_or_resume(args: argparse.Namespace) -> int:
    op = args.sandbox_command
    policy = load_gate_policy(args)
    engine = connect(args)
    to_disk = op == "pause" and args.to_disk
    with opened(engine, args.name) as sandbox, \
            guarded(args, policy, run_of(sandbox), "pause",
                    {"sandbox": args.name, "op": op, **({"to_disk": True} if to_disk else {})},
                    workdir=sandbox.spec.workdir):
        if op == "pause":
            sandbox.pause(to_disk=to_disk)
        else:
            sandbox.resume()
    state = "paused" if op == "pause" else "running"
    if args.json:
        print_json({"name": sandbox.name, "sandbox_id": sandbox.id, "state": state, "paused_to_disk": to_disk,
                    "expires_at": round(sandbox.expires, 3)})
    elif op == "pause":
        where = " to disk (its container stopped, its memory freed)" if to_disk else ""
        print(f"paused sandbox {sandbox.label}{where}; its expiry clock stands still until "
              f"`callbox sandbox resume {sandbox.label}`")
    else:
        print(f"resumed sandbox {sandbox.label}, expires {until(sandbox.expires)}")
    return 0


def _keep_alive(args: argparse.Namespace) -> int:
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        expires = sandbox.keep_alive(args.ttl)
    if args.json:
        print_json({"name": sandbox.name, "sandbox_id": sandbox.id, "expires_at": round(expires, 3),
                    "expires_in_s": round(expires - time.time())})
    else:
        print(f"sandbox {sandbox.label} expires {until(expires)}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    engine = connect(args)
    run = _served_run(engine, args.name)
    sandbox_id = engine.remove(args.name)
    ended = end_sandbox_run(args.audit_db, run or sandbox_id)
    if args.json:
        print_json({"removed": sandbox_id, "name": None if args.name == sandbox_id else args.name,
                    "run_ended": ended})
    else:
        print(f"removed sandbox {args.name}" + ("" if args.name == sandbox_id else f" (id {sandbox_id})"))
    return 0


def _served_run(engine: DockerEngine, name_or_id: str) -> str | None:
    """The run the sandbox ``name_or_id`` serves (a server's sandbox: its E2B or gRPC id), if
    it is one: its run, not a run of the sandbox's own id, is the one ``rm`` ends."""
    from harness.engine.base import owner_run

    for info in engine.list_sandboxes(stats=False):
        run = owner_run(info.owner)
        if run is not None and name_or_id in (info.name, info.sandbox_id, run, info.owner):
            return run
    return None


def _snapshot(args: argparse.Namespace) -> int:
    from harness.engine.docker.lifetime import validate_name
    from harness.engine.docker.snapshots import SnapshotError, SnapshotExists

    validate_name(args.snapshot, "snapshot")
    policy = load_gate_policy(args)
    engine = connect(args)
    with opened(engine, args.name) as sandbox, \
            guarded(args, policy, run_of(sandbox), "snapshot", {"sandbox": args.name, "name": args.snapshot},
                    workdir=sandbox.spec.workdir) as ticket:
        try:
            info = sandbox.snapshot(args.snapshot, replace=args.replace, memory=args.memory)
        except SnapshotExists:
            raise SnapshotError(f"a snapshot named {args.snapshot} already exists; add --replace to replace it, "
                                "or pick another name", code=ErrorCode.ALREADY_EXISTS) from None
        ticket.outcome.update(bytes=info.bytes, places=info.captured, memory=info.memory is not None)
    if args.json:
        print_json(info.to_json())
        return 0
    node = getattr(sandbox, "node", None)  # the Ray engine's: the snapshot stays on that node
    print(f"snapshot {info.name} of sandbox {sandbox.label}: {', '.join(info.captured) or 'nothing'}"
          + (" and its processes and memory" if info.memory else "")
          + f" ({size(info.bytes)} in {info.seconds:.2f} s) in {info.directory}" + (f" on node {node}" if node else ""))
    for note in info.skipped:
        print(f"callbox: left out: {note}", file=sys.stderr)
    return 0


class _Snapshots:
    """Where the command's snapshots are: this machine's store (the Docker engine: read without
    connecting to it), or the nodes of the Ray cluster (through the engine, connected once)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from harness.cli.options import engine_choice

        self.args = args
        self.on_ray = engine_choice(args).ray is not None
        self._engine: DockerEngine | None = None

    @property
    def engine(self) -> DockerEngine:
        if self._engine is None:
            self._engine = connect(self.args)
        return self._engine

    def list(self) -> list[SnapshotInfo]:
        from harness.engine.docker.snapshots import SnapshotStore

        return self.engine.snapshots() if self.on_ray else SnapshotStore().list()

    def get(self, name: str) -> SnapshotInfo:
        """Snapshot ``name`` (``SnapshotNotFound`` names `callbox sandbox snapshots`)."""
        from harness.engine.docker.snapshots import SnapshotNotFound, SnapshotStore

        if not self.on_ray:
            return SnapshotStore().get(name)
        found = next((info for info in self.list() if info.name == name), None)
        if found is None:
            raise SnapshotNotFound(name)
        return found

    def remove(self, name: str) -> None:
        from harness.engine.docker.snapshots import SnapshotStore

        if self.on_ray:
            self.engine.remove_snapshot(name)
            return
        store = SnapshotStore()
        store.get(name)
        store.remove(name)


def _snapshots(args: argparse.Namespace) -> int:
    found = _Snapshots(args).list()
    if args.json:
        print_json([info.to_json() for info in found], listing=True)
        return 0
    name_w = max([10, *(len(s.name) + 2 for s in found)])
    source_w = max([8, *(len(_source(s)) + 2 for s in found)])
    print(f"{'SNAPSHOT':<{name_w}}{'SOURCE':<{source_w}}{'AGE':<9}{'SIZE':>8}  PLACES")
    now = time.time()
    for s in found:
        print(f"{s.name:<{name_w}}{_source(s):<{source_w}}{age(now - s.created_at):<9}{size(s.bytes):>8}  "
              f"{' '.join(s.captured)}" + (" +memory" if s.memory else ""))
    return 0


def _source(info: SnapshotInfo) -> str:
    return info.source_name or info.source_sandbox_id


def _rm_snapshot(args: argparse.Namespace) -> int:
    _Snapshots(args).remove(args.snapshot)  # SnapshotNotFound names `callbox sandbox snapshots`
    if args.json:
        print_json({"removed_snapshot": args.snapshot})
    else:
        print(f"removed snapshot {args.snapshot}")
    return 0


def _fork(args: argparse.Namespace) -> int:
    from harness.engine.docker.lifetime import validate_name

    if args.name is not None:
        validate_name(args.name)
    policy = load_gate_policy(args)
    # The details are what was asked (a generated name differs on each try, so it is not one).
    details: dict[str, Any] = {"name": args.name, "from_snapshot": args.from_snapshot or False}
    name = args.name or new_name()
    if args.from_snapshot:
        snapshots = _Snapshots(args)
        info = snapshots.get(args.from_snapshot)
        details["sandbox"] = _source(info)
        engine = snapshots.engine
        with guarded(args, policy, info.source_sandbox_id, "fork", details) as ticket:
            forked = engine.fork(args.from_snapshot, from_snapshot=True, name=name, owner=actor(), ttl_s=args.ttl)
            ticket.outcome.update(sandbox_id=forked.id, forked_name=forked.name)
    else:
        details["sandbox"] = args.source
        engine = connect(args)
        with opened(engine, args.source) as source, \
                guarded(args, policy, run_of(source), "fork", details, workdir=source.spec.workdir) as ticket:
            forked = engine.fork(source, name=name, owner=actor(), ttl_s=args.ttl)
            ticket.outcome.update(sandbox_id=forked.id, forked_name=forked.name)
    forked.agent.close()
    if args.json:
        print_json(sandbox_json(forked))
    else:
        say_sandbox("forked", forked)
    return 0


def _restore(args: argparse.Namespace) -> int:
    from harness.engine.docker.lifetime import name_holder, validate_name
    from harness.engine.docker.living import not_gone
    from harness.engine.docker.snapshots import SnapshotError

    validate_name(args.name)
    policy = load_gate_policy(args)
    snapshots = _Snapshots(args)
    engine = snapshots.engine
    latest = [s for s in snapshots.list() if s.source_name == args.name]
    # A sandbox that still runs is no case for restore, snapshot or not: said before anything is asked.
    named = next((s for s in engine.list_sandboxes() if s.name == args.name), None)
    if named is not None and named.state in ("running", "paused"):
        raise not_gone(args.name, named.state, latest[-1].name if latest else None)
    if not latest and named is None:
        raise SnapshotError(f"there is no sandbox named {args.name}, nor a snapshot of one, to restore; "
                            "`callbox sandbox ls` lists the sandboxes, `callbox sandbox snapshots` the snapshots")
    if not latest:
        raise SnapshotError(f"sandbox {args.name} has no snapshot to restore from (its files are gone); "
                            f"`callbox sandbox rm {args.name}` frees the name", code=ErrorCode.NOT_FOUND)
    run_root = getattr(engine, "run_root", None)  # the Ray engine's name records are on its nodes
    run_id = (name_holder(run_root, args.name) if run_root is not None else None) or latest[-1].source_sandbox_id
    details = {"sandbox": args.name, "name": args.name, "from_snapshot": latest[-1].name}
    with guarded(args, policy, run_id, "fork", details) as ticket:
        restored = engine.restore(args.name)
        ticket.outcome.update(sandbox_id=restored.id)
    restored.agent.close()
    if args.json:
        print_json(sandbox_json(restored))
    else:
        say_sandbox(f"restored from snapshot {latest[-1].name}:", restored)
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {
    "new": _new, "ls": _ls, "pause": _pause_or_resume, "resume": _pause_or_resume, "keep-alive": _keep_alive,
    "rm": _rm, "snapshot": _snapshot, "snapshots": _snapshots, "rm-snapshot": _rm_snapshot, "fork": _fork,
    "restore": _restore,
}
