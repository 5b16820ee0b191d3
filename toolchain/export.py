"""Model code's first import path for the export helper, kept so model files need no edit: toolchain.modelkit."""
from toolchain.modelkit import torch_to_onnx

__all__ = ["torch_to_onnx"]
