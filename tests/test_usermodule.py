"""optbuild.common.usermodule: a user's file imported by path, its folder on sys.path only while needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from plugins.edits import compile_to_pycache, edit_within_the_same_second

from optbuild.common import usermodule


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_sibling_import_works_inside_the_block_and_is_forgotten_after(tmp_path):
    write(tmp_path / "helpers_um.py", "VALUE = 42\n")
    entry = write(tmp_path / "net.py", "import helpers_um\n\ndef lazily():\n    import later_um\n"
                                       "    return later_um.VALUE\n")
    write(tmp_path / "later_um.py", "VALUE = 7\n")
    path_before = list(sys.path)
    with usermodule.imported(entry) as module:
        assert module.helpers_um.VALUE == 42
        assert sys.path[0] == str(tmp_path.resolve())
        assert module.lazily() == 7  # a sibling imported after the file ran, still in the block
    assert sys.path == path_before
    assert "helpers_um" not in sys.modules and "later_um" not in sys.modules
    assert module.__name__ not in sys.modules


def test_sys_path_is_restored_after_a_failing_import(tmp_path):
    write(tmp_path / "ok_sibling_um.py", "X = 1\n")
    entry = write(tmp_path / "broken.py", "import ok_sibling_um\nraise ValueError('no model here')\n")
    path_before, modules_before = list(sys.path), set(sys.modules)
    with pytest.raises(usermodule.ImportFailed) as info, usermodule.imported(entry):
        pass
    assert sys.path == path_before
    assert set(sys.modules) == modules_before
    assert isinstance(info.value.cause, ValueError) and isinstance(info.value, ImportError)
    assert str(info.value) == f"importing {entry.resolve()} failed: ValueError: no model here"
    assert info.value.__cause__ is info.value.cause


def test_sys_path_is_restored_when_the_block_raises(tmp_path):
    entry = write(tmp_path / "fine.py", "X = 1\n")
    path_before = list(sys.path)
    with pytest.raises(RuntimeError), usermodule.imported(entry):
        raise RuntimeError("the caller's own failure")
    assert sys.path == path_before


def test_a_missing_file_and_sys_exit_are_import_failures(tmp_path):
    with pytest.raises(usermodule.ImportFailed) as info, usermodule.imported(tmp_path / "gone.py"):
        pass
    assert isinstance(info.value.cause, FileNotFoundError)
    entry = write(tmp_path / "quits.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(usermodule.ImportFailed) as info, usermodule.imported(entry):
        pass
    assert isinstance(info.value.cause, SystemExit)


def test_files_of_the_same_name_in_two_folders_get_their_own_modules(tmp_path):
    first = write(tmp_path / "a" / "model.py", "from layers_um import WHO\n")
    write(tmp_path / "a" / "layers_um.py", "WHO = 'a'\n")
    second = write(tmp_path / "b" / "model.py", "from layers_um import WHO\n")
    write(tmp_path / "b" / "layers_um.py", "WHO = 'b'\n")
    with usermodule.imported(first) as one:
        assert one.WHO == "a"
    with usermodule.imported(second) as two:
        assert two.WHO == "b"  # not a's sibling, forgotten when a's block ended
    assert one is not two and one.__name__ != two.__name__
    assert one.__file__ == str(first.resolve()) and two.__file__ == str(second.resolve())


def test_an_edited_file_is_imported_afresh(tmp_path):
    entry = write(tmp_path / "edited.py", "VALUE = 1\n")
    with usermodule.imported(entry) as module:
        assert module.VALUE == 1
    entry.write_text("VALUE = 2  # a different size, so the cached bytecode is stale\n")
    with usermodule.imported(entry) as module:
        assert module.VALUE == 2


def test_a_same_second_same_size_edit_after_an_import_runs_the_new_code(tmp_path):
    entry = write(tmp_path / "net_um.py", "from scale_um import SCALE\nfrom pkg_um.deep import DEPTH\n"
                                          "OFFSET = 1\n")
    sibling = write(tmp_path / "scale_um.py", "SCALE = 21.25\n")
    write(tmp_path / "pkg_um" / "__init__.py", "")
    nested = write(tmp_path / "pkg_um" / "deep.py", "DEPTH = 1\n")
    compile_to_pycache(tmp_path, "net_um")
    edit_within_the_same_second(entry, "OFFSET = 1", "OFFSET = 3")
    edit_within_the_same_second(sibling, "21.25", "21.75")
    edit_within_the_same_second(nested, "1", "2")
    with usermodule.imported(entry) as module:
        assert (module.OFFSET, module.SCALE, module.DEPTH) == (3, 21.75, 2)


def test_installed_modules_keep_their_bytecode(tmp_path):
    import optbuild

    entry = write(tmp_path / "uses_json.py", "import json\nimport pydantic\n")
    with usermodule.imported(entry) as module:
        assert type(module.__loader__) is usermodule.SourceOnlyLoader
        for installed in (module.json, module.pydantic):
            assert type(installed.__loader__) is not usermodule.SourceOnlyLoader
    package = Path(optbuild.__file__).parent  # optbuild's own modules, in any of its packages
    for name in ("optbuild.api", "optbuild.steps.fields", "optbuild.common.units"):
        folder = package / Path(*name.split(".")[1:-1])
        spec = usermodule._SOURCE_FINDER.find_spec(name, [str(folder)])
        assert type(spec.loader) is not usermodule.SourceOnlyLoader, name


def test_load_keeps_the_module_and_restores_sys_path(tmp_path):
    write(tmp_path / "kind_helper_um.py", "NAME = 'helper'\n")
    entry = write(tmp_path / "kinds.py", "from kind_helper_um import NAME\n")
    path_before = list(sys.path)
    module = usermodule.load(entry)
    try:
        assert module.NAME == "helper"
        assert sys.modules[module.__name__] is module  # a step kind's class outlives the import
        assert sys.path == path_before
    finally:
        sys.modules.pop("kind_helper_um", None)
        sys.modules.pop(module.__name__, None)


def test_a_module_loaded_for_good_imports_the_projects_code_from_source_as_it_runs(tmp_path):
    """A step kind imports its helpers when it runs, after ``load`` returned."""
    helper = write(tmp_path / "lazy_um.py", "SCALE = 21.25\n")
    entry = write(tmp_path / "kind_um.py", "def scale():\n    from lazy_um import SCALE\n\n    return SCALE\n")
    compile_to_pycache(tmp_path, "lazy_um")
    edit_within_the_same_second(helper, "21.25", "21.75")
    module = usermodule.load(entry)
    sys.path.insert(0, str(tmp_path))  # where a kind's process finds its project
    try:
        assert module.scale() == 21.75
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("lazy_um", module.__name__):
            sys.modules.pop(name, None)
