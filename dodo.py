"""qnn-npu-compile: models/*.toml -> ONNX -> QNN HTP context binaries per chip, verified.

Run `doit list` for every task; `doit full=SM8750` adds the full verification tier for a chip."""
import os

import doit

import toolchain.checkpoint
import toolchain.compile
import toolchain.export
import toolchain.groups
import toolchain.inspect
import toolchain.manifest
import toolchain.parity
import toolchain.project
import toolchain.report
import toolchain.simplify
import toolchain.verify
from toolchain import paths

DOIT_CONFIG = {
    "dep_file": paths.STATE_DB,
    "backend": "sqlite3sync",          # commits per task: a killed build keeps what finished
    "check_file_uptodate": "md5",      # content, not mtime, decides
    "action_string_formatting": "new",
    "default_tasks": ["checkpoint", "export", "simplify", "inspect", "parity", "compile", "verify",
                      "manifest", "report"],
}

os.makedirs(paths.BUILD, exist_ok=True)   # doit opens the state DB before any task runs
PROJECT = toolchain.project.load("models", full=doit.get_var("full", "") or "")


def task_checkpoint():
    """Pinned original checkpoint -> PyTorch checkpoint, per model."""
    yield from toolchain.checkpoint.tasks(PROJECT)


def task_export():
    """Checkpoint -> static-shape ONNX, per graph."""
    yield from toolchain.export.tasks(PROJECT)


def task_simplify():
    """ONNX -> onnxsim ONNX, per graph."""
    yield from toolchain.simplify.tasks(PROJECT)


def task_inspect():
    """Hard I/O check of the simplified ONNX, per graph."""
    yield from toolchain.inspect.tasks(PROJECT)


def task_parity():
    """ONNX on CPU vs PyTorch on real inputs, per model."""
    yield from toolchain.parity.tasks(PROJECT)


def task_compile():
    """ONNX -> HTP context binary, per graph and chip."""
    yield from toolchain.compile.tasks(PROJECT)


def task_verify():
    """HTP simulator vs CPU ONNX, default tier, per model and chip."""
    yield from toolchain.verify.tasks(PROJECT, "default")


def task_verify_full():
    """HTP simulator vs CPU ONNX on every clip (WER), per model and chip; opt-in."""
    yield from toolchain.verify.tasks(PROJECT, "full")


def task_manifest():
    """JSON record next to each chip's binaries, per model and chip."""
    yield from toolchain.manifest.tasks(PROJECT)


def task_report():
    """Summary table of the whole build."""
    return toolchain.report.tasks(PROJECT)


def task_chip():
    """All tasks of one chip, across models."""
    yield from toolchain.groups.chip_tasks(PROJECT)


def task_model():
    """All tasks of one model."""
    yield from toolchain.groups.model_tasks(PROJECT)
