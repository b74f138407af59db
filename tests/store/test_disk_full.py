"""A full disk is named, never a traceback or a mute "step process died".

Builds run through the CLI in a subprocess, on a real 1 MiB tmpfs where this host lets us
mount one (root), and under a real file-size limit (ulimit -f: EFBIG) everywhere.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from plugins.projects import CONFIG, ProjectDir

FILL_KINDS = '''
import os

from optbuild.steps.base import Step, StepParams


class FillParams(StepParams):
    size: int
    hog: str = ""  # after writing the output, grow this file until the disk is full


class Fill(Step):
    Params = FillParams
    primary_output = "data.bin"

    def run(self, ctx):
        (ctx.out_dir / "data.bin").write_bytes(b"x" * self.params.size)
        if self.params.hog:
            fill_disk(self.params.hog)


def fill_disk(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
'''


def fill_project(root: Path, recipe: str) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("fill.py", FILL_KINDS)
    proj.write("optbuild.toml", CONFIG.replace('[kinds]\n', '[kinds]\nfill = "fill.py:Fill"\n'))
    proj.write("recipes/disk.toml", recipe)
    return proj


def assert_clear(run, message: str) -> None:
    """The build failed with ``message`` (a regex) on stderr, and nothing else went wrong."""
    assert run.returncode != 0
    assert re.search(message, run.stderr), run.stderr
    assert "Traceback" not in run.stderr and "step process died" not in run.stderr, run.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 1 MiB file system (tmpfs), or a skip saying why this host cannot mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def full(mount: Path) -> str:
    """A write() error carries no file name: then the folder written in is named."""
    return rf"no space left on device writing (in )?\S+ \(file system of {re.escape(str(mount))}, [\d.]+ [KMGT]?i?B free\)"


def fill_disk(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_step_output_larger_than_the_disk(small_disk):
    proj = fill_project(small_disk / "proj", '[steps.big]\nkind = "fill"\nsize = 2000000\n')
    run = proj.cli("build")
    assert_clear(run, full(small_disk).replace(r"\S+", r"\S+/out"))


def test_the_disk_filling_up_while_the_result_is_stored(small_disk):
    proj = fill_project(small_disk / "proj", f'[steps.hog]\nkind = "fill"\nsize = 10\nhog = "{small_disk}/hog"\n')
    assert_clear(proj.cli("build"), full(small_disk))


def test_a_disk_already_full_when_a_step_must_build(small_disk):
    proj = fill_project(small_disk / "proj", '[steps.small]\nkind = "fill"\nsize = 10\n')
    proj.cli("plan")  # creates the cache folders
    fill_disk(small_disk / "hog")
    assert_clear(proj.cli("build"), full(small_disk))


def test_a_full_disk_when_the_lock_file_is_written(small_disk):
    proj = fill_project(small_disk / "proj", '[steps.small]\nkind = "fill"\nsize = 10\n')
    assert proj.cli("build").returncode == 0
    (proj.root / "optbuild.lock").unlink()
    fill_disk(small_disk / "hog")
    run = proj.cli("build")
    assert_clear(run, "built and cached, but .*optbuild.lock could not be updated: " + full(small_disk))


def test_a_step_output_over_the_file_size_limit(tmp_path):
    """EFBIG (ulimit -f) is a full disk too; SIGXFSZ is ignored, as Python itself does."""
    proj = fill_project(tmp_path / "proj", '[steps.big]\nkind = "fill"\nsize = 2000000\n')
    limit = 1 << 20

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "optbuild.cli", "build"], cwd=proj.root, capture_output=True,
                          text=True, timeout=120, preexec_fn=limit_file_size, check=False)
    assert_clear(proc, rf"file too large writing in \S+/out \(the file-size limit \(ulimit -f\) is {limit} bytes\)")
