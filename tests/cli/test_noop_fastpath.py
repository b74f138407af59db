"""The no-op fast path of `optbuild build` (optbuild.cli.noop): when nothing changed since the
last ok build, the build settles from its stamp without loading the project; any change
takes the normal path and gets the normal path's answer.

Each build runs in its own interpreter, as a user's would (the fast path is about what a
fresh process imports), with OPTBUILD_DEBUG_FASTPATH=1 so that stderr says whether the
fast path was taken and why not. The racy margin is 0 unless a test says otherwise, so
that a build started right after another may vouch for its files.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

import blake3
import pytest
from plugins.fastpath import Run, optbuild, user_cache
from plugins.projects import CONFIG, KINDS, PIPELINE, UNICORN, ProjectDir

from optbuild.common.noopstamp import HASH_MAX
from optbuild.common.signatures import file_system_clock, signature
from optbuild.common.sigtable import SigTable

HEAVY = ("pydantic", "rich", "pynvml", "networkx", "torch", "onnx", "onnxruntime", "blake3", "tomllib")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `chain` project (src -> mid -> out, src -> side), built once."""
    proj = ProjectDir.with_test_kinds(tmp_path_factory.mktemp("noop") / "proj")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", PIPELINE)
    first = optbuild(proj, "build")
    assert first.returncode == 0, first.stderr
    return proj.root


@pytest.fixture
def built(template: Path, tmp_path: Path) -> ProjectDir:
    """A copy of the built template whose last build (a normal no-op) left a usable stamp."""
    proj = ProjectDir(tmp_path / "proj")
    shutil.copytree(template, proj.root, symlinks=True)
    shutil.rmtree(proj.root / "build" / ".optbuild")
    normal = optbuild(proj, "build")
    assert normal.returncode == 0 and not normal.fast, normal.stderr
    assert "4 cached" in normal.stderr and "unusable" not in normal.stderr, normal.stderr
    return proj


def stamp(proj: ProjectDir) -> Path:
    return proj.root / "build" / ".optbuild" / "noop.json"


def step_lines(run: Run) -> list[str]:
    return sorted(line for line in run.stderr.splitlines() if line.startswith("  "))


def test_a_noop_build_settles_from_the_stamp_without_loading_the_project(built):
    normal = optbuild(built, "build", racy_ns=0)  # records again: its answer is the reference
    fast = optbuild(built, "build")
    assert fast.returncode == 0 and fast.fast, fast.stderr
    assert "ok: 4 cached in" in fast.stderr and "nothing changed since the last build: fast path" in fast.stderr
    assert step_lines(fast) == step_lines(normal) == [f"  cached   chain:{s}" for s in ("mid", "out", "side", "src")]
    loaded = {m.partition(".")[0] for m in fast.modules}
    assert not loaded & set(HEAVY)
    assert not {"optbuild.project.recipe", "optbuild.api", "optbuild.steps", "argparse", "inspect"} & set(fast.modules)
    stats = [json.loads(line) for line in (built.root / "cache" / "stats.jsonl").read_text().splitlines()]
    assert stats[-1]["fast_path"] and stats[-1]["counts"] == {"cached": 4} and stats[-1]["local"]["hits"] == 4


def test_the_fast_path_replays_the_reasons_grouped_as_the_build_printed_them(tmp_path):
    """An ok build with unavailable steps (--skip-unavailable): the fast path prints the same
    lines, the reasons grouped once below the steps, as the build it replays."""
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("needs.py", UNICORN)
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/r.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
               + "".join(f'[steps.horn{i}]\nkind = "needs"\ninput = "src"\n' for i in range(2))
               + '[steps.after]\nkind = "join"\ninput = "horn0"\n')
    assert optbuild(proj, "build", "--skip-unavailable").returncode == 0
    stamp(proj).unlink()
    normal = optbuild(proj, "build", "--skip-unavailable")  # all cached: the answer to replay
    fast = optbuild(proj, "build", "--skip-unavailable")
    assert fast.fast and not normal.fast, fast.stderr
    grouped = ("2 steps cannot run here:\n  needs a unicorn (none here)\n    2 steps: r:horn0, r:horn1\n"
               "1 step skipped:\n  upstream r:horn0 unavailable: r:after\nok: ")
    assert grouped in normal.stderr and grouped in fast.stderr
    assert step_lines(fast) == step_lines(normal)


