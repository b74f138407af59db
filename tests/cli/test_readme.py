"""The README's command synopsis names every subcommand and flag that exists, so a user
reading it learns the whole command line (and a new flag without docs fails here)."""

from __future__ import annotations

import argparse
import re

from plugins.projects import REPO

from optbuild.cli import _parser


def _synopsis() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Command line", 1)[1]
    return re.search(r"```text\n(.*?)```", section, re.DOTALL).group(1)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, the spellings of each of its options) for every (sub)command."""
    options = [action.option_strings for action in parser._actions
               if action.option_strings and not {"--help", "--version"} & set(action.option_strings)]
    yield path, options
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def _written(spelling: str, synopsis: str) -> bool:
    """`-j`, `--json`, or `--no-remote` written as `--[no-]remote`."""
    forms = {spelling, spelling.replace("--no-", "--[no-]"), spelling.replace("--", "--[no-]", 1)}
    return any(re.search(rf"(?<![\w-]){re.escape(form)}(?![\w-])", synopsis) for form in forms)


def _blocks(synopsis: str) -> dict[str, str]:
    """Subcommand -> its lines: the one starting `optbuild NAME` and the indented ones after."""
    blocks: dict[str, str] = {}
    name = None
    for line in synopsis.splitlines():
        if line.startswith("optbuild "):
            name = line.split()[1]
            name = "" if name.startswith("[") else name  # `optbuild [-C DIR] COMMAND`: global flags
        if name is not None and line.startswith(("optbuild ", " ")):
            blocks[name] = blocks.get(name, "") + line + "\n"
    return blocks


def test_the_synopsis_lists_every_subcommand_and_flag():
    blocks = _blocks(_synopsis())
    missing = []
    for path, options in _commands(_parser()):
        top = path[0] if path else ""
        assert top in blocks, f"`optbuild {top}` missing from the README synopsis"
        if len(path) > 1:
            assert re.search(rf"\b{re.escape(path[1])}\b", blocks[top]), f"`optbuild {' '.join(path)}` missing"
        missing += [f"optbuild {' '.join(path)} {spellings[-1]}" for spellings in options
                    if not any(_written(s, blocks[top]) for s in spellings)]
    assert not missing, f"missing from the README synopsis: {missing}"
