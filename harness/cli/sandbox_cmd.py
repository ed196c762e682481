"""``callbox sandbox ...``: living sandboxes from the command line.

A living sandbox has a name and outlives the command that created it, until its
time-to-live runs out (``keep-alive`` pushes it; a paused sandbox's clock stands still).
The verbs, each with ``--json``:

* lifetime (:mod:`harness.cli.sandbox_life`): ``new``, ``ls``, ``pause``, ``resume``,
  ``keep-alive``, ``rm``, ``snapshot``, ``snapshots``, ``rm-snapshot``, ``fork``, ``restore``;
* snapshots that travel (:mod:`harness.cli.sandbox_travel`): ``export-snapshot``,
  ``import-snapshot``;
* processes (:mod:`harness.cli.sandbox_jobs`): ``exec`` (foreground, or ``--background`` as a
  job), ``ps``, ``logs``, ``kill``;
* a terminal (:mod:`harness.cli.sandbox_terminal`): ``attach``;
* files and ports (:mod:`harness.cli.sandbox_files`): ``cp``, ``port``;
* network rules (:mod:`harness.cli.sandbox_network`): ``network``;
* a desktop's live view in the console (:mod:`harness.cli.sandbox_view`): ``view``.

Actions the policy governs (``[actions.NAME]``) go through its gate and the audit store (see
:mod:`harness.cli.sandbox_common`): ``exec --background`` and ``attach -- CMD`` are
``process``, ``logs`` and ``attach --pid`` are ``attach``, ``port`` is ``port_forward`` (off
unless the policy allows it), ``cp`` is ``copy_in`` or ``copy_out``, ``snapshot`` is
``snapshot``, ``fork`` and ``restore`` are ``fork``, ``pause`` and ``resume`` are ``pause``,
``network`` (changing rules) is ``network``.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.cli import (
    sandbox_files,
    sandbox_jobs,
    sandbox_life,
    sandbox_network,
    sandbox_terminal,
    sandbox_travel,
    sandbox_view,
)
from harness.cli.options import engine_options
from harness.cli.sandbox_common import CommandParser, json_errors
from harness.core.errors import UsageError

COMMANDS = ("sandbox",)

PARTS = (sandbox_life, sandbox_travel, sandbox_jobs, sandbox_terminal, sandbox_files, sandbox_network, sandbox_view)
"""The modules of the verbs, in the order ``callbox sandbox --help`` lists them."""


def add_parsers(sub: Any) -> None:
    parser = sub.add_parser("sandbox", help="named sandboxes that live on: processes, terminals, files, ports",
                            description="Named sandboxes that outlive the command that created them.")
    verbs = parser.add_subparsers(dest="sandbox_command", required=True, parser_class=CommandParser,
                                  metavar="VERB")
    for part in PARTS:
        part.add_verbs(verbs)
    for verb in verbs.choices.values():  # every verb reaches its sandboxes on the chosen engine
        engine_options(verb)


def run(args: argparse.Namespace) -> int:
    for part in PARTS:
        verb = part.VERBS.get(args.sandbox_command)
        if verb is not None:
            with json_errors(args):
                code: int = verb(args)
            return code
    raise UsageError(f"unknown sandbox verb {args.sandbox_command}")
