"""Recipe references to Python callables (``"file.py:name"``), checked by reading the file.

A misspelled callable or keyword argument would otherwise surface only when its step runs,
in a worker, possibly after an hour of upstream builds. The file is parsed with ``ast``,
never imported nor run: loading a project must not execute user code, nor pay for torch.

Only what reading can decide is judged, and anything doubtful is accepted:

- a name is found when the module binds it anywhere at module level (``def``, ``class``,
  assignment, import, ``for`` / ``with`` / ``except`` targets, ``global`` in a function);
- any name is accepted when the module may create names at run time: ``from x import *``,
  ``globals()``, module-level ``locals()`` / ``vars()``, ``exec``, ``sys.modules``, or a
  module-level ``__getattr__``;
- arguments (unknown keywords, parameters left without a value) are checked only for a plain
  function: one undecorated ``def`` without positional-only parameters, the name's only
  binding; ``**kwargs`` takes any keyword. For ``Class.method`` only ``Class`` is checked.

A file that is missing or does not parse is left to the step (and to "file not found").
The parse is shared with optbuild.common.pyimports (which reads the same files for their
imports) and cached by the file's stat signature.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from optbuild.common.pyimports import Signature, file_signature, parsed


@dataclass(frozen=True)
class Call:
    """How a step calls a ``"file.py:name"`` parameter."""

    field: str  # the parameter naming the callable
    ref: str  # "path/to/file.py:name", relative to the recipe file
    # The names of the keyword arguments it is called with; None when the step does not say.
    keywords: tuple[str, ...] | None = None
    # The parameter holding them, e.g. "data_args"; None: it is called with no arguments.
    keywords_field: str | None = None


@dataclass(frozen=True)
class _Signature:
    keywords: tuple[str, ...]  # parameters a keyword argument can fill, in order
    required: tuple[str, ...]  # parameters without a default
    any_keyword: bool  # has **kwargs


@dataclass(frozen=True)
class _Module:
    # Every name bound at module level -> its signature when it is a plain function, else None.
    names: dict[str, _Signature | None]
    functions: tuple[str, ...]  # module-level ``def`` names, in source order
    dynamic: bool  # names may be made at run time: any name is accepted


def _signature(nodes: list[ast.AST]) -> _Signature | None:
    """The signature of a name bound only by ``nodes``, when that is one plain ``def``."""
    node = nodes[0]
    if len(nodes) != 1 or not isinstance(node, ast.FunctionDef) or node.decorator_list:
        return None
    args = node.args
    if args.posonlyargs:  # (x, /): what a keyword call says of them would mislead
        return None
    defaulted = {a.arg for a in args.args[len(args.args) - len(args.defaults):]} if args.defaults else set()
    required = [a.arg for a in args.args if a.arg not in defaulted]
    required += [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    keywords = [a.arg for a in (*args.args, *args.kwonlyargs)]
    return _Signature(tuple(keywords), tuple(required), args.kwarg is not None)


def _module_level(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes executed in module scope: not the bodies of functions, classes, lambdas."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _is_dynamic(tree: ast.Module, module_level: list[ast.AST]) -> bool:
    """Whether the module may bind names that reading cannot see (see the module's docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.Name) and node.id in ("globals", "exec"):
            return True
        if (isinstance(node, ast.Attribute) and node.attr == "modules"
                and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            return True
    return any(isinstance(node, ast.Name) and node.id in ("locals", "vars") for node in module_level) or any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__"
        for node in tree.body)


def _bound(node: ast.AST) -> list[str]:
    """The names ``node`` binds in the scope it runs in."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.partition(".")[0] for a in node.names]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


@lru_cache(maxsize=256)
def _read(path: Path, signature: Signature) -> _Module | None:
    """What ``path`` defines at module level; None when it cannot be read or parsed."""
    tree = parsed(path, signature)
    if tree is None:
        return None
    module_level = list(_module_level(tree.body))
    bindings: dict[str, list[ast.AST]] = {}
    for node in module_level:
        for name in _bound(node):
            bindings.setdefault(name, []).append(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):  # a function assigning a global defines it when called
            for name in node.names:
                bindings.setdefault(name, []).append(node)
    names = {name: _signature(nodes) for name, nodes in bindings.items()}
    functions = tuple(node.name for node in tree.body
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return _Module(names, functions, _is_dynamic(tree, module_level))


def _closest(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
    hint = difflib.get_close_matches(word, choices, n=1)
    return hint[0] if hint else None


def check(call: Call, base_dir: Path) -> list[tuple[tuple[str, ...], str]]:
    """What is certainly wrong with ``call``, as (parameter path, message) pairs; [] when it
    looks right or cannot be judged by reading."""
    file, _, name = call.ref.rpartition(":")
    path = (base_dir / file).resolve()
    if (stat := file_signature(path)) is None:
        return []
    module = _read(path, stat)
    if module is None or module.dynamic:
        return []
    head = name.partition(".")[0]
    if head not in module.names:
        public = [n for n in module.names if not n.startswith("__")]
        if (hint := _closest(head, public)) is not None:
            return [((call.field,), f"{file} defines no {head!r}; did you mean {hint!r}?")]
        listed = ", ".join(f for f in module.functions if not f.startswith("_")) or "none"
        return [((call.field,), f"{file} defines no {head!r} (its functions: {listed})")]
    signature = module.names[head]
    if signature is None or head != name or call.keywords is None:
        return []
    problems: list[tuple[tuple[str, ...], str]] = []
    if not signature.any_keyword:
        for keyword in call.keywords:
            if keyword in signature.keywords:
                continue
            where = (call.keywords_field or call.field, keyword)
            if (hint := _closest(keyword, signature.keywords)) is not None:
                problems.append((where, f"{name}() takes no argument {keyword!r}; did you mean {hint!r}?"))
            else:
                takes = (f"its arguments: {', '.join(signature.keywords)}" if signature.keywords
                         else "it takes none")
                problems.append((where, f"{name}() takes no argument {keyword!r} ({takes})"))
    if missing := [r for r in signature.required if r not in call.keywords]:
        listed = ", ".join(map(repr, missing))
        if (given_in := call.keywords_field) is not None:
            problems.append(((given_in,), f"{name}() needs {listed}: give it in {given_in}"))
        else:
            problems.append(((call.field,), f"{name}() is called with no arguments but needs {listed}"))
    return problems
