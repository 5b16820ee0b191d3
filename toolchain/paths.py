"""The only place that knows the layout of build/ (paths are relative: doit runs in the dodo's folder)."""
from __future__ import annotations

BUILD = "build"
REPORT = f"{BUILD}/report.md"
STATE_DB = f"{BUILD}/.doit.db"


def model_dir(model) -> str:
    return f"{BUILD}/{model.name}"


def checkpoint(model) -> str:
    """The original checkpoint, converted to the model module's PyTorch format."""
    return f"{BUILD}/{model.name}/checkpoint/model.pt"


def exported(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/export.onnx"


def export_record(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/export.json"


def simplified(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.onnx"


def inspected(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/inspect.json"


def parity(model) -> str:
    return f"{BUILD}/{model.name}/parity.json"


def chip_dir(model, chip) -> str:
    """Per-chip outputs, under the toolchain's name so two toolchains' binaries never mix."""
    return f"{BUILD}/{model.name}/{model.toolchain}/{chip.name}"


def context_model(model, graph, chip) -> str:
    """EPContext ONNX that points at the context binary beside it."""
    return f"{chip_dir(model, chip)}/{graph.name}.onnx"


def context_binary(model, graph, chip) -> str:
    return f"{chip_dir(model, chip)}/{graph.name}_qnn.bin"


def compile_log(model, graph, chip) -> str:
    return f"{chip_dir(model, chip)}/{graph.name}.compile.log"


def compile_record(model, graph, chip) -> str:
    return f"{chip_dir(model, chip)}/{graph.name}.compile.json"


def verified(model, chip, tier: str = "default") -> str:
    return f"{chip_dir(model, chip)}/verify.json" if tier == "default" else f"{chip_dir(model, chip)}/verify-{tier}.json"


def verify_log(model, chip, tier: str = "default") -> str:
    return verified(model, chip, tier)[:-len(".json")] + ".log"


def manifest(model, chip) -> str:
    return f"{chip_dir(model, chip)}/manifest.json"
