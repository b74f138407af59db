"""Runtimes that execute built artifacts, as opposed to the steps that build them.

A step that must *run* what another step built (the engine step's load-and-infer check, a
verify step whose candidate is an engine) goes through a backend here, so that loading and
running an engine is written once. Like the steps, nothing heavy is imported at module
level: TensorRT, cuda-python and numpy are imported inside the functions that use them.
"""

from optbuild.backends import probes as _probes

_probes.register_builtin()  # the runtimes' fingerprint sections (see probes)
