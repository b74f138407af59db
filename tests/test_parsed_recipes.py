"""Recipes parsed last run are taken from build/.optbuild/parsed.json by the digest of their
text: an edited recipe is parsed again, a damaged memory is ignored, and nothing is written
where no build has run."""

from __future__ import annotations

import datetime
import json
import os

from optbuild.project.parsed import NAME, ParsedRecipes
from optbuild.project.recipe import load_project


def _memory(project):
    return project.root / "build" / ".optbuild" / NAME


def _suffix(project, sid: str) -> str:
    return load_project(project.root).steps[sid].step.params.suffix


def _plant(project) -> bytes:
    """After a build and a load, another value filed under the recipe's digest in the memory
    (a run that takes it from there shows "-planted"); the memory's bytes."""
    project.build()
    load_project(project.root)
    memory = _memory(project)
    doc = json.loads(memory.read_text())
    assert len(doc["docs"]) == 1
    (digest, text), = doc["docs"].items()
    doc["docs"][digest] = text.replace('"-mid"', '"-planted"')
    memory.write_text(json.dumps(doc))
    return memory.read_bytes()


def test_an_unchanged_recipe_is_taken_from_the_last_run(project):
    _plant(project)
    assert _suffix(project, "chain:mid") == "-planted"


def test_tables_filed_by_someone_without_this_users_salt_are_not_taken(project, monkeypatch, tmp_path):
    """A build folder may come from elsewhere (a CI cache): the digests are keyed, so tables
    planted under the digest of a recipe's text by another user are never found."""
    _plant(project)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-user"))
    assert _suffix(project, "chain:mid") == "-mid"


def test_an_edited_recipe_is_parsed_again_and_the_memory_follows(project):
    project.build()
    load_project(project.root)
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('"-mid"', '"-edited"'))
    assert _suffix(project, "chain:mid") == "-edited"
    (text,) = json.loads(_memory(project).read_text())["docs"].values()
    assert '"-edited"' in text and '"-mid"' not in text  # only this run's documents are kept


def test_a_damaged_memory_costs_a_parse_not_a_wrong_project(project):
    project.build()
    load_project(project.root)
    for damage in (b"{not json", b'{"format": 1, "python": 3, "docs": []}', b'{"format": 1, "docs": {"x": 1}}'):
        _memory(project).write_bytes(damage)
        assert _suffix(project, "chain:mid") == "-mid"
    doc = json.loads(_memory(project).read_text())
    doc["docs"] = {digest: "{not json" for digest in doc["docs"]}
    _memory(project).write_text(json.dumps(doc))
    assert _suffix(project, "chain:mid") == "-mid"


def test_nothing_is_written_where_no_build_ran(project):
    load_project(project.root)
    assert not (project.root / "build").exists()


def test_a_linked_state_folder_is_neither_read_nor_written(project, tmp_path):
    planted = _plant(project)
    state = project.root / "build" / ".optbuild"
    elsewhere = tmp_path / "elsewhere"
    state.rename(elsewhere)
    os.symlink(elsewhere, state)
    assert _suffix(project, "chain:mid") == "-mid"  # not read through the link
    assert (elsewhere / NAME).read_bytes() == planted  # nor written
    (elsewhere / NAME).unlink()
    load_project(project.root)
    assert not (elsewhere / NAME).exists()


def test_a_document_json_cannot_hold_is_parsed_every_run(tmp_path):
    (tmp_path / ".optbuild").mkdir()
    for _run in range(2):
        parsed = ParsedRecipes(tmp_path)
        assert parsed.loads("day = 2026-11-29\n", tmp_path / "r.toml") == {"day": datetime.date(2026, 11, 29)}
        parsed.save()
    assert not (tmp_path / ".optbuild" / NAME).exists()
