"""``callbox sandbox export-snapshot | import-snapshot``: a stored snapshot as one archive file
that moves to another host or node (see :mod:`harness.engine.docker.snapshot_archive`).

``export-snapshot SNAP -o FILE`` writes the snapshot (its files, spec, notes and anything
else it holds) with a manifest of SHA-256 hashes, and prints the manifest's own SHA-256;
``import-snapshot FILE`` verifies every member before it stores anything. On the Ray engine,
export reads the snapshot from a node that holds it, and import stores it on ``--node`` (or
the first node); a fork on another node copies it there as it does any snapshot.
Named like ``rm-snapshot``: ``snapshot`` itself takes a sandbox and a snapshot name, so
``snapshot export ...`` would be ambiguous.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from harness.cli.sandbox_common import print_json, size

if TYPE_CHECKING:
    from harness.engine.docker.snapshot_archive import ExportSummary
    from harness.engine.docker.snapshots import SnapshotInfo
    from harness.engine.ray.engine import RayEngine

STDIO = "-"


def add_verbs(verbs: Any) -> None:
    exp = verbs.add_parser("export-snapshot", help="write a stored snapshot to one archive, with SHA-256 hashes")
    exp.add_argument("snapshot", help="the snapshot's name")
    exp.add_argument("-o", "--output", required=True, metavar="FILE",
                     help="the archive to write (replaced when complete); - writes to standard output")
    exp.add_argument("--json", action="store_true", help="print {snapshot, file, bytes, members, sha256, seconds}")

    imp = verbs.add_parser("import-snapshot", help="verify a snapshot archive, then store its snapshot")
    imp.add_argument("file", help="the archive; - reads standard input")
    imp.add_argument("--name", help="store it under this name (default: the name it was exported under)")
    imp.add_argument("--replace", action="store_true", help="replace a snapshot of that name")
    imp.add_argument("--sha256", metavar="DIGEST",
                     help="the digest export printed: refuse an archive whose hash manifest is not this one")
    imp.add_argument("--host-access", choices=("refuse", "drop", "keep"), default="refuse",
                     help="a spec that mounts host directories or reads secrets from the host: refuse it "
                          "(default), drop those from it, or keep them (you trust the archive)")
    imp.add_argument("--node", help="the Ray engine's node to store it on (default: its first node)")
    imp.add_argument("--json", action="store_true", help="print the snapshot's manifest")


def _on_ray(args: argparse.Namespace) -> RayEngine | None:
    from harness.cli.sandbox_life import _Snapshots

    snapshots = _Snapshots(args)
    return snapshots.engine if snapshots.on_ray else None  # type: ignore[return-value]


def _export(args: argparse.Namespace) -> int:
    from harness.engine.docker.snapshot_archive import export_archive, export_to_file
    from harness.engine.docker.snapshots import SnapshotStore

    ray = _on_ray(args)
    summary: ExportSummary
    if args.output == STDIO:
        out: BinaryIO = sys.stdout.buffer
        summary = ray.export_snapshot(args.snapshot, out) if ray else export_archive(
            SnapshotStore().get(args.snapshot), out)
        out.flush()
    elif ray is not None:
        summary = ray.export_snapshot_to_file(args.snapshot, Path(args.output))
    else:
        summary = export_to_file(SnapshotStore().get(args.snapshot), Path(args.output))
    report = {"snapshot": summary.snapshot, "file": args.output, "bytes": summary.bytes,
              "members": summary.members, "sha256": summary.digest, "seconds": summary.seconds}
    say = sys.stderr if args.output == STDIO else sys.stdout
    if args.json:
        print(json.dumps(report), file=say, flush=True)
    else:
        where = "standard output" if args.output == STDIO else args.output
        print(f"exported snapshot {summary.snapshot} to {where} ({size(summary.bytes)}, {summary.members} "
              f"members, in {summary.seconds:.2f} s); sha256 {summary.digest}", file=say)
    return 0


def _import(args: argparse.Namespace) -> int:
    from harness.core.errors import UsageError
    from harness.engine.docker.snapshot_archive import import_archive, import_from_file, open_archive
    from harness.engine.docker.snapshots import SnapshotStore

    options: dict[str, Any] = {"name": args.name, "replace": args.replace, "host_access": args.host_access,
                               "expect_digest": args.sha256}
    ray = _on_ray(args)
    if args.node is not None and ray is None:
        raise UsageError("--node names a node of the Ray engine; this command uses the Docker engine")
    info: SnapshotInfo
    if args.file == STDIO:
        source: BinaryIO = sys.stdin.buffer
        info = ray.import_snapshot(source, node=args.node, **options) if ray else import_archive(
            SnapshotStore(), source, **options)
    elif ray is not None:
        with open_archive(Path(args.file)) as source:
            info = ray.import_snapshot(source, node=args.node, **options)
    else:
        info = import_from_file(SnapshotStore(), Path(args.file), **options)
    if args.json:
        print_json(info.to_json())
        return 0
    node = args.node
    print(f"imported snapshot {info.name} (of sandbox {info.source_name or info.source_sandbox_id}, image "
          f"{info.image}): {', '.join(info.captured) or 'nothing'} ({size(info.bytes)}), every member verified"
          + (f", on node {node}" if node else ""))
    for note in info.not_captured:
        if note.endswith("dropped on import"):
            print(f"callbox: {note}", file=sys.stderr)
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"export-snapshot": _export, "import-snapshot": _import}
