"""The build's API for a model's own code (models/<name>.py): the only toolchain names model code needs.

    from toolchain.modelkit import StageFailed, load_module, read_wav, sherpa_whisper, torch_to_onnx

- torch_to_onnx(module, args, out, inputs, outputs, settings): what a model's export() calls to write its graph
  (torch.onnx with the spec's exporter and opset, external data folded in).
- load_module(path): import another model file by path (a model built on a second one's code).
- StageFailed: raise it with one line for the user (a bad clip, a missing package); no traceback is shown.
- read_wav(path, rate=16000): mono float32 samples of a PCM WAV, with the standard library (libsndfile
  segfaults in a process that has loaded the QNN HTP libraries: every verify step).
- sherpa_whisper: sherpa-onnx's QNN Whisper host loop (GraphRun, recognize, read_tokens, detokenize,
  parse_prefix), for a model that builds sherpa-onnx's Whisper contract.

docs/add-a-model.md shows a model file that uses them. The names model code imported before this module
(toolchain.export, toolchain.worker, toolchain.audio, toolchain.sherpa_whisper) are plain re-exports of it."""
from __future__ import annotations

from toolchain.deploy import sherpa_whisper
from toolchain.engine.worker import load_module
from toolchain.errors import StageFailed
from toolchain.shared.audio import read_wav
from toolchain.stages.export import torch_to_onnx

__all__ = ["StageFailed", "load_module", "read_wav", "sherpa_whisper", "torch_to_onnx"]
