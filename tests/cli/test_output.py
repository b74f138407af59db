"""What a person reads: progress lines that stay whole under parallel steps, skipped steps
that say why, and `optbuild explain` for unknown, unavailable and partly-set steps."""

from __future__ import annotations

import io
import json
import re
import threading

from plugins.projects import KINDS, UNICORN, ProjectDir

from optbuild.builder.report import PlainReporter

# one progress event, whole: what PlainReporter writes for the steps of these tests
EVENT_LINE = re.compile(r"  (build    \S+  \(never built\)|built    \S+  \d+\.\ds|cached   \S+)"
                        r"|ok: .* in \d+\.\d\ds")




def _project(root, recipe: str) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("needs.py", UNICORN)
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/r.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n' + recipe)
    return proj


# --- 4a: one event per line ---------------------------------------------------------------
def test_parallel_steps_never_share_a_progress_line(tmp_path):
    """Many identical steps: one builds, the others find its result under the key's lock and
    report from their pool threads at once. Unbuffered (as CI often runs Python), every
    write reaches the pipe on its own, so a line written in two parts could be split."""
    recipe = "".join(f'\n[steps.copy{i}]\nkind = "join"\ninput = "src"\n' for i in range(120))
    proj = _project(tmp_path / "proj", recipe)
    proc = proj.popen("build", "-j", "8", env={"PYTHONUNBUFFERED": "1"})
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    lines = stderr.splitlines()
    assert [line for line in lines if not EVENT_LINE.fullmatch(line)] == []
    assert len(lines) == 2 + 2 + 120  # src and one copy build, 119 copies are cached, the summary


def test_events_from_many_threads_are_whole_lines(tmp_path):
    """The executor emits from pool threads. The stream is opened the way Python opens stderr
    under PYTHONUNBUFFERED: each write goes straight to the file."""
    path = tmp_path / "events.txt"
    with io.TextIOWrapper(io.FileIO(path, "w"), write_through=True) as stream:
        reporter = PlainReporter(stream)

        def emit(thread: int) -> None:
            for i in range(300):
                reporter.emit({"event": "step", "step": f"r:s{thread}_{i}", "status": "cached", "key": None,
                               "reasons": []})

        threads = [threading.Thread(target=emit, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 8 * 300
    assert [line for line in lines if not re.fullmatch(r"  cached   r:s\d+_\d+", line)] == []


# --- 4b: skipped says why -----------------------------------------------------------------
def test_skipped_steps_name_the_step_that_stopped_the_build(tmp_path):
    """bad fails while slow sleeps; when slow is done the build has stopped, so its child
    never starts. bad's own dependents (and theirs) name bad as the reason."""
    proj = _project(tmp_path / "proj", """
[steps.bad]
kind = "join"
input = "src"
fail = true

[steps.after_bad]
kind = "join"
input = "bad"

[steps.after_after_bad]
kind = "join"
input = "after_bad"

[steps.slow]
kind = "join"
input = "src"
sleep = 1.5

[steps.after_slow]
kind = "join"
input = "slow"
""")
    run = proj.cli("build", "-j", "2")
    assert run.returncode == 1
    assert "  skipped  r:after_slow  (build stopped after r:bad failed)\n" in run.stderr
    assert "  skipped  r:after_bad  (upstream r:bad failed)\n" in run.stderr
    assert "  skipped  r:after_after_bad  (upstream r:bad failed)\n" in run.stderr


def test_an_unavailable_step_that_stops_the_build_is_named(tmp_path):
    proj = _project(tmp_path / "proj", '\n[steps.horn]\nkind = "needs"\ninput = "src"\n'
                                       '\n[steps.other]\nkind = "join"\ninput = "src"\n'
                                       '\n[steps.after_horn]\nkind = "join"\ninput = "horn"\n')
    run = proj.cli("build", "-j", "1")
    assert run.returncode == 1
    assert "  skipped  r:other  (build stopped after r:horn was unavailable)\n" in run.stderr
    assert "  skipped  r:after_horn  (upstream r:horn unavailable)\n" in run.stderr
    events = {e["step"]: e for e in proj.cli("build", "-j", "1", "--json").events if e.get("event") == "step"}
    assert events["r:other"]["reasons"] == ["build stopped after r:horn was unavailable"]


# --- 4d: explain --------------------------------------------------------------------------
def test_explain_an_unknown_step_suggests_one_and_lists_the_recipe(project):
    run = project.cli("explain", "chain:outt")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "error: unknown step 'chain:outt'; did you mean 'chain:out'?" in run.stderr
    assert "error: steps of chain: src, mid, out, side" in run.stderr


def test_explain_a_recipe_lists_its_steps(project):
    run = project.cli("explain", "chain")
    assert run.returncode == 2
    assert "error: chain is a recipe: name one of its steps: src, mid, out, side" in run.stderr


def test_explain_an_unknown_recipe_lists_every_recipe(project):
    run = project.cli("explain", "chian:out")
    assert run.returncode == 2
    assert "did you mean 'chain:out'?" in run.stderr and "steps of chain: src, mid, out, side" in run.stderr


def test_explain_an_unavailable_step_says_what_it_needs(tmp_path):
    proj = _project(tmp_path / "proj", '\n[steps.horn]\nkind = "needs"\ninput = "src"\n')
    proj.build(skip_unavailable=True)
    run = proj.cli("explain", "r:horn")
    assert run.returncode == 0, run.stderr
    assert "status: unavailable" in run.stdout
    assert "cannot run here: needs a unicorn (none here)" in run.stdout
    info = json.loads(proj.cli("explain", "r:horn", "--json").stdout)
    assert info["unavailable"] == "needs a unicorn (none here)"


def test_explain_hides_unset_parameters(project):
    project.build()
    text = project.cli("explain", "chain:mid").stdout
    params = text.split("  params:\n", 1)[1].split("  files:", 1)[0]
    assert 'suffix = "-mid"' in params and "fail = false" in params  # set, or a meaningful default
    assert "other" not in params and "null" not in params  # unset; the input is under inputs
    assert "input = {" in text.split("  inputs:", 1)[1]
    info = json.loads(project.cli("explain", "chain:mid", "--json").stdout)
    assert info["ingredients"]["params"]["other"] is None  # the JSON keeps every ingredient

