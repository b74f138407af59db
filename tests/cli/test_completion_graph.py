"""Shell completion and drawn graphs (#34 item 5).

``optbuild completion bash|zsh|fish`` prints a script; sourced in a real bash it completes the
subcommands, each one's flags and the project's targets (``recipe:step`` too, although bash
splits words at colons), asking the hidden ``optbuild __complete`` for them, which loads
nothing heavy; and the actions of ``optbuild cache``, then each action's own flags and targets.
``optbuild graph --format png|svg`` draws with graphviz where its ``dot`` is installed and says
how to install it where it is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = str(Path(sys.executable).parent)  # where the optbuild command is installed


def shell_env() -> dict[str, str]:
    """The environment a shell completes in: the optbuild command on its PATH."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}


def script_for(project, shell: str, tmp_path: Path) -> Path:
    """The completion script for ``shell``, written to a file; the test skips where that
    shell is not installed (it is checked where it is)."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here: its completions are checked where it is")
    script = tmp_path / f"optbuild.{shell}"
    script.write_text(project.cli("completion", shell).stdout)
    return script


def fish_offers(project, script: Path, line: str) -> list[str]:
    """What fish, with ``script`` sourced, offers for ``line`` (the cursor at its end)."""
    done = subprocess.run(["fish", "-c", f"source {script}; complete -C '{line}'"], cwd=project.root,
                          env=shell_env(), capture_output=True, text=True, check=True, timeout=60)
    return sorted(row.split("\t")[0] for row in done.stdout.splitlines())


def complete(project, line: str) -> list[str]:
    """COMPREPLY for ``line`` (the cursor at its end), from the script sourced in bash."""
    script = project.cli("completion", "bash").stdout
    words = line.replace(":", " : ").split() + ([""] if line.endswith(" ") else [])
    shell = (f'source /dev/stdin <<"EOF"\n{script}EOF\n'
             f'COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=({" ".join(map(repr, words))}); '
             f'COMP_CWORD={len(words) - 1}; _optbuild; printf "%s\\n" "${{COMPREPLY[@]}}"')
    done = subprocess.run(["bash", "-c", shell], cwd=project.root, env=shell_env(), capture_output=True,
                          text=True, check=True, timeout=60)
    return sorted(filter(None, done.stdout.splitlines()))


def test_bash_completes_subcommands_flags_and_targets(project):
    assert complete(project, "optbuild gr") == ["graph"]
    assert complete(project, "optbuild build --keep") == ["--keep-going"]
    assert complete(project, "optbuild build c") == ["chain", "chain:mid", "chain:out", "chain:side", "chain:src"]
    assert complete(project, "optbuild plan chain:s") == ["side", "src"]  # bash shows what follows the colon
    assert complete(project, "optbuild kinds jo") == ["join"]
    assert complete(project, "optbuild graph -o c") == []  # a value: bash's file names (-o default)


CACHE_ACTIONS = ["audit", "gc", "ls", "pull", "push", "stats", "verify"]
PUSH_FLAGS = ["--all", "--help", "--no-remote", "--remote", "-h"]


def test_bash_completes_the_actions_of_cache_then_each_ones_flags_and_targets(project):
    assert complete(project, "optbuild cache ") == CACHE_ACTIONS
    assert complete(project, "optbuild cache p") == ["pull", "push"]
    assert complete(project, "optbuild cache push ") == ["chain", "chain:mid", "chain:out", "chain:side",
                                                         "chain:src"]
    assert complete(project, "optbuild cache pull chain:s") == ["side", "src"]
    assert complete(project, "optbuild cache push -") == PUSH_FLAGS  # push's own, not build's
    assert complete(project, "optbuild cache gc --") == ["--grace-minutes", "--help", "--include-locked",
                                                         "--max-size"]
    assert complete(project, "optbuild cache --") == ["--help"]  # before the action: cache's own


def test_zsh_completes_the_actions_of_cache_then_each_ones_flags_and_targets(project, tmp_path):
    script = script_for(project, "zsh", tmp_path)

    def offered(*words: str) -> list[str]:
        """What the script hands compadd (which would narrow it to PREFIX) for these words."""
        stubs = "compdef() { :; }; compadd() { [[ $1 == -- ]] && shift; print -l -- $@; }; _files() { :; }"
        line = " ".join(f"'{word}'" for word in words)
        command = (f"{stubs}; source {script}; words=({line}); CURRENT={len(words)}; PREFIX={words[-1]!r}; "
                   "_optbuild")
        done = subprocess.run(["zsh", "-f", "-c", command], cwd=project.root, env=shell_env(),
                              capture_output=True, text=True, check=True, timeout=60)
        return sorted(done.stdout.split())

    assert offered("optbuild", "cache", "") == CACHE_ACTIONS
    assert offered("optbuild", "cache", "push", "") == ["chain", "chain:mid", "chain:out", "chain:side",
                                                        "chain:src"]
    assert offered("optbuild", "cache", "push", "--") == PUSH_FLAGS


def test_the_hidden_target_lister_imports_nothing_heavy(project):
    code = ("import sys; from optbuild.cli import main; main(['__complete', 'targets']); "
            "print([m for m in ('pydantic', 'torch', 'onnx', 'networkx', 'optbuild.project.recipe') "
            "if m in sys.modules], file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=project.root, capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.split() == ["chain", "chain:src", "chain:mid", "chain:out", "chain:side"]
    assert done.stderr.strip() == "[]"


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_zsh_and_fish_scripts_parse(project, shell, tmp_path):
    subprocess.run([shell, "-n", str(script_for(project, shell, tmp_path))], check=True, timeout=60)


def test_fish_completes_targets_and_flags(project, tmp_path):
    script = script_for(project, "fish", tmp_path)
    assert fish_offers(project, script, "optbuild build chain:s") == ["chain:side", "chain:src"]
    assert fish_offers(project, script, "optbuild build --keep") == ["--keep-going"]


def test_fish_completes_the_actions_of_cache_then_each_ones_flags_and_targets(project, tmp_path):
    script = script_for(project, "fish", tmp_path)
    assert fish_offers(project, script, "optbuild cache ") == CACHE_ACTIONS
    assert fish_offers(project, script, "optbuild cache push ") == ["chain", "chain:mid", "chain:out", "chain:side",
                                                                     "chain:src"]
    assert fish_offers(project, script, "optbuild cache push -") == PUSH_FLAGS


def test_graph_without_graphviz_says_how_to_install_it(project):
    done = subprocess.run([sys.executable, "-m", "optbuild.cli", "graph", "--format", "svg"], cwd=project.root,
                          capture_output=True, text=True, env={**os.environ, "PATH": ""}, timeout=120, check=False)
    assert done.returncode == 2
    assert "graphviz's `dot`, which is not on PATH: install graphviz (apt-get install graphviz" in done.stderr


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed here: the drawing is "
                                                         "checked where it is")
def test_graph_draws_png_and_svg_with_graphviz(project):
    assert project.cli("graph", "--format", "png", "-o", "g.png").returncode == 0
    assert (project.root / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = project.cli("graph", "--format", "svg")
    assert svg.returncode == 0 and "<svg" in svg.stdout and "chain:mid" in svg.stdout
