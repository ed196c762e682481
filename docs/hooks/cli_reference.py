"""The CLI reference, read from the argparse parsers ``callbox`` itself runs with.

Every command and subcommand gets a section whose heading carries a stable anchor made of its
words (``callbox sandbox new`` is ``#callbox-sandbox-new``), its usage line (formatted at a fixed
width, so the page does not depend on the terminal that built it), its description, and one
table per argument group: each option with its help text, its choices and its default.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from docs.hooks.text import cell, code, escape, table

USAGE_WIDTH = 76


@dataclass(frozen=True)
class Command:
    """One command of the tree: its words (``("callbox", "sandbox", "new")``), its parser and
    the one-line help its parent lists it with."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser
    summary: str
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def anchor(self) -> str:
        return "-".join(self.words)


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ("callbox",), summary: str = "",
             aliases: tuple[str, ...] = ()) -> Iterator[Command]:
    """``parser`` and every command below it, depth first, in the order ``--help`` lists them."""
    yield Command(words, parser, summary, aliases)
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        # An alias maps to the same parser as its command: one section, its other names listed.
        by_parser: dict[int, tuple[argparse.ArgumentParser, list[str]]] = {}
        for name, sub in action.choices.items():
            by_parser.setdefault(id(sub), (sub, []))[1].append(name)
        for sub, (first, *others) in by_parser.values():
            yield from commands(sub, (*words, first), helps.get(first, ""), tuple(others))


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line as ``--help`` prints it, at :data:`USAGE_WIDTH` columns."""
    kind = parser.formatter_class
    wide = isinstance(kind, type) and issubclass(kind, argparse.HelpFormatter)
    formatter = kind(prog=parser.prog, width=USAGE_WIDTH) if wide else kind(prog=parser.prog)  # type: ignore[call-arg]
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser.formatter_class(prog=parser.prog)
    return formatter._expand_help(action) if action.help else ""


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser.formatter_class(prog=parser.prog)
    return formatter._format_action_invocation(action)


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._CountAction):
        return ""
    if isinstance(value, list | tuple) and not value:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(code(str(v)) for v in value)
    return code(str(value))


def _choices(action: argparse.Action) -> str:
    if action.choices is None or isinstance(action, argparse._SubParsersAction):
        return ""
    return ", ".join(code(str(choice)) for choice in action.choices)


def _group_table(parser: argparse.ArgumentParser, actions: list[argparse.Action], *, top: bool) -> str:
    rows = []
    for action in actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction) and not top:
            continue  # every command has -h, --help: the reference lists it once, at the top
        rows.append((code(_invocation(parser, action)), cell(escape(_help(parser, action))),
                     _choices(action), _default(action)))
    return table(("argument", "meaning", "choices", "default"), rows) if rows else ""


def _subcommand_list(command: Command, children: list[Command]) -> str:
    rows = [(f"[{code(child.name)}](#{child.anchor})", cell(escape(child.summary))) for child in children]
    return table(("command", "what it does"), rows)


def command_section(command: Command, children: list[Command]) -> str:
    """The Markdown of one command: heading with its anchor, summary, usage, arguments."""
    level = "#" * min(len(command.words) + 1, 4)
    parts = [f"{level} {command.name} {{#{command.anchor}}}"]
    lead = command.parser.description or command.summary
    if lead:
        parts.append(escape(lead))
    if command.summary and command.parser.description and command.summary != command.parser.description:
        parts.append(f"*{escape(command.summary)}*")
    if command.aliases:
        parts.append("Also spelled: " + ", ".join(code(" ".join((*command.words[:-1], a))) for a in command.aliases))
    parts.append(f"```text\n{usage(command.parser)}\n```")
    for group in command.parser._action_groups:
        body = _group_table(command.parser, group._group_actions, top=len(command.words) == 1)
        if body:
            parts.append(f"**{escape(group.title or 'arguments')}**\n\n{body}")
    if children:
        parts.append(f"**commands**\n\n{_subcommand_list(command, children)}")
    if command.parser.epilog:
        parts.append(escape(command.parser.epilog))
    return "\n\n".join(parts)


def render(parser: argparse.ArgumentParser) -> str:
    """The whole CLI reference of ``parser`` (the ``callbox`` parser)."""
    every = list(commands(parser))
    sections = []
    for command in every:
        children = [c for c in every if len(c.words) == len(command.words) + 1
                    and c.words[: len(command.words)] == command.words]
        sections.append(command_section(command, children))
    return "\n\n".join(sections) + "\n"


def generate() -> str:
    """The CLI reference of the installed ``callbox`` command line."""
    from harness.cli.main import build_parser

    return render(build_parser())
