"""Putting a step's outputs in ``build/<recipe>/<step>``: hard links of the cache's blobs,
recorded as written by optbuild (``store.written``: what ``clean`` deletes), never over a
file optbuild did not write, and spared where the last run left the folder as it is
(``memo``)."""

from __future__ import annotations

import os
from pathlib import Path

from optbuild.builder.memo import DecisionMemo
from optbuild.common.digest import FileHasher
from optbuild.common.errors import StepError, describe_os_error
from optbuild.common.paths import confined
from optbuild.project.recipe import Project, StepSpec
from optbuild.store import written
from optbuild.store.entry import ActionEntry
from optbuild.store.local import LocalStore


class Restorer:
    """Restores the steps of one run in the build folder."""

    def __init__(self, project: Project, store: LocalStore, hasher: FileHasher, memo: DecisionMemo):
        self.project = project
        self.store = store
        self.hasher = hasher
        self.memo = memo
        self._swept: set[Path] = set()  # build/<recipe> folders cleared of killed restores' leftovers
        self._recipe_dirs: dict[str, Path] = {}  # recipe -> build/<recipe>, resolved (``dest``)
        self._build_real = project.build_dir.resolve()  # once a run (``dest``)
        self._dests: dict[str, Path] = {}  # step -> its folder (``dest``), asked more than once a step

    def dest(self, spec: StepSpec) -> Path:
        """``build/<recipe>/<step>`` as it really is, proven inside the build folder: the
        build folder is resolved once a run and each recipe's folder once (a realpath per step
        adds up); a recipe's folder that is no link is the resolved build folder's child of
        that name (names hold no separator and are never '.' or '..'); the step's own name is
        never resolved (``paths.confined``)."""
        if (dest := self._dests.get(spec.id)) is not None:
            return dest
        if (folder := self._recipe_dirs.get(spec.recipe)) is not None:
            dest = self._dests[spec.id] = folder / spec.name
            return dest
        folder = self._build_real / spec.recipe
        if os.path.islink(folder):  # where it leads is proven, or refused
            folder = confined(self.project.step_dir(spec.id), self.project.build_dir,
                              f"the outputs of {spec.id} to").parent
        self._recipe_dirs[spec.recipe] = folder
        dest = self._dests[spec.id] = folder / spec.name
        return dest

    def restore(self, spec: StepSpec, entry: ActionEntry, dest: Path) -> None:
        """Make ``dest`` hold the entry's outputs, recorded as written by optbuild (what
        ``clean`` deletes, ``store.written``). Leftovers of restores killed in its folder
        are swept (once a run), even when nothing needs restoring. BlobGone when a blob
        vanished or proved corrupt: the caller rebuilds. A file optbuild did not write there
        stops it: replacing the folder would delete it."""
        build_dir, folder = self.project.build_dir, self.project.step_folder(spec.id)
        if self.memo.materialized(spec.id, entry.key, dest) and written.is_recorded(build_dir, folder):
            return  # as the last run left it, which checked it
        try:
            with self.store.lock_dest(dest):
                if dest.parent not in self._swept:  # once per folder and run: a listdir per step adds up
                    self._swept.add(dest.parent)
                    self.store.sweep_leftovers(dest.parent)
                files = {f"{folder}/{name}": (o.digest, o.size) for name, o in entry.outputs.items()}
                if self.store.is_materialized(entry, dest):
                    if not written.is_recorded(build_dir, folder):  # an earlier optbuild's, or a new record
                        written.write(build_dir, folder, files)
                    return
                before = written.recorded_files(build_dir, folder)
                if foreign := written.unrecorded(build_dir, folder, before, known=self._in_cache):
                    raise StepError(f"cannot write the outputs of {spec.id}: optbuild replaces its folder {dest} "
                                    f"whole, but did not write {foreign[0]} there. Move that out of the build "
                                    "folder, then build again")
                gone = {name: f for name, f in (before or {}).items() if name not in files}
                written.write(build_dir, folder, {**gone, **files})  # recorded first: a kill leaves no file unrecorded
                self.store.materialize(entry, dest)
                if gone:
                    written.write(build_dir, folder, files)
        except OSError as exc:
            raise StepError(f"cannot write the outputs of {entry.step}: {describe_os_error(exc, dest)}") from None

    def vacate(self, spec: StepSpec, dest: Path) -> None:
        """Empty ``dest`` of the outputs optbuild put there before, for a step whose outputs
        of this run stay on the remote cache: build/ never shows outputs that are not the
        step's current ones. Only files optbuild recorded writing go (``written.delete``)."""
        folder = self.project.step_folder(spec.id)
        if not written.is_recorded(self.project.build_dir, folder):
            return
        try:
            with self.store.lock_dest(dest):
                written.delete(self.project.build_dir, folder, written.Deleted())
        except OSError as exc:
            raise StepError(f"cannot empty the folder of {spec.id}: {describe_os_error(exc, dest)}") from None
        self.memo.forget(spec.id)

    def _in_cache(self, path: Path) -> bool:
        """Whether the bytes of ``path`` are a blob of the cache: an output an earlier
        optbuild, which kept no record, wrote."""
        try:
            return self.store.blob_path(self.hasher.digest(path)).is_file()
        except OSError:
            return False
