"""Step kinds by name: the built-ins, third-party kinds from the entry point group
``optbuild.steps`` (name -> ``module:Class``), and project-local kinds that optbuild.toml
maps to ``path/to/file.py:Class``. Modules are imported only when used."""

from __future__ import annotations

import importlib
import warnings
from functools import cache
from pathlib import Path

from optbuild.common import plugins, usermodule
from optbuild.steps.base import Step, StepParams

ENTRY_POINT_GROUP = "optbuild.steps"

# "kind" or "kind/backend" -> "module:Class"
BUILTIN: dict[str, str] = {
    "onnx": "optbuild.steps.source:OnnxSource",
    "export": "optbuild.steps.export:Export",
    "simplify": "optbuild.steps.simplify:Simplify",
    "opset": "optbuild.steps.opset:Opset",
    "calibrate": "optbuild.steps.calibrate:Calibrate",
    "quantize": "optbuild.steps.quantize:Quantize",
    "verify": "optbuild.steps.verify:Verify",
    "benchmark": "optbuild.steps.benchmark:Benchmark",
    "engine/onnxruntime": "optbuild.steps.engine_ort:OrtEngine",
    "engine/tensorrt": "optbuild.steps.engine_trt:TensorRTEngine",
    "engine/tensorrt-rtx": "optbuild.steps.engine_trt:TensorRTRTXEngine",
    "engine/openvino": "optbuild.steps.engine_ov:OpenVINOEngine",
    "select": "optbuild.steps.select:Select",
    "deploy": "optbuild.steps.deploy:Deploy",
}


def known_kinds(local: dict[str, str] | None = None) -> list[str]:
    names = (*BUILTIN, *(local or {}), *plugins.declared(ENTRY_POINT_GROUP))
    return sorted({name.split("/")[0] for name in names})


def backends(kind: str, local: dict[str, str] | None = None) -> list[str]:
    prefix = f"{kind}/"
    names = (*BUILTIN, *(local or {}), *plugins.declared(ENTRY_POINT_GROUP))
    return sorted(name[len(prefix):] for name in names if name.startswith(prefix))


def resolve(kind: str, backend: str | None, local: dict[str, str] | None = None) -> str | None:
    """Registry name of a step's kind ("kind" or "kind/backend"), or None if unknown.

    Built-in and project-local kinds are found without scanning installed entry points
    (that scan costs more than the rest of a no-op build's lookups).
    """
    local = local or {}
    for name in (f"{kind}/{backend}" if backend else None, kind):
        if name and (name in BUILTIN or name in local):
            return name
    declared = plugins.declared(ENTRY_POINT_GROUP)
    for name in (f"{kind}/{backend}" if backend else None, kind):
        if name and name in declared:
            return name
    return None


def implementation_of(name: str, local: dict[str, str] | None = None) -> str:
    """Where kind ``name`` is implemented ("module:Class"); KeyError if nowhere."""
    implementation = ((local or {}).get(name) or BUILTIN.get(name)
                      or plugins.declared(ENTRY_POINT_GROUP).get(name))
    if implementation is None:
        raise KeyError(name)
    return implementation


@cache
def step_class(implementation: str) -> type[Step]:
    """Load a Step class from "module:Class" or "/abs/path/file.py:Class"."""
    module_name, _, attr = implementation.rpartition(":")
    if module_name.endswith(".py"):
        with warnings.catch_warnings():  # shown: the kind's author learns that an import path goes
            warnings.filterwarnings("default", r"optbuild\.", DeprecationWarning)
            module = usermodule.load(Path(module_name))  # ImportFailed, an ImportError, if it raises
    else:
        module = importlib.import_module(module_name)
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise TypeError(f"{implementation} is not an optbuild Step subclass")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, StepParams)):
        found = f"{attr} has no Params" if params is None else f"{attr}.Params is {params!r}"
        raise TypeError(f"{found}: a kind names the model of its parameters, a subclass of "
                        "optbuild.plugin.StepParams (`Params = StepParams` for a kind without any)")
    return cls