def test_a_noop_plan_answers_from_the_build_stamp_on_stdout_and_keeps_no_statistics(built):
    """`plan` after a no-op build with the same arguments: every step cached, said as a
    normal plan says it (on stdout), without loading the project; an edit takes the normal
    path."""
    stats = built.root / "cache" / "stats.jsonl"
    normal = optbuild(built, "plan", env={"OPTBUILD_UNRELATED": "1"})  # another environment: declined
    kept = stats.read_text()
    fast = optbuild(built, "plan")
    assert fast.returncode == 0 and fast.fast and not normal.fast, fast.stderr
    lines = sorted(line for line in fast.stdout.splitlines() if line.startswith("  "))
    assert lines == sorted(line for line in normal.stdout.splitlines() if line.startswith("  "))
    assert lines == [f"  cached   chain:{s}" for s in ("mid", "out", "side", "src")]
    assert "ok: 4 cached in" in fast.stdout and "fast path" in fast.stdout
    assert not {m.partition(".")[0] for m in fast.modules} & set(HEAVY)
    assert stats.read_text() == kept  # a plan keeps no statistics, fast or not
    built.write("data/input.txt", "edited")
    edited = optbuild(built, "plan")
    assert not edited.fast and "would-build" in edited.stdout, edited.stdout + edited.stderr


def test_a_plan_after_a_build_with_unavailable_steps_answers_as_a_normal_plan_does(tmp_path):
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("needs.py", UNICORN)
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/r.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
               '[steps.horn]\nkind = "needs"\ninput = "src"\n[steps.after]\nkind = "join"\ninput = "horn"\n')
    assert optbuild(proj, "build", "--skip-unavailable").returncode == 0
    assert optbuild(proj, "build", "--skip-unavailable").returncode == 0  # a usable stamp
    normal = optbuild(proj, "plan", "--skip-unavailable", env={"OPTBUILD_UNRELATED": "1"})
    fast = optbuild(proj, "plan", "--skip-unavailable")
    assert fast.fast and not normal.fast, fast.stderr
    answer = [line for line in normal.stdout.splitlines()[:-1] if not line.startswith("ok: ")]
    assert [line for line in fast.stdout.splitlines()[:-1] if not line.startswith("ok: ")] == answer
    assert "  unavailable r:horn" in answer and "1 step skipped:" in answer, normal.stdout


def test_the_fast_path_is_taken_again_and_with_minus_c_from_elsewhere(built, tmp_path):
    assert optbuild(built, "build").fast
    assert optbuild(built, "build").fast
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = optbuild(built, "-C", str(built.root), "build", cwd=elsewhere)
    # recorded from the root, where `python -c` put another folder ('') on sys.path
    assert not first.fast and "sys.path" in first.declined
    assert optbuild(built, "-C", str(built.root), "build", cwd=elsewhere).fast


def _edit_recipe(proj: ProjectDir) -> None:
    proj.write("recipes/chain.toml", PIPELINE.replace('suffix = "-out"', 'suffix = "-OUT"'))


def _add_recipe(proj: ProjectDir) -> None:
    proj.write("recipes/extra.toml", "[steps.src]\nkind = \"text\"\npath = \"../data/input.txt\"\nupper = true\n")


def _edit_config(proj: ProjectDir) -> None:
    proj.write("optbuild.toml", CONFIG + "# a comment\n")


def _edit_input_keeping_size_and_mtime(proj: ProjectDir) -> None:
    path = proj.root / "data" / "input.txt"
    before = path.stat()
    path.write_text("HELLO")  # "hello": same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # only the ctime tells


def _delete_output(proj: ProjectDir) -> None:
    (proj.root / "build" / "chain" / "out" / "data.txt").unlink()


def _delete_cache_entry(proj: ProjectDir) -> None:
    key = json.loads(proj.read("optbuild.lock"))["steps"]["chain:out"]["key"]
    (proj.root / "cache" / "ac" / key[:2] / f"{key[2:]}.json").unlink()


