"""What a person reads: progress lines that stay whole under parallel steps, skipped steps
that say why, and `optbuild explain` for unknown, unavailable and partly-set steps."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

from plugins.projects import KINDS, UNICORN, ProjectDir

from optbuild.builder.report import PlainReporter

# one progress event, whole: what PlainReporter writes for the steps of these tests
EVENT_LINE = re.compile(r"  (build    \S+  \(never built\)|built    \S+  \d+\.\ds|cached   \S+)"
                        r"|ok: .* in \d+\.\d\ds")
HEARTBEAT = re.compile(r"  \[\d+/\d+\] running: .*")  # a slow host's build may take long enough for one




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
    lines = [line for line in stderr.splitlines() if not HEARTBEAT.fullmatch(line)]
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
    assert "\n3 steps skipped:\n" in run.stderr
    assert "\n  build stopped after r:bad failed: r:after_slow\n" in run.stderr
    assert "\n  upstream r:bad failed: r:after_bad, r:after_after_bad\n" in run.stderr


def test_an_unavailable_step_that_stops_the_build_is_named(tmp_path):
    proj = _project(tmp_path / "proj", '\n[steps.horn]\nkind = "needs"\ninput = "src"\n'
                                       '\n[steps.other]\nkind = "join"\ninput = "src"\n'
                                       '\n[steps.after_horn]\nkind = "join"\ninput = "horn"\n')
    run = proj.cli("build", "-j", "1")
    assert run.returncode == 1
    assert "\n  build stopped after r:horn was unavailable: r:other\n" in run.stderr
    assert "\n  upstream r:horn unavailable: r:after_horn\n" in run.stderr
    events = {e["step"]: e for e in proj.cli("build", "-j", "1", "--json").events if e.get("event") == "step"}
    assert events["r:other"]["reasons"] == ["build stopped after r:horn was unavailable"]


# --- the reasons, grouped ------------------------------------------------------------------
def test_a_reason_shared_by_several_unavailable_steps_is_printed_once(tmp_path):
    """Three steps need the same thing, and each has a step after it: the plain output names
    each step on a short line, then prints the need once with the three steps, and the
    skipped ones under the step that held each back; the JSON events keep every reason."""
    recipe = "".join(f'\n[steps.horn{i}]\nkind = "needs"\ninput = "src"\n'
                     f'\n[steps.after{i}]\nkind = "join"\ninput = "horn{i}"\n' for i in range(3))
    proj = _project(tmp_path / "proj", recipe)
    run = proj.cli("build", "--skip-unavailable", "-j", "1")
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("needs a unicorn (none here)") == 1
    assert ("3 steps cannot run here:\n  needs a unicorn (none here)\n    3 steps: r:horn0, r:horn1, r:horn2\n"
            "3 steps skipped:\n  upstream r:horn0 unavailable: r:after0\n  upstream r:horn1 unavailable: r:after1\n"
            "  upstream r:horn2 unavailable: r:after2\nok: ") in run.stderr
    assert "  unavailable r:horn1\n" in run.stderr and "  skipped  r:after1\n" in run.stderr
    events = {e["step"]: e for e in proj.cli("build", "--skip-unavailable", "--json").events if e.get("event") == "step"}
    assert {sid: events[sid]["error"] for sid in ("r:horn0", "r:horn1", "r:horn2")} == {
        f"r:horn{i}": f"r:horn{i} cannot run here: needs a unicorn (none here)" for i in range(3)}
    assert [events[f"r:after{i}"]["reasons"] for i in range(3)] == [[f"upstream r:horn{i} unavailable"] for i in range(3)]


def test_a_failed_step_keeps_its_error_on_its_own_line(tmp_path):
    """A failure is the step's own, not a reason several steps share: it stays inline."""
    proj = _project(tmp_path / "proj", '\n[steps.bad]\nkind = "join"\ninput = "src"\nfail = true\n'
                                       '\n[steps.after_bad]\nkind = "join"\ninput = "bad"\n')
    run = proj.cli("build")
    assert run.returncode == 1
    assert "  failed   r:bad\n      asked to fail" in run.stderr
    assert "\n1 step skipped:\n  upstream r:bad failed: r:after_bad\nFAILED: " in run.stderr


# --- progress ----------------------------------------------------------------------------
PROGRESS = '''
import time

from optbuild.steps.base import Step, StepParams, StepRef


class PartsParams(StepParams):
    input: StepRef


class Parts(Step):
    """Works through two parts, saying which."""

    Params = PartsParams
    primary_output = "data.txt"

    def run(self, ctx):
        for part in (1, 2):
            ctx.progress(f"part {part} of 2")
            time.sleep(0.5)
        (ctx.out_dir / "data.txt").write_text("done")
'''


