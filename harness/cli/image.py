"""``callbox image build``: the sandbox image, built offline (idempotent)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.cli.options import UsageParser
from harness.core.errors import CallboxError

COMMANDS = ("image",)


def add_parsers(sub: Any) -> None:
    image = sub.add_parser("image", help="build the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, parser_class=UsageParser)
    build = image_sub.add_parser("build", help="build the sandbox image offline (idempotent)")
    build.add_argument("--base", help="use this local base image (Python 3.11+) instead of debootstrap")
    build.add_argument("--tag", default="callbox-sandbox:latest", help="tag for the built image")
    build.add_argument("--wheelhouse", type=Path, help="directory of wheels to use instead of PyPI")
    build.add_argument("--variant", choices=("code-interpreter", "desktop"),
                       help="build an image variant instead (code-interpreter: the E2B code interpreter's "
                            "kernel and server; tagged callbox-sandbox-code-interpreter:latest; desktop: Xvfb, "
                            "Chromium and the computer tool; tagged callbox-sandbox-desktop:latest)")


def run(args: argparse.Namespace) -> int:
    return _image_build(args)


def _image_build(args: argparse.Namespace) -> int:
    from harness.engine.docker.engine import connect_client
    from harness.engine.image import ImageBuildError, build_image
    from harness.engine.image.bundle import ensure_bundle

    client = connect_client(timeout=600)
    repo_root = Path(__file__).resolve().parents[2]

    def progress(line: str) -> None:
        print(f"callbox: {line}", file=sys.stderr)

    if args.variant:
        return _variant_build(args, client, repo_root, progress)
    try:
        result = build_image(client, repo_root=repo_root, base=args.base, tag=args.tag,
                             wheelhouse=args.wheelhouse, progress=progress)
        # Images other than callbox's run the agent from a bundle packed from this image:
        # pack it now rather than at the first such sandbox.
        bundle = ensure_bundle(client, source=result.tag, progress=progress)
        progress(f"agent bundle for other images: {bundle.path}")
    except ImageBuildError as exc:
        raise CallboxError(str(exc)) from None
    state = "built" if result.built else "up to date"
    print(f"{result.tag} {state} ({result.image_id[:19]}, {result.seconds:.1f} s)")
    return 0


def _variant_build(args: argparse.Namespace, client: Any, repo_root: Path, progress: Any) -> int:
    from harness.engine.image import ImageBuildError
    from harness.engine.image.variants import build_variant

    if args.base or args.tag != "callbox-sandbox:latest":
        raise CallboxError("--variant builds its own base and tag; it takes neither --base nor --tag")
    try:
        result = build_variant(client, args.variant, repo_root=repo_root, wheelhouse=args.wheelhouse,
                               progress=progress)
    except ImageBuildError as exc:
        raise CallboxError(str(exc)) from None
    state = "built" if result.built else "up to date"
    print(f"{result.tag} {state} ({result.image_id[:19]}, {result.seconds:.1f} s)")
    return 0