def _output_blob(proj: ProjectDir) -> Path:
    """The cache's blob of chain:out's output."""
    digest = blake3.blake3((proj.root / "build" / "chain" / "out" / "data.txt").read_bytes()).hexdigest()
    return proj.root / "cache" / "cas" / digest[:2] / digest[2:]


def _delete_blob(proj: ProjectDir) -> None:
    _output_blob(proj).unlink()


def _replace_blob_with_a_copy(proj: ProjectDir) -> None:
    blob = _output_blob(proj)
    copy = blob.with_name("copy")
    shutil.copyfile(blob, copy)
    os.replace(copy, blob)  # same bytes, another inode


@pytest.mark.parametrize(("change", "why", "answer"), [
    (_edit_recipe, "recipes/chain.toml changed", "built    chain:out"),
    (_add_recipe, "recipes changed", "built    extra:src"),
    (_edit_config, "optbuild.toml changed", "ok: 4 cached"),
    (_edit_input_keeping_size_and_mtime, "data/input.txt changed", "built    chain:src"),
    (_delete_output, "build/chain/out", "ok: 4 cached"),
    (_delete_cache_entry, "cache/ac/", "built    chain:out"),
], ids=["recipe-edited", "recipe-added", "config-edited", "input-edited", "output-deleted", "entry-deleted"])
def test_any_change_takes_the_normal_path_with_its_answer(built, change, why, answer):
    change(built)
    run = optbuild(built, "build")
    assert run.returncode == 0 and not run.fast, run.stderr
    assert why in run.declined and answer in run.stderr, run.stderr
    assert (built.root / "build" / "chain" / "out" / "data.txt").is_file()
    # the normal path recorded the new state (after a rebuild, which rewrote optbuild.lock in
    # the project folder while it ran, the next normal no-op does)
    assert optbuild(built, "build").fast or optbuild(built, "build").fast


@pytest.mark.parametrize(("change", "answer"), [
    (_delete_blob, "built    chain:out"),  # the normal path finds the blob missing
    (_replace_blob_with_a_copy, "ok: 4 cached"),
], ids=["deleted", "replaced"])
@pytest.mark.parametrize("linked", [True, False], ids=["output-linked", "output-copied"])
def test_a_change_of_an_outputs_blob_is_seen_whether_the_output_is_its_link_or_a_copy(built, change, answer, linked):
    """A restored output is a hard link of its blob: the stamp then signs the one inode once,
    by the output's name (unlinking or replacing either name changes the inode's ctime). An
    output that is a copy (the built project was copied) leaves its blob signed on its own."""
    out = built.root / "build" / "chain" / "out" / "data.txt"
    if linked:
        shutil.rmtree(built.root / "build" / "chain")
        assert "4 cached" in optbuild(built, "build").stderr  # restored as links of the blobs; recorded
    assert (_output_blob(built).stat().st_ino == out.stat().st_ino) is linked
    assert (str(_output_blob(built)) in json.loads(stamp(built).read_text())["table"]["paths"]) is not linked
    assert optbuild(built, "build").fast
    change(built)
    run = optbuild(built, "build")
    assert run.returncode == 0 and not run.fast, run.stderr
    seen = "build/chain/out/data.txt changed" if linked else "cache/cas/"
    assert seen in run.declined and answer in run.stderr, run.stderr


def _entry(proj: ProjectDir, sid: str) -> Path:
    key = json.loads(proj.read("optbuild.lock"))["steps"][sid]["key"]
    return proj.root / "cache" / "ac" / key[:2] / f"{key[2:]}.json"


def needs_clock(proj: ProjectDir) -> None:
    """Skip where the project's file system tells no time (``file_system_clock``): there a
    folder of entries never vouches and products keep the 2 s margin."""
    if file_system_clock(str(proj.root)) is None:
        pytest.skip("this file system makes no unnamed file (O_TMPFILE)")


def _grouped_entries(proj: ProjectDir) -> set[str]:
    """The paths the stamp's table leaves to their folder's signature."""
    table = SigTable.from_json(json.loads(stamp(proj).read_text())["table"])
    return {table.paths[i] for group in table.groups for i in range(group.start, group.end)}


