"""optbuild: declarative, cached builds of ONNX and TensorRT model artifacts."""

__version__ = "0.1.0"
