"""What TensorRT and TensorRT-RTX report about this host: the version and distribution of
each that ``import`` loads ("tensorrt", "tensorrt_rtx" sections), from metadata, without
importing them. What a GPU can run is read from the host's GPU sections (``host``)."""

from __future__ import annotations

from optbuild.backends.base import Sections, distribution_section
from optbuild.backends.tensorrt import RUNTIMES

SECTIONS: Sections = {
    runtime.module: (distribution_section(runtime.module), {
        f"{runtime.module}.version": runtime.label,
        f"{runtime.module}.distribution": f"{runtime.label} distribution"})
    for runtime in RUNTIMES.values()
}