def test_a_folder_of_cache_entries_vouches_for_them_until_a_name_in_it_changes(built):
    """Entries are only ever renamed in or removed, never rewritten, so their folder's one stat
    vouches for them: a no-op at 10,000 steps stats 256 folders, not 10,000 entries. A name
    added beside them (another step's entry) makes the fast path check theirs one by one."""
    needs_clock(built)
    entries = {str(_entry(built, sid)) for sid in ("chain:src", "chain:mid", "chain:out", "chain:side")}
    assert _grouped_entries(built) == entries
    _entry(built, "chain:src").with_name("f" * 62 + ".json").write_text("{}")  # another's entry, pulled
    assert optbuild(built, "build").fast
    entry = _entry(built, "chain:out")
    shutil.copyfile(entry, entry.with_name("copy"))
    os.replace(entry.with_name("copy"), entry)  # the same entry, written again: another inode
    run = optbuild(built, "build")
    assert not run.fast and "cache/ac/" in run.declined and "ok: 4 cached" in run.stderr, run.stderr


def test_products_written_just_before_the_recording_vouch_by_their_signatures(built):
    """The racy rule for what optbuild writes (outputs, entries, the lock file) is their file
    system's own clock, read as the recording begins, not a 2 s margin: the no-op after a
    build reads none of them, and a folder of entries keeps its one stat."""
    needs_clock(built)
    shutil.rmtree(built.root / "build" / ".optbuild")
    _entry(built, "chain:out").unlink()  # rebuilt: its output, entry and the lock file written just now
    recording = optbuild(built, "build", racy_ns=2_000_000_000)
    assert "built    chain:out" in recording.stderr and "unusable" not in recording.stderr, recording.stderr
    assert str(_entry(built, "chain:out")) in _grouped_entries(built)
    products = (str(built.root / "build"), str(built.root / "cache"), str(built.root / "optbuild.lock"))
    assert [p for p in json.loads(stamp(built).read_text())["digests"] if p.startswith(products)] == []
    assert optbuild(built, "build").fast
    shutil.rmtree(built.root / "build" / "chain" / "out")  # restored just now, a hard link of its blob
    assert "cached" in optbuild(built, "build", racy_ns=2_000_000_000).stderr
    out = built.root / "build" / "chain" / "out" / "data.txt"
    assert _output_blob(built).stat().st_ino == out.stat().st_ino
    assert str(_output_blob(built)) not in json.loads(stamp(built).read_text())["table"]["paths"]  # the output vouches
    assert optbuild(built, "build").fast


@pytest.mark.parametrize(("args", "env", "why"), [
    (["build", "chain:mid"], {}, "other arguments"),
    (["build", "--json"], {}, "other arguments"),
    (["build"], {"OPTBUILD_SOMETHING": "1"}, "environment variable OPTBUILD_SOMETHING changed"),
    (["build"], {"CUDA_VISIBLE_DEVICES": "7"}, "environment variable CUDA_VISIBLE_DEVICES changed"),
    # a new key is a new environment: one normal build, though without a remote (the only
    # user of the key) it cannot change the answer; the stamp need not know which are secrets
    (["build"], {"OPTBUILD_SIGNING_KEY": "k"}, "environment variable OPTBUILD_SIGNING_KEY changed"),
])
def test_other_arguments_or_environment_take_the_normal_path(built, args, env, why):
    run = optbuild(built, *args, env=env)
    assert run.returncode == 0 and not run.fast and why in run.declined, run.stderr
    if "--json" in args:
        assert any(e.get("event") == "done" for e in map(json.loads, run.stdout.splitlines()[:-1]))
        assert not stamp(built).exists()  # a --json build records nothing
        abbreviated = optbuild(built, "build", "--js")  # argparse takes it for --json
        assert abbreviated.returncode == 0 and "--js is never taken by the fast path" in abbreviated.stderr
        assert not stamp(built).exists()


def recorded_with(proj: ProjectDir, *args: str) -> None:
    """Make the stamp one that `build ARGS` recorded (a normal no-op: every step cached)."""
    stamp(proj).unlink()
    run = optbuild(proj, "build", *args)
    assert run.returncode == 0 and not run.fast and " cached in " in run.stderr, run.stderr
    assert json.loads(stamp(proj).read_text())["argv"] == list(args)


