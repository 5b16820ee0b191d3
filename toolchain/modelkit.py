"""The build's API for a model's own code (models/<name>.py): the only toolchain names
model code needs.

    from toolchain.modelkit import StageFailed, load_module, read_wav, sherpa_whisper, torch_to_onnx

- torch_to_onnx(module, args, out, inputs, outputs, settings): what a model's export() calls to
write its graph
  (torch.onnx with the spec's exporter and opset, external data folded in).
- load_module(path): import another model file by path (a model built on a second one's code).
- StageFailed: raise it with one line for the user (a bad clip, a missing package); no
traceback is shown. - read_wav(path, rate=16000): mono float32 samples of a PCM WAV, with the
standard library (libsndfile
  segfaults in a process that has loaded the QNN HTP libraries: every verify step).
- sherpa_whisper: sherpa-onnx's QNN Whisper host loop (GraphRun, recognize, read_tokens, detokenize,
  parse_prefix), for a model that builds sherpa-onnx's Whisper contract.

docs/add-a-model.md shows a model file that uses them. Inward, `ModelCode` below is every function
the build calls on a model file: docs/add-a-model.md's table is held to it (tests/test_docs.py), and
the toolchain calls no other (tests/architecture.py, "undocumented_model_hooks")."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from toolchain.deploy import sherpa_whisper
from toolchain.engine.run.worker import load_module
from toolchain.errors import StageFailed
from toolchain.shared.audio import read_wav
from toolchain.stages.export import torch_to_onnx

__all__ = [
    "HOOKS",
    "ModelCode",
    "StageFailed",
    "load_module",
    "read_wav",
    "sherpa_whisper",
    "torch_to_onnx",
]

# run(graph, feeds) -> {output: array}: PyTorch, the CPU ONNX or the simulator
Run = Callable[[str, dict], dict]
Sample = tuple                      # one item of samples(): item[0] is its id


class ModelCode(Protocol):
    """The functions of a model file (models/<module>.py) the build calls, by stage. A model file
    defines those its spec needs; "optional" ones change nothing when absent. Besides these, a graph
    whose stream is made from another's (stream.step) names a function of its own: step(calls,
    sample) -> the stream."""

    def prepare_checkpoint(self, source: str, out: str, fmt: str) -> None:
        """checkpoint (optional): turn the pinned file into what the code loads; default: a copy."""

    def export(self, checkpoint: str, graph: str, out: str, settings: dict) -> None:
        """export: write one self-contained static-shape ONNX of `graph` at `out` (not for a graph
        with a source)."""

    def torch_runner(self, checkpoint: str | None) -> Run:
        """parity ([parity] reference = "torch", the default): the graphs run in PyTorch."""

    def reference_runner(self, checkpoint: str | None) -> Run:
        """parity ([parity] reference = "module"): the graphs run by any other code
        of the model's."""

    def samples(self, data_dir: str) -> list[Sample]:
        """parity, verify, calibrate (optional): the real labelled inputs, item[0] a short id."""

    def graph_feeds(self, run: Run, sample: Sample | None) -> dict[str, list[dict]]:
        """parity, verify (optional): {graph: [feeds, ...]} for the per-call checks, every graph."""

    def calibration_feeds(self, run: Run, sample: Sample | None) -> dict[str, list[dict]]:
        """calibrate (optional, w8a16): {graph: [feeds, ...]} to calibrate the quantization with."""

    def stream(self, sample: Sample) -> Any:
        """parity, verify (a graph declaring `stream`): the sample's whole input stream, cut into
        calls by the build."""

    def evaluate_stream(self, run: Run, sample: Sample, calls: Any) -> Any:
        """parity, verify (optional, with `stream`): the task outputs from one
        backend's own-state loop."""

    def evaluate(self, run: Run, samples: list[Sample]) -> Any:
        """parity, verify (optional): the task-level outputs for the samples, JSON-serialisable."""

    def agree(self, ref: Any, got: Any, settings: dict) -> tuple[dict, list[str]]:
        """parity, verify, sherpa (with evaluate/evaluate_stream/transcribe): (record with
        "summary", failures)."""

    def write_tokens(self, path: str) -> None:
        """bundle (optional): the vocabulary file a runtime needs (sherpa-onnx's tokens.txt)."""

    def graphs(self, run: Run, io: dict) -> tuple:
        """sherpa (sherpa-onnx's Whisper contract): the runtime's graph objects
        over run(graph, feeds)."""

    def transcribe(self, encoder: Any, decoder: Any, clips: list, table: dict) -> dict:
        """sherpa (sherpa-onnx's Whisper contract): the runtime's loop over the
        clips, for agree()."""


HOOKS = tuple(name for name in vars(ModelCode) if not name.startswith("_"))
