"""optbuild bench as a use case: build (or restore) the targets, then measure every ONNX / ORT
model on the backend that runs it, with PyTorch eager where a recipe exports from PyTorch (on
the CPU, and on CUDA where torch sees a GPU), interleaved in rounds; ``bench`` returns one
``RecipeBench`` per recipe and writes ``build/<recipe>/bench.json``. The CLI
(``optbuild.cli.bench``) parses its arguments and prints these results.

Modules, one concern each: ``targets`` (which steps give a model to bench), ``build`` (building
them and reading their verify figures), ``runners`` (inputs and the model or module runners),
``measure`` (the interleaved timing and the results), ``results`` (their types). Heavy
libraries load only while measuring.
"""

from optbuild.app.bench.measure import bench
from optbuild.app.bench.results import BenchError, BenchOptions, RecipeBench, Row

__all__ = ["BenchError", "BenchOptions", "RecipeBench", "Row", "bench"]
