"""The harness's side of the egress proxy's holds (:mod:`sandbox.egress_hold` is the proxy's).

A Docker sandbox whose ``allow_hosts`` has an ``ask`` entry gets an :class:`EgressAskChannel`
on the directory its proxy has mounted (``<run root>/egress/<sandbox id>/``): it reads the
``hold`` lines the proxy appends to its log (each handed out once, whoever asks), writes the
answer file the held connection waits for, and adds a destination allowed for the whole
sandbox to ``approved.json``. Files are written whole and renamed into place, so the proxy
never reads half of one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.egress_hold import APPROVED_FILE, answer_path
from sandbox.egress_policy import hostport

__all__ = ["EgressAskChannel", "Hold"]

log = logging.getLogger("callbox.egress")


@dataclass(frozen=True)
class Hold:
    """A connection the proxy holds until it gets an answer (a ``hold`` line of its log)."""

    hold: str
    sandbox_id: str
    method: str
    host: str
    port: int
    timeout_s: float
    ts: float

    @property
    def destination(self) -> str:
        return hostport(self.host, self.port)

    @classmethod
    def parse(cls, sandbox_id: str, line: str) -> Hold | None:
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("event") != "hold":
            return None
        try:
            return cls(hold=str(data["hold"]), sandbox_id=sandbox_id, method=str(data.get("method") or ""),
                       host=str(data["host"]), port=int(data["port"]), timeout_s=float(data["timeout_s"]),
                       ts=float(data.get("ts") or 0.0))
        except (KeyError, TypeError, ValueError):
            return None


class EgressAskChannel:
    """Holds and answers for the proxy of one sandbox, whose files live in ``directory``."""

    def __init__(self, sandbox_id: str, directory: Path, events_file: str) -> None:
        self.sandbox_id, self.directory, self.events = sandbox_id, directory, directory / events_file
        self._offset = 0
        self._lock = threading.Lock()

    def new_holds(self) -> list[Hold]:
        """The holds the proxy logged since the last look (by anyone)."""
        with self._lock:
            try:
                with open(self.events, "rb") as handle:
                    handle.seek(self._offset)
                    data = handle.read()
            except FileNotFoundError:
                return []
            except OSError as exc:
                log.warning("cannot read the egress log of sandbox %s: %s", self.sandbox_id, exc)
                return []
            complete = data[:data.rfind(b"\n") + 1]  # never half a line
            self._offset += len(complete)
        text = complete.decode("utf-8", "replace")
        return [h for line in text.splitlines() if '"hold"' in line and (h := Hold.parse(self.sandbox_id, line))]

    def answer(self, hold: Hold, *, allow: bool, approval: str | None, by: str, scope: str,
               reason: str | None = None) -> None:
        """Let the held connection proceed (``allow``) or be refused; ``scope`` says what the
        answer covers (``once``, ``sandbox``, ``timeout``, ``ended``). A sandbox-wide allow
        is added to ``approved.json`` first, so a connection that comes meanwhile goes through."""
        if allow and scope == "sandbox":
            self._approve_for_sandbox(hold.destination)
        record: dict[str, Any] = {"decision": "allow" if allow else "deny", "approval": approval, "by": by,
                                  "scope": scope, "reason": reason}
        self._write(Path(answer_path(str(self.directory), hold.hold)), json.dumps(record))

    def approved(self) -> list[str]:
        """The destinations allowed for the whole sandbox so far."""
        try:
            data = json.loads((self.directory / APPROVED_FILE).read_text())
        except (OSError, ValueError):
            return []
        listed = data.get("allow") if isinstance(data, dict) else None
        return [str(item) for item in listed] if isinstance(listed, list) else []

    def _approve_for_sandbox(self, destination: str) -> None:
        with self._lock:
            listed = self.approved()
            if destination not in listed:
                self._write(self.directory / APPROVED_FILE, json.dumps({"allow": [*listed, destination]}))

    def _write(self, path: Path, text: str) -> None:
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            temporary.write_text(text + "\n")
            temporary.chmod(0o644)
            os.replace(temporary, path)
        except FileNotFoundError:  # the sandbox (and its proxy) went meanwhile: nobody waits any more
            log.info("sandbox %s: its egress proxy is gone; the answer in %s was not delivered", self.sandbox_id,
                     path.name)