def test_a_plan_after_a_build_with_jobs_answers_from_its_stamp(built):
    """How many steps run at once cannot change a no-op's answer (it runs none): `plan` after
    `build -j 2` settles from its stamp, with a normal plan's lines (benchmarks/bench.py
    builds so, then times `plan`). A plan has no -j: `plan -j 2` is an error, never answered."""
    recorded_with(built, "-j", "2")
    normal = optbuild(built, "plan", env={"OPTBUILD_UNRELATED": "1"})  # another environment: declined
    fast = optbuild(built, "plan")
    assert fast.returncode == 0 and fast.fast and not normal.fast, fast.stderr
    lines = [line for line in fast.stdout.splitlines() if line.startswith("  ")]
    assert sorted(lines) == sorted(line for line in normal.stdout.splitlines() if line.startswith("  "))
    assert sorted(lines) == [f"  cached   chain:{s}" for s in ("mid", "out", "side", "src")]
    assert "ok: 4 cached in" in fast.stdout
    wrong = optbuild(built, "plan", "-j", "2")
    assert wrong.returncode == 2 and not wrong.fast and "last: build -j 2" in wrong.declined, wrong.stderr


def test_other_jobs_or_keep_going_take_the_fast_path(built):
    """`-j/--jobs N` and `-k/--keep-going` (whether a failure stops the build: an ok build had
    none) are not compared, in any of the forms argparse reads them in; the stamp keeps the
    recorded build's arguments as they were written."""
    recorded_with(built, "-j", "1")
    for args in (["-j", "3"], ["-j3"], ["--jobs", "3"], ["--jobs=3", "-k"], ["--keep-going"], []):
        run = optbuild(built, "build", *args)
        assert run.returncode == 0 and run.fast, (args, run.stderr)
        assert "ok: 4 cached in" in run.stderr
    assert json.loads(stamp(built).read_text())["argv"] == ["-j", "1"]


@pytest.mark.parametrize(("recorded", "args", "code", "answer"), [
    (["-j", "2"], ["build", "chain:mid", "-j", "2"], 0, "ok: 2 cached"),  # a step selection
    (["-j", "2"], ["build", "-S", "chain:out.suffix=-X", "-j", "2"], 0, "built    chain:out"),  # an override
    (["-j", "2"], ["build", "--no-remote", "-j", "2"], 0, "ok: 4 cached"),  # the remote turned off
    (["-j", "2"], ["plan", "chain:mid"], 0, "ok: 2 cached"),
    # what argparse refuses: -j between two targets, and -k (here among short flags) in a plan
    (["chain:src", "chain:mid"], ["build", "chain:src", "-j", "2", "chain:mid"], 2, "unrecognized arguments: chain:mid"),
    (["-kj2"], ["plan", "-kj2"], 2, "unrecognized arguments: -kj2"),
], ids=["target", "override", "no-remote", "plan-target", "jobs-between-targets", "plan-keep-going"])
def test_arguments_that_can_change_the_answer_are_still_compared(built, recorded, args, code, answer):
    recorded_with(built, *recorded)
    run = optbuild(built, *args)
    assert run.returncode == code and not run.fast, run.stderr
    assert f"other arguments (last: build {' '.join(recorded)})" in run.declined
    assert answer in run.stdout + run.stderr, run.stdout + run.stderr


def test_the_arguments_compared_are_those_argparse_reads_alike():
    """Two argument lists that ``answer_args`` makes one, the first a valid build, are read by
    argparse alike (but for -j, -k and --no-build, which only `build` has): every list of up to
    three of these words, as `build` and as `plan`."""
    import contextlib
    import io
    import itertools

    from optbuild.cli import _parser
    from optbuild.common.noopstamp import answer_args

    parser = _parser()
    words = ["-j", "2", "-j2", "--jobs=3", "-k", "a", "b", "-S", "r:s.p=1", "--", "--no-remote", "-5", "--sch",
             "-kj2", "-j-1"]

    def parsed(command: str, args: tuple[str, ...]) -> dict | None:
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                found = vars(parser.parse_args([command, *args]))
            except SystemExit:
                return None
        return {k: v for k, v in found.items() if k not in ("command", "jobs", "keep_going", "no_build")}

    groups: dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]] = {}
    for n in range(4):
        for args in itertools.product(words, repeat=n):
            for command in ("build", "plan"):
                if (kept := answer_args(command, list(args))) is not None:
                    groups.setdefault(tuple(kept), []).append((command, args))
    alike = 0
    for members in groups.values():
        valid = next((parsed(*m) for m in members if m[0] == "build" and parsed(*m) is not None), None)
        for command, args in members if valid is not None else ():
            assert parsed(command, args) == valid, (members, command, args)
            alike += 1
    assert alike > 2000, alike


