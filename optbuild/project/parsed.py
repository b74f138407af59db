"""Recipes as the last run parsed them, so that a project of 1,000 recipes is not parsed again.

tomllib is pure Python: parsing 1,000 recipes costs a quarter of a second on every command
that loads the project (``plan``, a build that misses the no-op fast path). What it returns
is a function of the text alone, so ``<build folder>/.optbuild/parsed.json`` keeps each
recipe's parsed tables under the digest of its text (and the interpreter's version, whose
tomllib made them): a recipe whose text is unchanged is taken from there, one edited is
parsed again. No timestamp is trusted, so there is no racy window: each recipe is still read
and hashed every run, which costs a few milliseconds at 1,000 recipes.

The file is written only into a build folder that optbuild made (its marker) and a build has
used (``.optbuild`` there), and holds the documents of the last run only (it never grows past
the project). A document that JSON cannot hold as it is (a TOML date) is parsed every run. A
damaged file is ignored: it costs speed, never correctness (``common.statefile``). A build
folder may come from elsewhere (a CI cache restored from another job), so the digests are
keyed with this user's private salt (the no-op stamp's, ``common.noopstamp``): no one without
it can file tables under the digest of a recipe's text. Without a usable salt every recipe is
parsed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from optbuild.common import noopstamp, tomlfile
from optbuild.common.statefile import read_state, write_state
from optbuild.store.marker import ownership

FORMAT = 1
NAME = "parsed.json"  # under <build folder>/.optbuild/


class ParsedRecipes:
    """The parsed recipes of one build folder: ``loads`` answers from them, ``save`` keeps
    this run's. Each document is kept as JSON text, so every caller gets tables of its own."""

    def __init__(self, build_dir: Path):
        self.build_dir = build_dir
        self.path = build_dir / ".optbuild" / NAME
        try:  # made here only where there is a build folder's state to keep the memory in
            self._salt: bytes | None = noopstamp.salt(create=self.path.parent.is_dir())
        except (OSError, ValueError):
            self._salt = None  # no private salt: nothing is taken nor kept
        self._old = self._load() if self._salt is not None else {}
        self._new: dict[str, str] = {}
        self._parsed = False  # a document was parsed and kept this run

    def _load(self) -> dict[str, str]:
        if (doc := read_state(self.path, format=FORMAT, python=sys.version)) is None:
            return {}  # absent, damaged or foreign: parse every recipe
        try:
            return {k: v for k, v in doc["docs"].items() if isinstance(v, str)}
        except (TypeError, KeyError, AttributeError):
            return {}

    def loads(self, text: str, file: Path) -> dict[str, Any]:
        """The tables of ``text`` (read from ``file``): as parsed last run, else parsed now
        (``tomlfile.loads``, whose errors pass through)."""
        if self._salt is None:
            return tomlfile.loads(text, file)
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20, key=self._salt).hexdigest()
        if (kept := self._old.get(digest)) is not None:
            try:
                data = json.loads(kept)
                if isinstance(data, dict):
                    self._new[digest] = kept
                    return data
            except (ValueError, RecursionError):
                pass  # damaged: parsed again
        data = tomlfile.loads(text, file)
        try:
            self._new[digest] = json.dumps(data, separators=(",", ":"))
            self._parsed = True
        except (TypeError, ValueError, RecursionError):
            pass  # a TOML date: JSON cannot hold it, parsed every run
        return data

    def save(self) -> None:
        """Keep this run's documents when they differ from the last run's (best effort: one
        not kept only costs speed). Nothing is written where no build has run."""
        if self._salt is None or (not self._parsed and self._new.keys() == self._old.keys()):
            return
        if ownership(self.build_dir, "build") is None or not self.path.parent.is_dir():
            return  # only into optbuild's own build folder, where a build has run
        write_state(self.path, self.build_dir, {"format": FORMAT, "python": sys.version, "docs": self._new},
                    "the parsed recipes")
