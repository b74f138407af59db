"""kind = "calibrate": activation ranges of an ONNX model over calibration data.

The model runs on onnxruntime (CPU) over the samples of ``data`` (an .npz file, a folder of
.npy files, or ``file.py:callable`` yielding feed dicts: see optbuild.model.samples), and
onnxruntime.quantization's calibrator for ``method`` (minmax, entropy, percentile) reduces
what it sees to one range per tensor. The data files (or the callable's file and the
project-local modules it imports) enter the key, with the model's content and the params.

The artifact is a portable calibration table, ``calibration.json`` (UTF-8 JSON)::

    {
      "format": "optbuild.calibration",       # what this file is
      "version": 1,                            # bumped on incompatible changes
      "method": "minmax",                      # minmax | entropy | percentile
      "symmetric": false,                      # ranges asked symmetric around 0 (percentile
                                               # still clips each side to what it observed)
      "options": {...},                        # the method's settings as used (bins, percentile)
      "samples": 64,                           # feeds run through the model
      "rows": 64,                              # samples counted along the batch axis
      "data": "models/calib.py:tokens",        # the data source, as the recipe names it
      "model": {
        "digest": "<BLAKE3-256 of the calibrated model file>",
        "inputs": {"tokens": {"dtype": "int64", "shape": ["batch", 32]}}
      },
      "onnxruntime": "1.32.0",                 # the calibrator's version
      "tensors": {                             # tensor name -> [min, max], sorted by name
        "/embed/Gather_output_0": [-3.71, 3.52],
        ...
      }
    }

Ranges are float32 values written as JSON numbers (exact when read back as float32). Only
"format", "version", "method" and "tensors" are needed to use a table; the rest is
provenance. quantize (mode = "static") reads it and never re-runs the model.

Tensors with no elements (the empty ``roi`` Constant that paddle2onnx gives a Resize) have
no range: they are left out of the table, and logged. Shape inference finds them (a dim of
size 0), or minmax at run time ([inf, -inf]: no value seen); the histogram methods would
make up ranges for them, such as [0, 0].

Constant node tensors are not calibrated (logged): they are weights, not activations, which
quantize makes initializers and scales from their values. The ``-inf`` fill of
``masked_fill(mask == 0, -inf)`` is such a Constant; it failed calibration as a tensor with no
finite value.

A tensor whose range has an infinite end is not taken for a broken model when it also holds
finite values: an additive attention mask adds -inf (or a large negative constant that
overflows to it) to the scores it hides, by design. Such a tensor is run once more over the
samples, and its infinite end replaced by the end of its finite values (logged: quantized,
the masked scores saturate there, and a Softmax gives them weight; the log names the nodes
that read the tensor, to keep float with quantize's ``nodes_to_exclude`` if verify says that
hurts; quantize does so itself where the infinity comes from a constant fill). NaN, or no
finite value at all, is still an error.

Hardware: ranges come from float32 CPU kernels; CPUs with other vector units may differ in
the last bits, which does not matter for a range, so the key holds no host field.

Note on entropy: onnxruntime's default histogram (num_bins = num_quantized_bins = 128) leaves
no room to clip, so its ranges equal minmax's; raise ``num_bins`` (e.g. 512, 2048) to make
entropy clip outliers. Its threshold search is written in Python: about 1 s per tensor at
2048 bins.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from optbuild.backends.onnxruntime import distribution as ort_distribution
from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import StepRef
from optbuild.model.onnxgraph import all_nodes, constants_to_initializers
from optbuild.model.samples import DataArg, non_default
from optbuild.steps import fields
from optbuild.steps.base import ONNX_TOOLS, StepContext, StepParams

TABLE_FORMAT = "optbuild.calibration"
TABLE_VERSION = 1
TABLE_FILE = "calibration.json"

_METHOD_OPTIONS = {
    "percentile": ("percentile",),
    "entropy": ("num_quantized_bins",),
    "minmax": ("moving_average", "averaging_constant"),
}
_HISTOGRAM = ("entropy", "percentile")
ENTROPY_BINS = 128  # onnxruntime's num_bins for entropy


class CalibrateParams(StepParams):
    input: StepRef = fields.input_field("calibrated (quantize this same model: the table is matched to "
                                        "it by tensor name).")
    data: fields.DataSource = fields.data_field("Calibration samples")
    data_args: dict[str, DataArg] = fields.data_args_field()
    samples: int | None = fields.samples_field("Use at most this many samples (feed dicts) of data. Not "
                                               "set: all of them (a data callable must then end).")
    method: Literal["minmax", "entropy", "percentile"] = Field("minmax", examples=["percentile"])
    """How observed values become one [min, max] range per tensor: 'minmax' (the extremes seen),
    'entropy' (the range that minimizes KL divergence of the quantized histogram; give num_bins
    more than num_quantized_bins, else its ranges are minmax's, with a warning in the log) or
    'percentile' (clips the tails at `percentile`). An infinite end of a range (an additive
    attention mask's -inf) is replaced by the end of the tensor's finite values, and logged;
    NaN, or a tensor with no finite value, fails."""
    symmetric: bool | None = Field(None, examples=[True])
    """Ask for ranges symmetric around 0, (-m, m). Not set: onnxruntime's default (true for
    percentile, false for minmax and entropy)."""
    op_types: list[str] = Field([], examples=[["Conv", "MatMul", "Gemm"]])
    """Calibrate only the inputs and outputs of nodes of these ONNX op types. Empty: every float
    tensor."""
    percentile: float = Field(99.999, gt=50, le=100, examples=[99.99])
    """percentile only: the percentile (50 < p <= 100) of |x| (symmetric) or of each tail that
    bounds the range."""
    num_bins: int | None = Field(None, ge=16, le=65536, examples=[2048])
    """entropy and percentile only: histogram bins (16 to 65536). Not set: onnxruntime's
    (entropy 128, percentile 2048). For entropy to clip outliers, give more than
    num_quantized_bins (e.g. 512 or 2048)."""
    num_quantized_bins: int = Field(128, ge=16, le=65536, examples=[256])
    """entropy only: bins of the quantized histogram the search compares with (16 to 65536, at
    most num_bins)."""
    moving_average: bool = Field(False, examples=[True])
    """minmax only: a moving average of the per-sample minima and maxima instead of the overall
    extremes."""
    averaging_constant: float = Field(0.01, gt=0, lt=1, examples=[0.1])
    """minmax with moving_average = true: the averaging weight of each new sample (0 < c <
    1)."""

    @model_validator(mode="after")
    def _method_options(self) -> CalibrateParams:
        for method, names in _METHOD_OPTIONS.items():
            foreign = non_default(self, names) if method != self.method else []
            if foreign:
                raise ValueError(f"{', '.join(map(repr, foreign))} only apply to method {method!r}, "
                                 f"not {self.method!r}")
        if non_default(self, ["num_bins"]) and self.method not in _HISTOGRAM:
            raise ValueError(f"'num_bins' only applies to methods 'entropy' and 'percentile', "
                             f"not {self.method!r}")
        if non_default(self, ["averaging_constant"]) and not self.moving_average:
            raise ValueError("'averaging_constant' needs moving_average = true")
        if self.method == "entropy" and (self.num_bins or ENTROPY_BINS) < self.num_quantized_bins:
            raise ValueError(f"entropy needs num_bins >= num_quantized_bins ({self.num_bins or ENTROPY_BINS} < "
                             f"{self.num_quantized_bins})")
        if self.data_args and ".py:" not in self.data:
            raise ValueError("'data_args' only apply to a 'file.py:callable' data source")
        return self


class Calibrate(fields.DataSourceStep[CalibrateParams]):
    """Activation ranges of an ONNX model over calibration data, as a portable calibration.json."""

    # 2: an infinite end of a range is bounded by the finite values (failed before); 3: Constant
    # node tensors are not calibrated (a -inf fill failed before)
    version = "3"
    Params = CalibrateParams
    preload = ONNX_TOOLS
    primary_output = TABLE_FILE

    def tool_names(self) -> tuple[str, ...]:
        return ("onnx", ort_distribution(), "numpy")

    def _ort_options(self) -> dict[str, Any]:
        p = self.params
        options: dict[str, Any] = {}
        if p.symmetric is not None:
            options["symmetric"] = p.symmetric
        if p.method == "minmax":
            options.update(moving_average=p.moving_average, averaging_constant=p.averaging_constant)
        if p.method in _HISTOGRAM and p.num_bins is not None:
            options["num_bins"] = p.num_bins
        if p.method == "entropy":
            options["num_quantized_bins"] = p.num_quantized_bins
        if p.method == "percentile":
            options["percentile"] = p.percentile
        return options

    def _symmetric(self) -> bool:
        """Whether the ranges are symmetric around 0 (onnxruntime's default: percentile only)."""
        p = self.params
        return bool(p.symmetric if p.symmetric is not None else p.method == "percentile")

    def run(self, ctx: StepContext) -> None:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator

        from optbuild.common.digest import hash_file
        from optbuild.model import samples as sampling
        from optbuild.steps.rewrite_check import reference_runner

        p = self.params
        model = ctx.onnx_input("calibrate")
        try:
            with reference_runner(model, ctx.host) as runner:
                specs = runner.input_specs()
        except Exception as exc:
            raise StepError(f"onnxruntime cannot load {ctx.inputs['input'].step}: {exc}") from None
        samples = sampling.load_samples(p.data, ctx.base_dir, specs, args=p.data_args, limit=p.samples)
        ctx.log(f"calibrating with {len(samples)} samples from {samples.source}, method {p.method}")
        if p.method == "entropy" and (p.num_bins or ENTROPY_BINS) == p.num_quantized_bins:
            ctx.log(f"warning: method = 'entropy' with num_bins = num_quantized_bins = {p.num_quantized_bins} "
                    "leaves no room to clip, so its ranges are minmax's: set num_bins larger in the step's "
                    "table (e.g. num_bins = 2048)")

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._feeds = enumerate(samples.feeds, 1)

            def get_next(self):
                n, feed = next(self._feeds, (0, None))
                if feed is not None:
                    ctx.progress(f"calibrating sample {n} of {len(samples.feeds)}")
                return feed

        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile}[p.method]
        with tempfile.TemporaryDirectory(prefix="optbuild-calib-") as tmp:
            try:
                calibrator = create_calibrator(
                    _constants_as_initializers(ctx, model), p.op_types or None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                    calibrate_method=method, extra_options=self._ort_options())
                calibrator.collect_data(Reader())
                ranges = calibrator.compute_data()
            except StepError:
                raise
            except Exception as exc:
                hint = ("; a tensor holds infinity (an additive attention mask's -inf?), which onnxruntime's "
                        "histograms cannot take: use method = 'minmax', which bounds it by the tensor's "
                        "finite values, or op_types that leave it out"
                        if p.method in _HISTOGRAM and "is not finite" in str(exc) else "")
                raise StepError(f"calibration ({p.method}) failed on {ctx.inputs['input'].step}: "
                                f"{type(exc).__name__}: {exc}{hint}") from exc
        tensors, empty, unbounded = _table_ranges(ranges, _empty_tensors(ctx, model))
        if unbounded:
            tensors.update(_bounded(ctx, model, unbounded, samples.feeds, symmetric=self._symmetric()))
            tensors = dict(sorted(tensors.items()))
        if empty:
            ctx.log(f"left out of the table: {len(empty)} tensor(s) with no elements, so no range: "
                    f"{', '.join(empty)}")
        if not tensors:
            raise StepError(f"calibration found no float tensors to calibrate"
                            f"{' of op types ' + ', '.join(p.op_types) if p.op_types else ''}")
        from importlib.metadata import version

        table = {
            "format": TABLE_FORMAT,
            "version": TABLE_VERSION,
            "method": p.method,
            "symmetric": self._symmetric(),
            "options": {k: v for k, v in self._ort_options().items() if k != "symmetric"},
            "samples": len(samples),
            "rows": samples.rows,
            "data": p.data,
            "model": {
                "digest": hash_file(model)[0],
                "inputs": {s.name: {"dtype": s.dtype, "shape": list(s.shape)} for s in specs},
            },
            "onnxruntime": version(ort_distribution()),
            "tensors": tensors,
        }
        (ctx.out_dir / TABLE_FILE).write_text(json.dumps(table, indent=1, allow_nan=False) + "\n")
        ctx.metrics.update(method=p.method, samples=len(samples), tensors=len(tensors), empty_tensors=empty)
        ctx.log(f"{len(tensors)} tensor ranges from {len(samples)} samples")


def _constants_as_initializers(ctx: StepContext, model: Path) -> Path:
    """A private copy of ``model`` whose Constant node tensors are initializers, which
    onnxruntime's calibrators leave out. quantize makes them initializers too and quantizes
    them as weights, from their values: a range would never be read, and the -inf fill of
    ``masked_fill(mask == 0, -inf)`` failed calibration as a tensor with no finite value."""
    import onnx

    copy = ctx.private_copy(model)
    proto = onnx.load(str(copy), load_external_data=False)
    moved = constants_to_initializers(proto.graph, nested=True)
    if moved:
        ctx.log(f"{moved} Constant node tensor(s) left out of calibration: they are weights, not "
                f"activations (quantize makes them initializers and takes their scales from their values)")
        copy.unlink()  # a hard link to the upstream file: write a new file, never through it
        onnx.save(proto, str(copy))
    return copy


def _empty_tensors(ctx: StepContext, model: Path) -> set[str]:
    """Tensors of ``model``'s graph that shape inference gives a dim of size 0: they hold no
    element whatever the input, so no range."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(onnx.load(str(model)))
    except Exception as exc:
        ctx.log(f"shape inference failed ({first_line(exc)}): only tensors minmax saw no value of "
                "are known to be empty")
        return set()
    return {v.name for v in (*inferred.graph.value_info, *inferred.graph.output)
            if v.type.tensor_type.HasField("shape")
            and any(d.HasField("dim_value") and d.dim_value == 0 for d in v.type.tensor_type.shape.dim)}


def _table_ranges(ranges: Any, empty: set[str]) -> tuple[dict[str, list[float]], list[str],
                                                        dict[str, tuple[float, float]]]:
    """TensorsData -> ({name: [min, max]} of Python floats (float32 values), sorted by name;
    the names left out because they hold no element: in ``empty``, or minmax saw no value;
    {name: (min, max)} of the ranges with an infinite end, for ``_bounded``)."""
    import math

    import numpy as np

    tensors, left_out, unbounded = {}, [], {}
    for name in sorted(ranges.keys()):
        low, high = ranges[name].range_value
        low, high = np.asarray(low, dtype=np.float32).reshape(-1), np.asarray(high, dtype=np.float32).reshape(-1)
        if low.size != 1 or high.size != 1:
            raise StepError(f"tensor {name!r} got a per-channel range; the table holds one range per tensor")
        lo, hi = float(low[0]), float(high[0])
        if name in empty or (lo == math.inf and hi == -math.inf):
            left_out.append(name)
            continue
        if math.isnan(lo) or math.isnan(hi):
            raise StepError(f"tensor {name!r} has a range [{lo}, {hi}]: the model produces NaN on the "
                            "calibration data")
        if math.isinf(lo) or math.isinf(hi):
            unbounded[name] = (lo, hi)
            continue
        tensors[name] = [lo, hi]
    return tensors, left_out, unbounded


def _bounded(ctx: StepContext, model: Path, unbounded: dict[str, tuple[float, float]],
             feeds: list[dict[str, Any]], *, symmetric: bool) -> dict[str, list[float]]:
    """The ranges of ``unbounded`` with each infinite end replaced by the end of the tensor's
    finite values over ``feeds`` (an additive attention mask's -inf is a mask working as
    meant); StepError for a tensor with NaN or no finite value."""
    import numpy as np
    import onnx

    from optbuild.backends.onnxruntime.loader import session as ort_session

    proto = onnx.load(str(model))
    known = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in unbounded if name not in known)
    session = ort_session(proto.SerializeToString(), level="disable")
    names = list(unbounded)
    low = dict.fromkeys(names, np.inf)
    high = dict.fromkeys(names, -np.inf)
    for feed in feeds:
        for name, values in zip(names, session.run(names, feed)):
            if np.isnan(values).any():
                raise StepError(f"tensor {name!r} holds NaN on the calibration data")
            finite = values[np.isfinite(values)]
            if finite.size:
                low[name], high[name] = min(low[name], finite.min()), max(high[name], finite.max())
    tensors = {}
    for name, (lo, hi) in unbounded.items():
        if low[name] > high[name]:
            raise StepError(f"tensor {name!r} has a non-finite range [{lo}, {hi}] and no finite value: "
                            "the model produces only infinity on the calibration data")
        bounded = [lo if np.isfinite(lo) else float(np.float32(low[name])),
                   hi if np.isfinite(hi) else float(np.float32(high[name]))]
        if symmetric:
            end = max(abs(bounded[0]), abs(bounded[1]))
            bounded = [-end, end]
        readers = [n.name for n in all_nodes(proto.graph) if name in n.input and n.name]
        ctx.log(f"tensor {name!r}: range [{lo}, {hi}] holds infinity (an additive attention mask's "
                f"-inf?); its finite values give [{bounded[0]:.6g}, {bounded[1]:.6g}], kept in the table "
                f"(quantized, the infinite values saturate there, and a Softmax then gives the masked "
                f"places weight: if verify fails, keep the nodes that read it float, nodes_to_exclude = "
                f"{readers!r} on the quantize step)")
        tensors[name] = bounded
    return tensors


def read_table(path: Path, step: str) -> dict[str, Any]:
    """A calibration table, checked: StepError when ``path`` is not one this version reads."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StepError(f"{step} gives no readable calibration table: {exc}") from None
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise StepError(f"{step} is not a calibrate step: its output {Path(path).name} is not an "
                        "optbuild calibration table")
    if table.get("version") != TABLE_VERSION:
        raise StepError(f"{step}: calibration table version {table.get('version')} is not supported "
                        f"(this optbuild reads version {TABLE_VERSION})")
    tensors = table.get("tensors")
    if not isinstance(tensors, dict) or table.get("method") not in ("minmax", "entropy", "percentile") or any(
            not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v))
            for v in tensors.values()):
        raise StepError(f"{step}: malformed calibration table (needs 'method' and 'tensors': "
                        "name -> [min, max])")
    return table