def same_size_edit(text: str) -> str:
    """``text`` with its last character changed: a different file of the same size."""
    return text[:-1] + (" " if text[-1] == "\n" else "x" if text[-1] != "x" else "y")


def as_if_edited_in_the_recording_tick(proj: ProjectDir, relative: str) -> None:
    """Put ``relative``'s signature as it is now in the stamp: an edit made within the
    timestamp tick of the recording, which leaves a signature no stat can tell apart."""
    data = json.loads(stamp(proj).read_text())
    path = str((proj.root / relative).resolve())
    table = SigTable.from_json(data["table"])
    assert path in table.paths, f"{relative} is not signed"
    assert path in data["digests"], f"{relative} is not vouched for by its content"
    sigs = table.sigs(list(range(len(table.paths))))
    sigs[path] = signature(path)
    data["table"] = SigTable.of(sigs, table.groups).to_json()
    stamp(proj).write_text(json.dumps(data))


@pytest.mark.parametrize("relative", [
    "data/input.txt",  # a step's input: the bytes the build hashed
    "recipes/chain.toml",  # a recipe: the text the build loaded
    "optbuild.toml",  # the whole answer's: the text the build loaded
    "kinds.py",  # a project module: the source the build compiled
])
def test_a_file_changed_just_before_the_build_is_vouched_for_by_what_the_build_read(built, relative):
    """git's racy-clean problem: a file whose times are too young to tell a later edit from
    the one the build saw is checked by content against what the build read, on each no-op."""
    path = built.root / relative
    path.write_text(path.read_text())  # rewritten just before the build: racy times, same content
    recording = optbuild(built, "build", racy_ns=2_000_000_000)
    assert recording.returncode == 0, recording.stderr
    assert "unusable" not in recording.stderr and "not vouched" not in recording.stderr, recording.stderr
    assert optbuild(built, "build").fast
    path.write_text(same_size_edit(path.read_text()))
    as_if_edited_in_the_recording_tick(built, relative)
    after = optbuild(built, "build")
    assert not after.fast and f"{relative} changed" in after.declined, after.stderr


def test_a_recipe_larger_than_an_inputs_content_check_is_vouched_for_by_its_text(built):
    """A recipe of 10,000 steps is 500 KB: the build parsed it whole, so a no-op may read it."""
    recipe = built.root / "recipes" / "chain.toml"
    recipe.write_text(PIPELINE + "# " + "x" * HASH_MAX + "\n")
    recording = optbuild(built, "build", racy_ns=2_000_000_000)
    assert recording.returncode == 0 and "not vouched" not in recording.stderr, recording.stderr
    assert optbuild(built, "build").fast


def test_a_project_written_just_before_its_first_build_is_vouched_for(tmp_path):
    """Its recipe folder too: the names it holds give the recipes the build loaded."""
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", PIPELINE)
    recording = optbuild(proj, "build", racy_ns=2_000_000_000)
    assert recording.returncode == 0 and "unusable" not in recording.stderr, recording.stderr
    assert "not vouched" not in recording.stderr, recording.stderr
    assert optbuild(proj, "build").fast
    proj.write("recipes/more.toml", '[steps.x]\nkind = "text"\npath = "../data/input.txt"\n')
    after = optbuild(proj, "build")
    assert not after.fast and "recipes changed" in after.declined and "cached   more:x" in after.stderr


def test_a_young_file_larger_than_the_content_check_leaves_its_steps_to_be_decided_again(built):
    """A no-op would read it whole each time: only the steps that read it are decided again,
    the project's other files vouch for the rest (a timestamp at or after the build's start
    is racy even without margin)."""
    path = built.root / "data" / "input.txt"
    path.write_text("x" * (HASH_MAX + 1))
    future = path.stat().st_mtime_ns + 3600 * 10**9
    os.utime(path, ns=(future, future))
    recording = optbuild(built, "build")
    assert recording.returncode == 0 and "built    chain:src" in recording.stderr
    assert "unusable" not in recording.stderr and "1 steps not vouched for" in recording.stderr
    after = optbuild(built, "build")
    assert not after.fast and "step chain:src: data/input.txt changed within" in after.declined
    assert "ok: 4 cached" in after.stderr


