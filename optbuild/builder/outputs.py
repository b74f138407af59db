"""What a step wrote becomes its outputs: the same rules wherever it ran (here, or on a
Dask node). An output is a file's bytes: a step that wrote none, missed its main output
or left a symbolic link (a pointer out of the build, not content) fails."""

from __future__ import annotations

from pathlib import Path

from optbuild.common.errors import StepError
from optbuild.store.entry import OutputFile
from optbuild.store.local import LocalStore


def store_outputs(out_dir: Path, primary: str | None, step_id: str, store: LocalStore) -> dict[str, OutputFile]:
    """Move every file under ``out_dir`` into ``store``; relative name -> its record."""
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() or p.is_symlink())
    if not files:
        raise StepError(f"{step_id} produced no output")
    if primary is not None and not (out_dir / primary).is_file():
        raise StepError(f"{step_id} did not write its main output {primary}")
    outputs = {}
    for path in files:
        if path.is_symlink():
            raise StepError(f"{step_id} wrote a symbolic link ({path.name}); outputs must be files")
        outputs[path.relative_to(out_dir).as_posix()] = store.put_file(path, move=True)
    return outputs
