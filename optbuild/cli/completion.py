"""optbuild completion bash|zsh|fish: a shell completion script for optbuild.

The script holds the subcommands and each one's flags, read from the argparse parser when it
is printed; targets and step kinds change with the project, so it asks ``optbuild __complete
targets|kinds`` for them at each completion. That hidden command (``words``) reads the
recipes' TOML and nothing else: no recipe validates and no step module is imported, so a
TAB answers at once.
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
def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], str]]:
    """Each subcommand's flags and what its positionals take ("targets", "kinds" or ""); the
    key "" holds optbuild's own flags. A flag that takes a value ends with "="."""
    commands = {"": (_flags(parser), "")}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        flags = _flags(command)
        metavars = {a.metavar for a in command._actions if not a.option_strings}
        commands[name] = (flags, "targets" if "TARGET" in metavars else "kinds" if "KIND" in metavars else "")
    return commands


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [option + ("=" if action.nargs != 0 else "") for action in parser._actions
            for option in action.option_strings]


def _valued(commands: dict[str, tuple[list[str], str]]) -> list[str]:
    return [flag[:-1] for flags, _ in commands.values() for flag in flags if flag.endswith("=")]


def _bare(flags: list[str]) -> str:
    return " ".join(flag.removesuffix("=") for flag in flags)


def _first_words(commands: dict[str, tuple[list[str], str]]) -> str:
    """What may follow ``optbuild``: the subcommands and optbuild's own flags."""
    return " ".join([*(name for name in commands if name), _bare(commands[""][0])])


def _taking(commands: dict[str, tuple[list[str], str]], what: str) -> list[str]:
    return [name for name, (_, takes) in commands.items() if takes == what]


def _bash(commands: dict[str, tuple[list[str], str]]) -> str:
    flags = "\n".join(f'        {name}) words="{_bare(f)}" ;;' for name, (f, _) in commands.items() if name)
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
    case ${{COMP_WORDS[COMP_CWORD-1]}} in  # an option's value: bash's own (file names)
    {valued}) return ;;
    esac
    if [[ $cur == -* ]]; then
        case $cmd in
{flags}
        esac
    else
        case $cmd in
        {"|".join(_taking(commands, "targets"))}) words=$(optbuild {HIDDEN} targets 2>/dev/null) ;;
        {"|".join(_taking(commands, "kinds"))}) words=$(optbuild {HIDDEN} kinds 2>/dev/null) ;;
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


def _zsh(commands: dict[str, tuple[list[str], str]]) -> str:
    flags = "\n".join(f"        {name}) compadd -- {_bare(f)} ;;" for name, (f, _) in commands.items() if name)
    return f'''#compdef optbuild
# optbuild completion for zsh: optbuild completion zsh > "${{fpath[1]}}/_optbuild"
_optbuild() {{
    local cmd=${{words[2]}}
    if (( CURRENT == 2 )); then
        compadd -- {_first_words(commands)}
        return
    fi
    if [[ $PREFIX == -* ]]; then
        case $cmd in
{flags}
        esac
        return
    fi
    case $cmd in
    {"|".join(_taking(commands, "targets"))}) compadd -- ${{(f)"$(optbuild {HIDDEN} targets 2>/dev/null)"}} ;;
    {"|".join(_taking(commands, "kinds"))}) compadd -- ${{(f)"$(optbuild {HIDDEN} kinds 2>/dev/null)"}} ;;
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


def _fish(commands: dict[str, tuple[list[str], str]]) -> str:
    lines = ["# optbuild completion for fish: optbuild completion fish > ~/.config/fish/completions/optbuild.fish",
             "complete -c optbuild -f",
             f"complete -c optbuild -n __fish_use_subcommand -a '{' '.join(n for n in commands if n)}'"]
    lines += [f"complete -c optbuild -n __fish_use_subcommand {_fish_flag(f)}" for f in commands[""][0]]
    for name, (flags, _) in commands.items():
        lines += [f"complete -c optbuild -n '__fish_seen_subcommand_from {name}' {_fish_flag(f)}"
                  for f in flags if name]
    for what in ("targets", "kinds"):
        lines.append(f"complete -c optbuild -n '__fish_seen_subcommand_from {' '.join(_taking(commands, what))}' "
                     f"-a '(optbuild {HIDDEN} {what} 2>/dev/null)'")
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
