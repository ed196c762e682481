"""Notices the commands print once, before they start work.

A setting that loosens a hardened default (a read-write mount, a network) is said once on
stderr before the first call: ``callbox: this policy loosens a hardened default: ...``. The
policy file's own loosenings were said already, naming their keys, when it was loaded; the
engine, which logs the same words when it starts a sandbox, is kept from repeating them in
the middle of a tool call's output.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOOSENS = "this policy loosens a hardened default: %s"
"""The words of the engine's warning for each loosened setting (``DockerEngine.create``)."""


@contextmanager
def loosened_said_once(spec: Any, announced: list[str]) -> Iterator[None]:
    """Say each loosened default of the run's sandbox once, now (before the run), unless it is
    ``announced`` already (the policy file's own, logged when it was loaded), and keep the
    engine from repeating it when the sandbox starts in the middle of a tool call."""
    notes = spec.loosened()
    for note in notes:
        if note not in announced:
            print(f"callbox: {LOOSENS % note}", file=sys.stderr, flush=True)

    def repeated(record: logging.LogRecord) -> bool:
        return not (record.msg == LOOSENS and isinstance(record.args, tuple) and record.args[:1]
                    and record.args[0] in notes)

    engine_log = logging.getLogger("callbox.engine")
    engine_log.addFilter(repeated)
    try:
        yield
    finally:
        engine_log.removeFilter(repeated)
