"""optbuild completion bash|zsh|fish: a shell completion script for optbuild.

The script holds the subcommands and each one's flags, read from the argparse parser when it
is printed, and the actions of a subcommand that has its own (``optbuild cache push``: their
names, then each action's flags and targets); targets and step kinds change with the
project, so it asks ``optbuild __complete targets|kinds`` for them at each completion. That
hidden command (``words``) reads the recipes' TOML and nothing else: no recipe validates and
no step module is imported, so a TAB answers at once.
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path

SHELLS = ("bash", "zsh", "fish")
HIDDEN = "__complete"  # optbuild __complete targets|kinds: one word a line


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS,
                        help="print the script; e.g. optbuild completion bash > "
                             "~/.local/share/bash-completion/completions/optbuild")


def run(args: argparse.Namespace) -> int:
    from optbuild.cli import _parser

    print(SCRIPTS[args.shell](_commands(_parser())), end="")
    return 0


# --- what the script offers --------------------------------------------------------------
Commands = dict[str, tuple[list[str], str]]


def _commands(parser: argparse.ArgumentParser) -> Commands:
    """Each subcommand's flags and what its positionals take ("targets", "kinds" or ""); the
    key "" holds optbuild's own flags, and a key of two words ("cache push") an action's of a
    subcommand that has actions of its own (one level). A flag that takes a value ends with "="."""
    commands = {"": (_flags(parser), "")}
    for name, command in _subparsers(parser).items():
        commands[name] = (_flags(command), _takes(command))
        for action, nested in _subparsers(command).items():
            commands[f"{name} {action}"] = (_flags(nested), _takes(nested))
    return commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _takes(parser: argparse.ArgumentParser) -> str:
    metavars = {a.metavar for a in parser._actions if not a.option_strings}
    return "targets" if "TARGET" in metavars else "kinds" if "KIND" in metavars else ""


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [option + ("=" if action.nargs != 0 else "") for action in parser._actions
            for option in action.option_strings]


def _valued(commands: Commands) -> list[str]:
    return [flag[:-1] for flags, _ in commands.values() for flag in flags if flag.endswith("=")]


def _bare(flags: list[str]) -> str:
    return " ".join(flag.removesuffix("=") for flag in flags)


def _top(commands: Commands) -> list[str]:
    return [name for name in commands if name and " " not in name]


def _first_words(commands: Commands) -> str:
    """What may follow ``optbuild``: the subcommands and optbuild's own flags."""
    return " ".join([*_top(commands), _bare(commands[""][0])])


def _actions(commands: Commands, name: str) -> str:
    """The actions of subcommand ``name``, a space between ("ls verify ..." for cache); "" for most."""
    return " ".join(key.split(" ")[1] for key in commands if key.startswith(f"{name} "))


def _nesting(commands: Commands) -> list[str]:
    """The subcommands that have actions of their own."""
    return [name for name in _top(commands) if _actions(commands, name)]


def _taking(commands: Commands, what: str) -> list[str]:
    return [name for name, (_, takes) in commands.items() if takes == what]


def _case(names: list[str]) -> str:
    """A case pattern (bash, zsh) for these commands: "cache push" quoted."""
    return "|".join(f'"{name}"' if " " in name else name for name in names)


def _bash(commands: Commands) -> str:
    flags = "\n".join(f'        {_case([name])}) words="{_bare(f)}" ;;'
                      for name, (f, _) in commands.items() if name)
    nesting = _nesting(commands)
    actions = "\n".join(f'        {name}) words="{_actions(commands, name)}" ;;' for name in nesting)
    nested = "\n".join(f'    {name}) (( COMP_CWORD > 2 )) && cmd+=" ${{COMP_WORDS[2]}}" ;;'
                       for name in nesting)
    valued = "|".join(sorted(set(_valued(commands))))
    return f'''# optbuild completion for bash: optbuild completion bash > ~/.local/share/bash-completion/completions/optbuild
_optbuild() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} cmd=${{COMP_WORDS[1]}} words=""
    if [[ -n ${{COMP_LINE-}} ]]; then  # the whole word: bash splits recipe:step at the colon
        cur=${{COMP_LINE:0:COMP_POINT}}
        cur=${{cur##*[[:space:]]}}
    fi
    if (( COMP_CWORD == 1 )); then
        COMPREPLY=($(compgen -W "{_first_words(commands)}" -- "$cur"))
        return
    fi
    case $cmd in  # past a subcommand's action, the command is both words: "cache push"
{nested}
    esac
    case ${{COMP_WORDS[COMP_CWORD-1]}} in  # an option's value: bash's own (file names)
    {valued}) return ;;
    esac
    if [[ $cur == -* ]]; then
        case $cmd in
{flags}
        esac
    else
        case $cmd in
        {_case(_taking(commands, "targets"))}) words=$(optbuild {HIDDEN} targets 2>/dev/null) ;;
        {_case(_taking(commands, "kinds"))}) words=$(optbuild {HIDDEN} kinds 2>/dev/null) ;;
{actions}
        esac
    fi
    local IFS=$'\\n'
    COMPREPLY=($(compgen -W "${{words// /$'\\n'}}" -- "$cur"))
    if [[ $cur == *:* ]]; then  # bash shows what follows the last colon
        local before=${{cur%"${{cur##*:}}"}}
        COMPREPLY=("${{COMPREPLY[@]#"$before"}}")
    fi
}}
complete -o default -F _optbuild optbuild
'''


