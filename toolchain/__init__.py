"""qnn-npu-compile's build: spec/ (TOML -> records) -> stages/ (compiler-independent doit stages) ->
backends/ (the compilers, one surface) -> deploy/ (bundles, runtime contract) and phone/; engine/ runs
it all (worker, cache, limits, paths) and qnn/ holds the facts of QNN itself. pipeline.py lists the stages.

Model code (models/*.py) imports a few helpers by the names they had before the wings: those names stay,
as aliases of the modules' new homes, so that a model's own files (dependencies of its tasks) need no edit."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MODEL_CODE_NAMES = {"toolchain.export": "toolchain.stages.export",        # torch_to_onnx()
                    "toolchain.worker": "toolchain.engine.worker",        # load_module(), StageFailed
                    "toolchain.sherpa_whisper": "toolchain.deploy.sherpa_whisper",
                    "toolchain.audio": "toolchain.stages.audio"}            # read_wav(): no libsndfile


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import toolchain.export` gives the very module toolchain.stages.export (one module, one StageFailed)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MODEL_CODE_NAMES else None

    def create_module(self, spec):
        return importlib.import_module(MODEL_CODE_NAMES[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())
