"""A bash context: one interactive bash process (no terminal), so its state lasts across cells.

Each cell is written to a file of the context's and sourced (``. FILE``) with stdin from
/dev/null, so the cell's cwd, variables, functions and exports stay in the shell, a syntax
error is the cell's alone, and nothing the cell runs reads the shell's own input. A second line
then writes the cell's number and ``$?`` to the control pipe. ``env_vars`` are assignments in
front of the ``.``: they hold for that cell only (what the cell sets on those names goes too).

The shell is interactive (``-i``, without a terminal, prompt, history or line editing) because
only an interactive bash abandons the whole command it runs on SIGINT: so an interrupt ends a
cell's loop as Ctrl-C does in a terminal, and the shell and its state stay.

A cell whose status is not 0 ends with an ``error``: ``ExitStatus`` with the status as its value
(as E2B's bash kernel does, which sends the status as the value and an empty name). A cell that
exits the shell (``exit``, ``set -e``) ends with an error, and a fresh shell takes its place.
"""

from __future__ import annotations

import os
import re
import shlex

from process_context import Emit, ProcessContext

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SETUP = "PS1= PS2= PS0= PROMPT_COMMAND=; unset HISTFILE; set +H +o history"


def check_env(env_vars: dict[str, str]) -> None:
    """Refuse a name bash cannot assign (ValueError, before the cell starts)."""
    bad = sorted(name for name in env_vars if not NAME.match(name))
    if bad:
        raise ValueError(f"env_vars names must be shell variable names; not: {', '.join(map(repr, bad))}")


def cell_lines(path: str, seq: int, env_vars: dict[str, str], control_fd: int) -> str:
    """What the shell reads for cell ``seq`` in ``path``: the cell, then its status on the control fd."""
    assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in env_vars.items())
    return f"{assignments}. {shlex.quote(path)} </dev/null\n{end_line(seq, '$?', control_fd)}"


def end_line(seq: int, status: str, control_fd: int) -> str:
    return f"printf '%s %s\\n' {seq} \"{status}\" >&{control_fd}\n"


class BashContext(ProcessContext):
    language = "bash"
    name = "bash"

    def command(self, child_fds: tuple[int, ...]) -> list[str]:
        return ["/bin/bash", "--noprofile", "--norc", "--noediting", "+m", "-i"]

    def start(self) -> None:
        self.cell_path = os.path.join(self.state, f"bash-{self.id}.sh")
        super().start()

    def started(self, child_fds: tuple[int, ...]) -> None:
        self.child_control_fd = child_fds[0]
        self.write_stdin(f"{SETUP}\n{end_line(0, 'ready', child_fds[0])}".encode())

    def check(self, env_vars: dict[str, str]) -> None:
        check_env(env_vars)

    def submit(self, code: str, env_vars: dict[str, str]) -> None:
        with open(self.cell_path, "w", encoding="utf-8") as cell:
            cell.write(code if code.endswith("\n") else code + "\n")
        self.write_stdin(cell_lines(self.cell_path, self.seq, env_vars, self.child_control_fd).encode())

    def ask_end(self) -> None:
        self.write_stdin(end_line(self.seq, "130", self.child_control_fd).encode())

    def control(self, message: bytes, emit: Emit) -> bool:
        seq, _, status = message.decode(errors="replace").partition(" ")
        if seq != str(self.seq):
            return False  # a stale end (asked for again after an interrupt)
        if status.strip() != "0":
            emit({"type": "error", "name": "ExitStatus", "value": status.strip(), "traceback": ""})
        return True