def test_a_running_step_says_what_it_is_doing(tmp_path):
    """What a step tells ``ctx.progress`` in its own process reaches the build's events
    while it runs, in order, each message once."""
    proj = _project(tmp_path / "proj", '\n[steps.parts]\nkind = "parts"\ninput = "src"\n')
    proj.write("parts.py", PROGRESS)
    proj.write("optbuild.toml", KINDS + 'parts = "parts.py:Parts"\n')
    run = proj.cli("build", "--json")
    assert run.returncode == 0, run.stderr
    said = [(e["step"], e["message"]) for e in run.events if e.get("event") == "progress"]
    assert said == [("r:parts", "part 1 of 2"), ("r:parts", "part 2 of 2")]
    kinds = [e["event"] if e["event"] != "step" else e["status"] for e in run.events if e.get("step") == "r:parts"]
    assert kinds == ["running", "progress", "progress", "built"]


def _on_a_terminal(proj: ProjectDir, *args: str) -> str:
    """What ``optbuild ARGS`` writes to a terminal (a pty, 100 columns), its escape codes
    taken out, each redraw of the live status on a line of its own."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "optbuild.cli", *args], cwd=proj.root, stdin=side, stdout=side,
                            stderr=side, env={**os.environ, "TERM": "xterm", "OPTBUILD_SERVER": "0"})
    os.close(side)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the process is gone
        while chunk := os.read(main, 65536):
            chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=120) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode(errors="replace"))  # colours
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text)  # cursor moves and erasures
    return "\n".join(line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip())


def test_on_a_terminal_a_live_status_counts_the_steps_and_their_seconds(tmp_path):
    """Below the lines, a region redrawn several times a second: [done/total], how many run,
    and each running step with its seconds so far and what it says it is doing."""
    proj = _project(tmp_path / "proj", '\n[steps.parts]\nkind = "parts"\ninput = "src"\n'
                                       '\n[steps.slow]\nkind = "join"\ninput = "src"\nsleep = 2.5\n')
    proj.write("parts.py", PROGRESS)
    proj.write("optbuild.toml", KINDS + 'parts = "parts.py:Parts"\n')
    screen = _on_a_terminal(proj, "build", "-j", "2")
    lines = screen.splitlines()
    assert "[1/3] 2 running" in screen
    assert any(re.fullmatch(r"r:slow\s+[12]s", line) for line in lines), screen
    assert any(re.fullmatch(r"r:parts\s+\ds\s+part [12] of 2", line) for line in lines), screen
    assert lines[-1].startswith("ok: 3 built in ")


def test_plain_output_says_what_runs_while_steps_build(tmp_path):
    """Not on a terminal, a line now and then (here every 0.1 s) gives [done/total] and each
    running step with its seconds and what it last said; once the build ends, no more."""
    stream = io.StringIO()
    reporter = PlainReporter(stream, heartbeat_s=0.1)
    reporter.emit({"event": "start", "steps": ["r:src", "r:a", "r:b"], "jobs": 2, "dry_run": False})
    reporter.emit({"event": "step", "step": "r:src", "status": "cached", "key": None, "reasons": []})
    for sid in ("r:a", "r:b"):
        reporter.emit({"event": "step", "step": sid, "status": "running", "key": None, "reasons": ["never built"]})
    reporter.emit({"event": "progress", "step": "r:b", "message": "round 3 of 5"})
    time.sleep(0.35)
    reporter.emit({"event": "done", "ok": True, "counts": {"cached": 1}, "duration_s": 0.4, "bytes_hashed": 0})
    written = stream.getvalue()
    time.sleep(0.3)
    assert stream.getvalue() == written
    beats = [line for line in written.splitlines() if line.startswith("  [")]
    assert beats and all(re.fullmatch(r"  \[1/3\] running: r:a 0s; r:b 0s \(round 3 of 5\)", b) for b in beats)
    assert written.splitlines()[-1] == "ok: 1 cached in 0.40s"


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


def test_explain_a_skipped_step_gives_the_full_reason_of_the_step_behind_it(tmp_path):
    """The build output names only the upstream step beside a skipped one; explain follows
    the skipped steps between to the one that cannot run, and gives its whole reason."""
    proj = _project(tmp_path / "proj", '\n[steps.horn]\nkind = "needs"\ninput = "src"\n'
                                       '\n[steps.after]\nkind = "join"\ninput = "horn"\n'
                                       '\n[steps.last]\nkind = "join"\ninput = "after"\n')
    run = proj.cli("explain", "r:last")
    assert run.returncode == 0, run.stderr
    assert "status: skipped  (upstream r:horn unavailable)\n        r:horn cannot run here: needs a unicorn (none here)\n" in run.stdout
    info = json.loads(proj.cli("explain", "r:last", "--json").stdout)
    assert info["cause"] == {"step": "r:horn", "status": "unavailable",
                             "error": "r:horn cannot run here: needs a unicorn (none here)"}
    assert "cause" not in json.loads(proj.cli("explain", "r:src", "--json").stdout)


def test_explain_hides_unset_parameters(project):
    project.build()
    text = project.cli("explain", "chain:mid").stdout
    params = text.split("  params:\n", 1)[1].split("  files:", 1)[0]
    assert 'suffix = "-mid"' in params and "fail = false" in params  # set, or a meaningful default
    assert "other" not in params and "null" not in params  # unset; the input is under inputs
    assert "input = {" in text.split("  inputs:", 1)[1]
    info = json.loads(project.cli("explain", "chain:mid", "--json").stdout)
    assert info["ingredients"]["params"]["other"] is None  # the JSON keeps every ingredient

