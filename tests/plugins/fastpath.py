"""Running `optbuild` as a user would, in its own interpreter, telling whether the no-op
fast path (optbuild.cli.noop) was taken: OPTBUILD_DEBUG_FASTPATH=1 makes stderr say so, and why
not. The racy margin is 0 unless asked otherwise, so that a build started right after
another may vouch for its files. $XDG_CACHE_HOME is a folder beside the project (the
per-user salt of the stamp's digests lives there), not the real user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from plugins.projects import ProjectDir

CODE = """\
import json, sys
import optbuild.common.signatures
optbuild.common.signatures.RACY_NS = {racy_ns}
from optbuild.cli import main
rc = main({args!r})
print(json.dumps(sorted(sys.modules)))
sys.exit(rc)
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def fast(self) -> bool:
        return "fast path: taken" in self.stderr

    @property
    def declined(self) -> str:
        """Why the fast path was declined ("" if it was not)."""
        return next((line.partition("declined: ")[2] for line in self.stderr.splitlines()
                     if "fast path: declined: " in line), "")

    @property
    def modules(self) -> list[str]:
        return json.loads(self.stdout.splitlines()[-1])


def user_cache(project: ProjectDir) -> Path:
    """The $XDG_CACHE_HOME the project's builds run with."""
    return project.root.parent / "user-cache"


def optbuild(project: ProjectDir, *args: str, racy_ns: int = 0, env: dict | None = None,
             cwd: Path | None = None) -> Run:
    proc = subprocess.run(
        [sys.executable, "-c", CODE.format(racy_ns=racy_ns, args=list(args))], cwd=cwd or project.root,
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OPTBUILD_DEBUG_FASTPATH": "1", "XDG_CACHE_HOME": str(user_cache(project)),
             **(env or {})})
    return Run(proc.returncode, proc.stdout, proc.stderr)
