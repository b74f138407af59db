"""The package's layers (docs/architecture.md): each package imports only from its own layer
and the layers below it, anywhere in a module (inside functions and TYPE_CHECKING blocks
too), so there is no circle and nothing low reaches back up. Lowest first."""

from __future__ import annotations

import ast
from pathlib import Path

import optbuild

PACKAGE = Path(optbuild.__file__).resolve().parent
LAYERS = [
    "common",  # errors, digests, atomic files, paths, fingerprint, signatures, recipe tables...
    "store",  # the local and remote caches: blobs, entries, locks
    "backends",  # runtimes: how to load and run a model on onnxruntime, TensorRT, OpenVINO
    "model",  # input declarations, samples, comparison, timing
    "steps",  # the step kinds
    "plugin",  # the stable API for writing step kinds (a module at the top, like api)
    "project",  # optbuild.toml and the recipes, validated into step specs; the graph
    "process",  # where a step runs: child process, spec, fork servers, pool
    "builder",  # keys, the executor, outputs, lock file, statuses, reports
    "distributed",  # the Dask backend and build nodes
    "api",  # the Python API the CLI calls
    "app",  # the CLI's other use cases over a workspace (cache gc, push, pull, ...), typed results
    "cli",  # the commands, the no-op fast path, the build server
]
TOP_LEVEL = {"__init__", "__main__", "api", "plugin"}  # every other module lives in a package
# Deprecated aliases of modules that moved into packages, for one release: a step kind written
# against the old path still loads, warned to import from optbuild.plugin. Old path -> new.
DEPRECATED = {"errors": "optbuild.common.errors", "pyimports": "optbuild.common.pyimports"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it (functions and TYPE_CHECKING blocks
    included), as (line, absolute name)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found += [(node.lineno, f"{module}.{alias.name}") if module.count(".") <= 1
                      else (node.lineno, module) for alias in node.names]
    return found


def layer_of(module: str) -> int | None:
    """The layer of ``optbuild.X...`` (None for optbuild itself and its version)."""
    parts = module.split(".")
    if parts[0] != "optbuild" or len(parts) < 2 or parts[1] in ("__init__", "__main__", "__version__"):
        return None
    if parts[1] in DEPRECATED:  # the alias of a module of common; no module of ours imports one (below)
        return LAYERS.index("common")
    return LAYERS.index(parts[1])


def test_every_module_lives_in_a_package_of_one_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert modules == TOP_LEVEL | set(DEPRECATED), sorted(modules ^ (TOP_LEVEL | set(DEPRECATED)))
    assert packages == set(LAYERS) - TOP_LEVEL, sorted(packages ^ (set(LAYERS) - TOP_LEVEL))


def test_no_package_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        own = layer_of(".".join(relative.parts))
        if own is None:
            continue
        for line, module in imported_modules(path):
            target = layer_of(module)
            if target is not None and target > own:
                upward.append(f"{relative}.py:{line} ({LAYERS[own]}) imports {module} ({LAYERS[target]})")
    assert not upward, "\n".join(upward)


def test_a_deprecated_alias_only_re_exports_its_new_module_and_nothing_of_ours_imports_one():
    """The aliases are for projects' kinds: optbuild's own code imports the new path (an
    internal import would warn at every user's build), and an alias imports nothing of optbuild
    but the module it stands for."""
    for old, new in DEPRECATED.items():
        ours = {module for _line, module in imported_modules(PACKAGE / f"{old}.py") if module.startswith("optbuild")}
        assert ours == {new}, (old, ours)
    aliases = {f"optbuild.{old}" for old in DEPRECATED}
    importing = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line, module in imported_modules(path)
                 if module in aliases or module.rpartition(".")[0] in aliases]
    assert not importing, importing


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The check above would pass vacuously if the walk missed imports; it does not."""
    sample = PACKAGE / "store" / "remote" / "session.py"
    modules = {module for _line, module in imported_modules(sample)}
    assert "optbuild.store.local" in modules  # under TYPE_CHECKING
    assert "concurrent.futures.ThreadPoolExecutor" in modules  # inside a function
    assert "optbuild.store.entry" in modules


def test_the_flock_helper_is_the_only_caller_of_flock():
    """One file-locking helper: the cache's locks, optbuild.lock's lock and the build server's
    lock file all use it."""
    callers = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                     if "fcntl.flock(" in path.read_text())
    assert callers == ["optbuild/common/flock.py"], callers


def test_builders_see_a_context_never_the_scheduler():
    """The Dask builder and the node import nothing from the scheduler (builder/scheduler.py),
    nor does the local builder: each gets a BuildContext (builder/site.py)."""
    reaching = [f"{path.relative_to(PACKAGE.parent)}:{line}"
                for path in [*(PACKAGE / "distributed").glob("*.py"), PACKAGE / "builder" / "local.py",
                             PACKAGE / "builder" / "site.py"]
                for line, module in imported_modules(path) if module.startswith("optbuild.builder.scheduler")]
    assert not reaching, reaching


def test_one_place_starts_a_step_process():
    """process/runstep.py is where a step runs, for the local builder and a Dask node alike:
    no other module starts a step's process from the pool."""
    starters = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                      if "pool.start(" in path.read_text() or "workers.start(" in path.read_text())
    assert starters == ["optbuild/process/runstep.py"], starters


def test_no_module_imports_itself_back_through_others():
    """No circle among modules either, within a package (a layer may import itself): the
    runtime probes once imported their registry, which imported them."""
    import networkx as nx

    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        for target in _imported_files(path, modules):
            if target != name and not name.startswith(target + "."):  # a package's face importing its modules
                graph.add_edge(name, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles


def _imported_files(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports: ``from a.b import c`` names a.b.c
    when that is a module, else a.b."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            names = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                     for alias in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


# The CLI parses arguments and prints what optbuild.api and optbuild.app return: each import
# from cli/ into a layer below them is a use case a Python user cannot reach (84 before
# optbuild.app took the cache's and deploy's use cases; issue 32's target was 15). The three
# left are on purpose: the process pool and the fork server start before optbuild.api loads
# (cli/build.py, cli/buildserver/session.py), and `optbuild fingerprint` registers the runtimes'
# sections (cli/fingerprint.py). It must not grow back.
CLI_IMPORTS_BELOW_THE_API = 3
BELOW_THE_API = ["store", "backends", "model", "steps", "project", "process", "builder", "distributed"]


def cli_imports_below_the_api() -> dict[str, list[str]]:
    """Per lower layer, every import of it from cli/ ("path:line module"); common/ is not counted."""
    found: dict[str, list[str]] = {layer: [] for layer in BELOW_THE_API}
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        for line, module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "optbuild" and len(parts) > 1 and parts[1] in found:
                found[parts[1]].append(f"{path.relative_to(PACKAGE.parent)}:{line} {module}")
    return found


def test_the_cli_reaches_below_the_api_no_more_than_it_did():
    found = cli_imports_below_the_api()
    total = sum(map(len, found.values()))
    assert total <= CLI_IMPORTS_BELOW_THE_API, "\n".join(i for imports in found.values() for i in imports)


def test_optbuild_cache_only_parses_and_prints():
    """`optbuild cache` calls optbuild.app for every action: nothing of it imports a lower layer."""
    found = cli_imports_below_the_api()
    reaching = [i for imports in found.values() for i in imports if i.startswith("optbuild/cli/cache.py:")]
    assert not reaching, reaching


MAX_MODULE_LINES = 500  # one module, one concern: a longer one holds more than one


def test_no_module_is_longer_than_one_concern_needs():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long