def test_a_recipe_read_with_other_line_ends_than_its_bytes_is_not_vouched_for_by_its_text(built):
    """Read as text, CRLF becomes LF: the text the build loaded is not the file's bytes, so
    its steps are decided again rather than trusted."""
    recipe = built.root / "recipes" / "chain.toml"
    recipe.write_bytes(PIPELINE.replace("\n", "\r\n").encode())
    future = recipe.stat().st_mtime_ns + 3600 * 10**9
    os.utime(recipe, ns=(future, future))
    assert not optbuild(built, "build").fast  # changed since the stamp: records a new one
    after = optbuild(built, "build")  # a recipe's steps own it: they are decided again
    assert not after.fast and "recipes/chain.toml changed within 0 s of the build's start" in after.declined
    assert "ok: 4 cached" in after.stderr


def test_a_failed_build_leaves_no_stamp_and_is_never_reported_ok(built):
    assert stamp(built).exists()
    built.write("recipes/chain.toml", PIPELINE.replace('suffix = "-out"', 'suffix = "-out"\nfail = true'))
    failed = optbuild(built, "build")
    assert failed.returncode == 1 and not stamp(built).exists()
    again = optbuild(built, "build")
    assert again.returncode == 1 and not again.fast and "no record" in again.declined


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not-an-object", "wrong-types"])
def test_a_damaged_stamp_takes_the_normal_path(built, damage):
    good = stamp(built).read_bytes()
    data = {"garbage": b"\x00\xffnot json", "truncated": good[: len(good) // 2], "not-an-object": b"[1, 2]",
            "wrong-types": json.dumps({**json.loads(good), "table": 5, "digests": None}).encode()}[damage]
    stamp(built).write_bytes(data)
    run = optbuild(built, "build")
    assert run.returncode == 0 and not run.fast and "ok: 4 cached" in run.stderr, run.stderr
    assert run.declined
    assert optbuild(built, "build").fast  # and a good stamp is written again


@pytest.mark.parametrize("damage", ["missing", "garbage", "another-build"])
def test_the_steps_records_are_read_only_when_a_steps_file_changed_and_must_be_the_stamps_own(built, damage):
    """The steps' records lie beside the stamp (a no-op with nothing changed never parses them);
    when an input changed, records that are missing, damaged or of another build decline."""
    records = built.root / "build" / ".optbuild" / "noop-steps.json"
    doc = json.loads(records.read_text())
    if damage == "missing":
        records.unlink()
    else:
        records.write_text("{not json" if damage == "garbage" else json.dumps({**doc, "part": "another"}))
    assert optbuild(built, "build").fast  # nothing changed: the stamp alone answers
    built.write("data/input.txt", "edited")
    run = optbuild(built, "build")
    assert run.returncode == 0 and "the record of the steps is damaged or of another build" in run.declined
    assert "built    chain:src" in run.stderr, run.stderr
    assert records.exists() and optbuild(built, "build").fast  # recorded again, whole


def unsalted_digests(value: bytes) -> list[bytes]:
    """What anyone could compute from a guess of ``value``: its common digests, raw and hex."""
    digests = [hashlib.new(name, value).digest() for name in
               ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "sha3_256", "sha3_512", "blake2s")]
    digests += [hashlib.blake2b(value, digest_size=size).digest() for size in (16, 20, 32, 64)]
    digests.append(blake3.blake3(value).digest())
    return [form for d in digests for form in (d, d.hex().encode(), d[:8].hex().encode())]


