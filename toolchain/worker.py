"""Model code's first import path for load_module and StageFailed, kept so model files need no edit:
toolchain.modelkit."""
from toolchain.modelkit import StageFailed, load_module

__all__ = ["StageFailed", "load_module"]