def _zsh(commands: Commands) -> str:
    flags = "\n".join(f"        {_case([name])}) compadd -- {_bare(f)} ;;"
                      for name, (f, _) in commands.items() if name)
    nesting = _nesting(commands)
    actions = "\n".join(f"    {name}) compadd -- {_actions(commands, name)} ;;" for name in nesting)
    nested = "\n".join(f'    {name}) (( CURRENT > 3 )) && cmd+=" ${{words[3]}}" ;;' for name in nesting)
    return f'''#compdef optbuild
# optbuild completion for zsh: optbuild completion zsh > "${{fpath[1]}}/_optbuild"
_optbuild() {{
    local cmd=${{words[2]}}
    if (( CURRENT == 2 )); then
        compadd -- {_first_words(commands)}
        return
    fi
    case $cmd in  # past a subcommand's action, the command is both words: "cache push"
{nested}
    esac
    if [[ $PREFIX == -* ]]; then
        case $cmd in
{flags}
        esac
        return
    fi
    case $cmd in
    {_case(_taking(commands, "targets"))}) compadd -- ${{(f)"$(optbuild {HIDDEN} targets 2>/dev/null)"}} ;;
    {_case(_taking(commands, "kinds"))}) compadd -- ${{(f)"$(optbuild {HIDDEN} kinds 2>/dev/null)"}} ;;
{actions}
    *) _files ;;
    esac
}}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _optbuild "$@"
else
    compdef _optbuild optbuild
fi
'''


def _fish_flag(flag: str) -> str:
    """A flag that takes a value takes a file name (-F), as in bash."""
    name = flag.removesuffix("=")
    spelled = f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}"
    return f"{spelled} -F" if flag.endswith("=") else spelled


def _fish_when(commands: Commands, name: str) -> str:
    """The condition (-n) for what command ``name`` offers: a subcommand with actions, only
    before its action; "cache push", once both words are there."""
    command, _, action = name.partition(" ")
    seen = f"__fish_seen_subcommand_from {command}"
    if action:
        return f"'{seen}; and __fish_seen_subcommand_from {action}'"
    if actions := _actions(commands, command):
        return f"'{seen}; and not __fish_seen_subcommand_from {actions}'"
    return f"'{seen}'"


def _fish(commands: Commands) -> str:
    lines = ["# optbuild completion for fish: optbuild completion fish > ~/.config/fish/completions/optbuild.fish",
             "complete -c optbuild -f",
             f"complete -c optbuild -n __fish_use_subcommand -a '{' '.join(_top(commands))}'"]
    lines += [f"complete -c optbuild -n __fish_use_subcommand {_fish_flag(f)}" for f in commands[""][0]]
    for name, (flags, _) in commands.items():
        lines += [f"complete -c optbuild -n {_fish_when(commands, name)} {_fish_flag(f)}"
                  for f in flags if name]
    lines += [f"complete -c optbuild -n {_fish_when(commands, name)} -a '{_actions(commands, name)}'"
              for name in _nesting(commands)]
    for what in ("targets", "kinds"):
        asks = f"-a '(optbuild {HIDDEN} {what} 2>/dev/null)'"
        top = " ".join(name for name in _taking(commands, what) if " " not in name)
        lines.append(f"complete -c optbuild -n '__fish_seen_subcommand_from {top}' {asks}")
        lines += [f"complete -c optbuild -n {_fish_when(commands, name)} {asks}"
                  for name in _taking(commands, what) if " " in name]
    return "\n".join(lines) + "\n"


SCRIPTS = {"bash": _bash, "zsh": _zsh, "fish": _fish}


# --- optbuild __complete targets|kinds ----------------------------------------------------
def words(arguments: list[str]) -> int:
    """Print the recipes and recipe:step targets of the project here, or the step kinds; a
    broken or missing project prints nothing (a TAB must never show an error)."""
    what = arguments[0] if arguments else ""
    try:
        found = _targets() if what == "targets" else _kinds() if what == "kinds" else []
    except (OSError, ValueError, RecursionError):  # tomlfile.TomlError is a ValueError
        found = []
    print("\n".join(found))
    return 0


def _config() -> tuple[str, dict]:
    """The project's root and its optbuild.toml as read, or ("", {}) outside a project;
    ValueError when it cannot be read (``words`` then prints nothing)."""
    from optbuild.common.projectroot import project_root
    from optbuild.common.tomlfile import config_tables

    root = project_root()
    if root is None:
        return "", {}
    tables = config_tables(root)
    if tables is None:
        raise ValueError(f"{root}/optbuild.toml cannot be read")
    return root, tables


def _targets() -> list[str]:
    from optbuild.common.tomlfile import load

    root, config = _config()
    if not root:
        return []
    patterns = config.get("project", {}).get("recipes", ["recipes/*.toml"])
    found = []
    for path in sorted({p for pattern in patterns for p in glob.glob(os.path.join(root, pattern))}):
        recipe = os.path.splitext(os.path.basename(path))[0]
        steps = load(Path(path)).get("steps", {})
        found += [recipe, *(f"{recipe}:{step}" for step in steps)]
    return found


def _kinds() -> list[str]:
    from optbuild.app.kinds import known_kinds

    return known_kinds(_config()[1].get("kinds", {}))