def test_a_secret_in_the_environment_leaves_no_trace_in_the_build_folder(built):
    key = secrets.token_hex(16)
    run = optbuild(built, "build", env={"OPTBUILD_SIGNING_KEY": key})
    assert run.returncode == 0 and "recorded" in run.stderr, run.stderr
    assert optbuild(built, "build", env={"OPTBUILD_SIGNING_KEY": key}).fast  # still an exact record
    traces = [key.encode(), *unsalted_digests(key.encode())]
    for path in [p for p in (built.root / "build").rglob("*") if p.is_file()]:
        data = path.read_bytes()
        assert not any(t in data for t in traces), f"{path} holds the key or a digest anyone could compute"
    salt = user_cache(built) / "optbuild" / "noop-salt"
    assert salt.stat().st_mode & 0o777 == 0o600


def test_a_stamp_keyed_with_another_salt_is_declined(built):
    (user_cache(built) / "optbuild" / "noop-salt").write_bytes(os.urandom(32))  # as another user's
    run = optbuild(built, "build")
    assert run.returncode == 0 and not run.fast and "keyed with another salt" in run.declined, run.stderr
    assert optbuild(built, "build").fast


def test_a_salt_others_can_read_is_never_used(built):
    salt = user_cache(built) / "optbuild" / "noop-salt"
    salt.chmod(0o644)
    run = optbuild(built, "build")
    assert run.returncode == 0 and not run.fast and "not private to this user" in run.declined, run.stderr
    assert "not recorded: no private salt" in run.stderr and not stamp(built).exists()
    salt.unlink()  # as the message says: a new one is made
    optbuild(built, "build")
    assert optbuild(built, "build").fast


# --- with a remote cache: recorded when the remote cannot change the answer ---------------
def remote_project(root: Path, remote) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("optbuild.toml", CONFIG + "\n" + remote.section())
    proj.write("recipes/chain.toml", PIPELINE)
    return proj


def test_with_a_remote_a_noop_whose_steps_are_all_local_takes_the_fast_path(tmp_path, s3_remote):
    proj = remote_project(tmp_path / "proj", s3_remote)
    assert optbuild(proj, "build").returncode == 0  # builds, writes through to the remote
    stamp(proj).unlink()
    normal = optbuild(proj, "build")  # every step a local hit: recorded
    assert normal.returncode == 0 and not normal.fast and "recorded" in normal.stderr, normal.stderr
    fast = optbuild(proj, "build")
    assert fast.fast and step_lines(fast) == step_lines(normal), fast.stderr
    cache_line = f"cache: local 4 hits, 0 misses; remote {s3_remote.url}: 0 hits, 0 misses, 0 errors"
    assert cache_line in normal.stderr and cache_line in fast.stderr
    assert not {"fsspec", "s3fs", "botocore"} & {m.partition(".")[0] for m in fast.modules}
    stats = [json.loads(line) for line in (proj.root / "cache" / "stats.jsonl").read_text().splitlines()]
    assert stats[-1]["fast_path"] and stats[-1]["remote"]["url"] == s3_remote.url
    assert stats[-1]["remote"]["hits"] == stats[-1]["remote"]["misses"] == 0 == stats[-2]["remote"]["misses"]
    assert not optbuild(proj, "build", "--no-remote").fast  # its own arguments: recorded, then taken
    assert optbuild(proj, "build", "--no-remote").fast
    url = optbuild(proj, "build", "--remote", s3_remote.url)  # a URL is never kept in a stamp
    assert not url.fast and "--remote is never taken by the fast path" in url.stderr
    abbreviated = optbuild(proj, "build", "--rem", s3_remote.url)  # argparse's abbreviation of it
    assert abbreviated.returncode == 0 and "--rem is never taken by the fast path" in abbreviated.stderr


def test_with_a_remote_a_step_left_out_of_the_local_cache_is_never_recorded(tmp_path, s3_remote):
    """An unavailable step asks the remote on every build: another host may have pushed it."""
    proj = remote_project(tmp_path / "proj", s3_remote)
    proj.write("needs.py", UNICORN)
    proj.write("optbuild.toml", KINDS + "\n" + s3_remote.section())
    proj.write("recipes/chain.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
               '[steps.horn]\nkind = "needs"\ninput = "src"\n')
    assert optbuild(proj, "build", "--skip-unavailable").returncode == 0
    again = optbuild(proj, "build", "--skip-unavailable")
    assert again.returncode == 0 and not again.fast, again.stderr
    assert "not recorded: a remote cache is configured and chain:horn is not in the local cache" in again.stderr
    assert not stamp(proj).exists()
