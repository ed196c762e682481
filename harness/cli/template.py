"""``callbox template ls|build|rm``: the operator's templates, built offline on this host.

``build NAME`` takes the steps as flags, in the order given (each flag may repeat)::

    callbox template build web --from-image callbox-sandbox:latest --copy ./site:/srv/site \\
        --run 'chmod -R a+r /srv/site' --env PORT=8000 --start 'python3 -m http.server 8000' \\
        --ready 'curl -s localhost:8000'

The template is the operator's: every E2B client of a server on the same template directory
sees it and makes sandboxes of it (``Sandbox.create("web")``); no client can change or remove
it. It is built by the same step engine as the E2B door's builds (and cached the same way:
building the same steps again takes no build). ``ls`` lists every template with its owner
(``-`` is the operator), ``rm`` removes the operator's template of that name (``--client``
names a client's; an id names any), and the images no template uses any more.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tarfile
from pathlib import Path
from typing import Any

from harness.cli.options import UsageParser
from harness.core.errors import CallboxError, ErrorCode, UsageError

COMMANDS = ("template",)
STEP_FLAGS = {"--run": "RUN", "--copy": "COPY", "--env": "ENV", "--workdir": "WORKDIR", "--user": "USER"}


class _Step(argparse.Action):
    """Appends (step type, value) to ``steps``, keeping the order of the flags."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        steps = list(getattr(namespace, "steps", None) or [])
        steps.append((STEP_FLAGS[str(option_string)], str(values)))
        namespace.steps = steps


def add_parsers(sub: Any) -> None:
    template = sub.add_parser("template", help="the operator's E2B templates: list, build, remove")
    template_sub = template.add_subparsers(dest="template_command", required=True, parser_class=UsageParser)
    template_sub.add_parser("ls", help="list the templates (every owner's)")
    build = template_sub.add_parser("build", help="build a template from steps, offline (cached by its steps)")
    build.add_argument("name", help="the template's name (what Sandbox.create names)")
    base = build.add_mutually_exclusive_group()
    base.add_argument("--from-image", metavar="IMAGE",
                      help="a local image (default: callbox's sandbox image, E2B's e2bdev/base)")
    base.add_argument("--from-template", metavar="NAME", help="another template of the operator's")
    build.add_argument("--run", action=_Step, metavar="CMD", help="a command run with /bin/sh -c (no network)")
    build.add_argument("--copy", action=_Step, metavar="SRC:DEST", help="a host file or directory copied in")
    build.add_argument("--env", action=_Step, metavar="NAME=VALUE", help="an environment variable")
    build.add_argument("--workdir", action=_Step, metavar="DIR", help="the working directory from here on")
    build.add_argument("--user", action=_Step, metavar="USER", help="the user the next build steps run as")
    build.add_argument("--start", metavar="CMD", help="the command started in each new sandbox")
    build.add_argument("--ready", metavar="CMD", help="polled until it exits 0 before the sandbox is handed out")
    build.add_argument("--no-cache", action="store_true", help="build every step again")
    build.add_argument("--pull", action="store_true", help="pull --from-image if it is not on this host")
    build.add_argument("--network", choices=("none", "bridge"), default="none",
                       help="the network of --run steps (default: none)")
    build.set_defaults(steps=[])
    rm = template_sub.add_parser("rm", help="remove a template (and images no template uses)")
    rm.add_argument("name", help="the template's name or id")
    rm.add_argument("--client", help="remove this client's template of that name instead of the operator's")


def run(args: argparse.Namespace) -> int:
    from harness.engine.templates.store import TemplateStore

    store = TemplateStore()
    if args.template_command == "ls":
        return _ls(store)
    if args.template_command == "build":
        return _build(store, args)
    return _rm(store, args)


def _ls(store: Any) -> int:
    rows = [("NAME", "ID", "OWNER", "IMAGE", "START")]
    for template in store.all():
        built = store.built(template.key) if template.key else None
        rows.append((template.name, template.template_id, template.owner or "-",
                     built.image if built else "(not built)", template.start_cmd or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def _files_hash(source: Path) -> str:
    """A hash of ``source``'s paths, modes and contents (what decides whether a COPY changed)."""
    digest = hashlib.sha256()
    paths = [source] if source.is_file() else sorted(p for p in source.rglob("*"))
    for path in paths:
        relative = path.relative_to(source.parent).as_posix()
        digest.update(f"{relative}\0{path.stat().st_mode:o}\0".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _archive(source: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(source, arcname=source.name)
    return out.getvalue()


def _steps(store: Any, steps: list[tuple[str, str]]) -> list[Any]:
    from harness.engine.templates.steps import Step
    from harness.engine.templates.store import OPERATOR

    made: list[Step] = []
    for kind, value in steps:
        if kind == "COPY":
            src, sep, dest = value.rpartition(":")
            source = Path(src).expanduser()
            if not sep or not src or not dest:
                raise UsageError(f"--copy {value!r}: give SRC:DEST (a host path and a path in the template)")
            if not source.exists():
                raise UsageError(f"--copy {value!r}: {source} does not exist")
            files_hash = _files_hash(source.resolve())
            if not store.has_files(OPERATOR, files_hash):
                store.put_files(OPERATOR, files_hash, [_archive(source.resolve())], max_bytes=1 << 30)
            made.append(Step("COPY", (source.resolve().name, dest, "", ""), files_hash=files_hash))
        elif kind == "ENV":
            name, sep, env_value = value.partition("=")
            if not sep:
                raise UsageError(f"--env {value!r}: give NAME=VALUE")
            made.append(Step("ENV", (name, env_value)))
        else:
            made.append(Step(kind, (value,)))
    return made


def _build(store: Any, args: argparse.Namespace) -> int:
    from harness.engine.templates.build import TemplateBuilder
    from harness.engine.templates.steps import Recipe, checked
    from harness.engine.templates.store import OPERATOR

    recipe = checked(Recipe(from_image=None if args.from_template else (args.from_image or "e2bdev/base"),
                            from_template=args.from_template, steps=tuple(_steps(store, args.steps)),
                            start_cmd=args.start, ready_cmd=args.ready, force=args.no_cache))
    builder = TemplateBuilder(store, pull=args.pull, network=args.network)
    if args.network != "none":
        print(f"callbox: --run steps of {args.name} have network ({args.network})", file=sys.stderr)
    template = store.claim(OPERATOR, args.name)

    def show(level: str, message: str, step: str | None) -> None:
        print(f"callbox: [{step or '-'}] {message}", file=sys.stderr)

    built = builder.build(template, recipe, on_log=show)
    print(f"{args.name} {template.template_id} {built.image}")
    return 0


def _rm(store: Any, args: argparse.Namespace) -> int:
    from harness.engine.templates.build import TemplateBuilder
    from harness.engine.templates.store import OPERATOR

    owner = args.client if args.client is not None else OPERATOR
    found = [t for t in store.all() if t.template_id == args.name or (t.name == args.name and t.owner == owner)]
    if not found:
        raise CallboxError(f"no template {args.name!r}" + (f" of client {owner!r}" if owner else " of the operator")
                           + "; `callbox template ls` lists them", code=ErrorCode.NOT_FOUND)
    for template in found:
        store.remove(template)
        print(f"removed {template.name} ({template.template_id})")
    builder = TemplateBuilder(store)
    for built in store.prune():
        try:
            builder.remove_image(built)
        except Exception as exc:  # an image a container still uses stays; say so
            print(f"callbox: image {built.image} stays: {exc}", file=sys.stderr)
    return 0
