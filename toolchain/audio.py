"""Model code's first import path for the WAV reader, kept so model files need no edit: toolchain.modelkit."""
from toolchain.modelkit import read_wav

__all__ = ["read_wav"]
