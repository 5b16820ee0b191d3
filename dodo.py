"""qnn-npu-compile: models/*.toml -> ONNX -> QNN HTP context binaries per chip, verified.

Run `doit list` for every task; `doit full=SM8750` adds the full verification tier for a chip;
`doit extra=1` adds the opt-in models of models/extra/."""
import os

import doit

import toolchain.bundle
import toolchain.calibrate
import toolchain.checkpoint
import toolchain.compile
import toolchain.context
import toolchain.convert
import toolchain.device
import toolchain.export
import toolchain.groups
import toolchain.htpconfig
import toolchain.inspect
import toolchain.manifest
import toolchain.modellib
import toolchain.pagesize
import toolchain.parity
import toolchain.project
import toolchain.quantize
import toolchain.readback
import toolchain.report
import toolchain.runtime_libs
import toolchain.selector
import toolchain.sherpa_run
import toolchain.simplify
import toolchain.step0
import toolchain.verify
from toolchain import paths

DOIT_CONFIG = {
    "dep_file": paths.STATE_DB,
    "backend": "sqlite3sync",          # commits per task: a killed build keeps what finished
    "check_file_uptodate": "md5",      # content, not mtime, decides
    "action_string_formatting": "new",
    "par_type": "thread",              # `doit -n N`: actions only wait on child processes (docs/scale.md)
    "default_tasks": ["checkpoint", "export", "simplify", "inspect", "parity", "calibrate", "quantize", "convert", "modellib",
                      "pagesize", "htpconfig", "context", "readback", "compile", "verify", "manifest", "sherpa", "sherpa_full", "report"],
}

os.makedirs(paths.BUILD, exist_ok=True)   # doit opens the state DB before any task runs
PROJECT = toolchain.project.load("models", full=doit.get_var("full", "") or "",
                                 extra=(doit.get_var("extra", "") or "") not in ("", "0"))


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


def task_calibrate():
    """Real calibration inputs (raw files + input list), per w8a16 graph."""
    yield from toolchain.calibrate.tasks(PROJECT)


def task_quantize():
    """Float ONNX -> w8a16 QDQ ONNX, per w8a16 graph (embedded toolchain)."""
    yield from toolchain.quantize.tasks(PROJECT)


def task_convert():
    """ONNX -> QNN graph C++ + weights (qnn-onnx-converter), per graph; QAIRT SDK models."""
    yield from toolchain.convert.tasks(PROJECT)


def task_modellib():
    """QNN graph -> model libs x86_64 / aarch64-android (qnn-model-lib-generator), per graph; QAIRT."""
    yield from toolchain.modellib.tasks(PROJECT)


def task_pagesize():
    """aarch64-android model lib LOAD segments aligned to 16 KiB, per graph; QAIRT."""
    yield from toolchain.pagesize.tasks(PROJECT)


def task_htpconfig():
    """Chip table -> HTP backend config JSON, per graph and chip; QAIRT."""
    yield from toolchain.htpconfig.tasks(PROJECT)


def task_context():
    """x86_64 model lib -> context binary (qnn-context-binary-generator), per graph and chip; QAIRT."""
    yield from toolchain.context.tasks(PROJECT)


def task_readback():
    """Context binary read back: build id, graph name, chip, I/O, per graph and chip; QAIRT."""
    yield from toolchain.readback.tasks(PROJECT)


def task_compile():
    """ONNX -> HTP context binary (onnxruntime-qnn), per graph and chip; ort-qnn models."""
    yield from toolchain.compile.tasks(PROJECT)


def task_verify():
    """HTP simulator vs CPU ONNX, default tier, per model and chip."""
    yield from toolchain.verify.tasks(PROJECT, "default")


def task_verify_full():
    """HTP simulator vs CPU ONNX on every clip (WER), per model and chip; opt-in."""
    yield from toolchain.verify.tasks(PROJECT, "full")


def task_sherpa():
    """sherpa-onnx's Whisper loop on the unpacked sherpa bundle via the QNN C API, default tier, per model and chip."""
    yield from toolchain.sherpa_run.tasks(PROJECT, "default")


def task_sherpa_full():
    """sherpa-onnx's Whisper loop on every clip of the bundle (WER), per model and chip; opt-in."""
    yield from toolchain.sherpa_run.tasks(PROJECT, "full")


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


def task_runtime():
    """QNN runtime libraries an app ships (names, versions, license terms), per toolchain and chip."""
    yield from toolchain.runtime_libs.tasks(PROJECT)


def task_bundle():
    """Phone bundles (.tar.bz2: onnxruntime EPContext; sherpa-onnx where its contract holds), per model and chip."""
    yield from toolchain.bundle.tasks(PROJECT)


def task_chip_index():
    """build/chip-index.json: chip -> soc id -> arch -> bundle -> sha256, for the app's NPU-or-CPU choice."""
    return toolchain.selector.tasks(PROJECT)


def task_device():
    """Attached phone (opt-in): choose by ro.soc.model, push, run, compare, measure; per model."""
    yield from toolchain.device.tasks(PROJECT, toolchain.device.variables(doit.get_var))


def task_step0():
    """Attached phone (opt-in): is the NPU likely worth it for a process running today's CPU path?"""
    return toolchain.step0.task(toolchain.step0.variables(doit.get_var))
