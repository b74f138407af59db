"""optbuild.common.pyimports.local_imports: the project-local files a model file imports, by reading."""

from __future__ import annotations

from pathlib import Path

from plugins.steps import MODELS, REPO

from optbuild.common.pyimports import local_imports


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def found(entry: Path, root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in local_imports(entry, root)]


def test_the_example_models_import_the_shared_blocks_module():
    assert local_imports(MODELS / "cnn.py", REPO) == [MODELS / "blocks.py", MODELS / "calib.py"]  # fitted to its scenes
    assert local_imports(MODELS / "transformer.py", REPO) == [MODELS / "blocks.py"]


def test_import_of_a_dotted_name_brings_each_package_init(tmp_path):
    write(tmp_path, {"entry.py": "import os\nimport numpy\nimport pkg.sub.leaf as leaf\n",
                     "pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/leaf.py": "",
                     "pkg/unused.py": ""})
    assert found(tmp_path / "entry.py", tmp_path) == ["pkg/__init__.py", "pkg/sub/__init__.py",
                                                      "pkg/sub/leaf.py"]


def test_from_import_finds_submodules_but_not_attributes(tmp_path):
    write(tmp_path, {"entry.py": "from pkg import layers, CONSTANT\nfrom helpers import util\n",
                     "pkg/__init__.py": "CONSTANT = 1\n", "pkg/layers.py": "", "pkg/other.py": "",
                     "helpers.py": "def util(): pass\n", "util.py": "# not imported: util is an attribute\n"})
    assert found(tmp_path / "entry.py", tmp_path) == ["pkg/__init__.py", "pkg/layers.py", "helpers.py"]


def test_relative_imports_resolve_against_the_importing_package(tmp_path):
    write(tmp_path, {
        "entry.py": "from models import net\n",
        "models/__init__.py": "",
        "models/net.py": "from . import layers\nfrom .heads import Head\nfrom ..common import io\n",
        "models/layers.py": "from ..common.maths import fma\n",
        "models/heads.py": "class Head: pass\n",
        "common/__init__.py": "", "common/io.py": "", "common/maths.py": "",
    })
    result = found(tmp_path / "entry.py", tmp_path)
    assert set(result) == {"models/__init__.py", "models/net.py", "models/layers.py", "models/heads.py",
                           "common/__init__.py", "common/io.py", "common/maths.py"}
    assert result[:2] == ["models/__init__.py", "models/net.py"]  # breadth first, source order


def test_the_entry_directory_comes_before_the_project_root(tmp_path):
    write(tmp_path, {"models/entry.py": "import blocks\nimport shared\n", "models/blocks.py": "",
                     "blocks.py": "# shadowed by models/blocks.py\n", "shared.py": ""})
    assert found(tmp_path / "models/entry.py", tmp_path) == ["models/blocks.py", "shared.py"]


def test_files_outside_the_root_are_ignored(tmp_path):
    write(tmp_path, {"proj/sub/entry.py": "import helper\nimport inside\n", "proj/sub/inside.py": "",
                     "proj/sub/helper.py": "import outside\n", "outside.py": ""})
    # the root is proj/sub: helper and inside are in it; tmp_path/outside.py is not
    assert found(tmp_path / "proj/sub/entry.py", tmp_path / "proj/sub") == ["helper.py", "inside.py"]
    write(tmp_path, {"proj/entry.py": "import sibling\n", "proj/sibling.py": ""})
    assert local_imports(tmp_path / "proj/entry.py", tmp_path / "proj/sub") == []


def test_cycles_end_and_nothing_repeats(tmp_path):
    write(tmp_path, {"entry.py": "import a\nimport b\nimport a\n",
                     "a.py": "import b\nimport entry\n", "b.py": "from a import x\nimport a\n"})
    assert found(tmp_path / "entry.py", tmp_path) == ["a.py", "b.py"]


def test_imports_anywhere_in_a_file_count_and_literal_import_module_calls(tmp_path):
    write(tmp_path, {
        "entry.py": ("import importlib\n"
                     "def build():\n    from late import thing\n    return thing\n"
                     "try:\n    import optional\nexcept ImportError:\n    optional = None\n"
                     "plugin = importlib.import_module('plugins.fancy')\n"
                     "dynamic = importlib.import_module('plugins.' + 'other')\n"),
        "late.py": "", "optional.py": "", "plugins/__init__.py": "", "plugins/fancy.py": "",
        "plugins/other.py": "# a computed name cannot be followed\n",
    })
    assert found(tmp_path / "entry.py", tmp_path) == ["late.py", "optional.py", "plugins/__init__.py",
                                                      "plugins/fancy.py"]


def test_a_file_with_a_syntax_error_is_listed_but_not_followed(tmp_path):
    write(tmp_path, {"entry.py": "import broken\nimport fine\n",
                     "broken.py": "import hidden\ndef oops(:\n", "hidden.py": "", "fine.py": ""})
    assert found(tmp_path / "entry.py", tmp_path) == ["broken.py", "fine.py"]
    (tmp_path / "binary.py").write_bytes(b"\xff\xfe\x00 not python")
    write(tmp_path, {"entry2.py": "import binary\n"})
    assert found(tmp_path / "entry2.py", tmp_path) == ["binary.py"]


def test_sources_are_read_never_run(tmp_path):
    marker = tmp_path / "ran"
    write(tmp_path, {"entry.py": f"open({str(marker)!r}, 'w').close()\nimport side\n",
                     "side.py": f"open({str(marker)!r}, 'w').close()\nraise SystemExit(1)\n"})
    assert found(tmp_path / "entry.py", tmp_path) == ["side.py"]
    assert not marker.exists()


def test_package_beats_module_and_namespace_packages_work(tmp_path):
    write(tmp_path, {"entry.py": "import dual\nimport ns.mod\nfrom ns import other\n",
                     "dual/__init__.py": "", "dual.py": "# a package of the same name wins\n",
                     "ns/mod.py": "", "ns/other.py": ""})
    assert found(tmp_path / "entry.py", tmp_path) == ["dual/__init__.py", "ns/mod.py", "ns/other.py"]


def test_the_order_is_deterministic(tmp_path):
    files = {"entry.py": "import c\nimport a\nimport b\n", "a.py": "import d\n", "b.py": "",
             "c.py": "import d\n", "d.py": ""}
    write(tmp_path, files)
    first = found(tmp_path / "entry.py", tmp_path)
    assert first == ["c.py", "a.py", "b.py", "d.py"]
    assert all(found(tmp_path / "entry.py", tmp_path) == first for _ in range(3))
