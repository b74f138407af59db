"""One module parses TOML (optbuild.common.tomlfile): the recipes, optbuild.toml, -S values
and the light readers of optbuild.toml's tables all go through it, so a file's size bound and
a parse error's file and line are the same everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_layering import PACKAGE, imported_modules

from optbuild.common import tomlfile


def test_tomlfile_is_the_only_importer_of_tomllib():
    importers = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                       for _line, module in imported_modules(path)
                       if module == "tomllib" or module.startswith("tomllib."))
    assert importers == ["optbuild/common/tomlfile.py"], importers


def test_tomlfile_stays_light():
    """The build server's client and completion read optbuild.toml through it at each
    command or TAB: the standard library and common/ only."""
    modules = {module for _line, module in imported_modules(PACKAGE / "common" / "tomlfile.py")}
    assert all(module.startswith("optbuild.common.") for module in modules if module.startswith("optbuild")), modules
    assert not {module.split(".")[0] for module in modules} & {"pydantic", "tomlkit", "toml"}


def test_a_parse_error_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[steps.a]\nkind = "export"\nkind = "again"\n')
    with pytest.raises(tomlfile.TomlError) as caught:
        tomlfile.load(path)
    assert (caught.value.file, caught.value.line) == (path, 3)


def test_a_file_over_the_size_bound_is_refused_unparsed(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("a = 1\n" + "# padding\n" * 20)  # 206 bytes
    assert tomlfile.load(path, max_bytes=206) == {"a": 1}
    with pytest.raises(tomlfile.TomlError, match="larger than"):
        tomlfile.load(path, max_bytes=100)


def test_config_table_is_none_for_an_unreadable_config_and_empty_for_a_missing_table(tmp_path):
    assert tomlfile.config_table(tmp_path, "build") is None  # no optbuild.toml
    (tmp_path / "optbuild.toml").write_text('[project]\nlock_file = "x.lock"\n')
    assert tomlfile.config_table(tmp_path, "build") == {}
    assert tomlfile.config_table(tmp_path, "project") == {"lock_file": "x.lock"}
    (tmp_path / "optbuild.toml").write_text("[project\n")
    assert tomlfile.config_table(Path(tmp_path), "project") is None
