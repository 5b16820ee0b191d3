"""The only place that knows where each stage writes in build/: per model, graph, chip and QAIRT
family (paths are relative: doit runs in the dodo's folder). File names a compiler chooses come from
the compiler (stages.Compiler); the engine's own files (state DB, locks) are engine/paths.py's."""
from __future__ import annotations

import re

from toolchain.engine.paths import BUILD
from toolchain.spec.chips import Chip

REPORT = f"{BUILD}/report.md"
REPORT_HTML = f"{BUILD}/report.html"


def model_report(model) -> str:
    """What `doit model:<name>` built, as build/report.md's tables."""
    return f"{BUILD}/{model.name}/report.md"


def chip_report(chip_name: str) -> str:
    """What `doit chip:<CHIP>` built."""
    return f"{BUILD}/report-{chip_name}.md"


def model_dir(model) -> str:
    return f"{BUILD}/{model.name}"


def checkpoint(model) -> str:
    """The original checkpoint, converted to the model module's PyTorch format."""
    return f"{BUILD}/{model.name}/checkpoint/model.pt"


def exported(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/export.onnx"


def checkpoint_log(model) -> str:
    return f"{checkpoint(model)}.log"


def simplify_log(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.simplify.log"


def export_log(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/export.log"


def export_record(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/export.json"


def simplified(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.onnx"


def unrewritten(model, graph) -> str:
    """The simplified ONNX before the spec's rewrites (what the rewritten one
    is checked against)."""
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.unrewritten.onnx"


def rewrites_applied(model, graph) -> str:
    """Which rewrites changed the graph, and the nodes each replaced."""
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.rewrites.json"


def rewrite_check(model) -> str:
    return f"{BUILD}/{model.name}/rewrite.json"


def rewrite_check_log(model) -> str:
    return f"{BUILD}/{model.name}/rewrite.log"


def inspected(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/inspect.json"


def parity(model) -> str:
    return f"{BUILD}/{model.name}/parity.json"


def parity_log(model) -> str:
    return f"{BUILD}/{model.name}/parity.log"


def parity_group(model, group: str) -> str:
    """The per-call tensor check of the graphs judged together (stages/parity.py groups())."""
    return f"{BUILD}/{model.name}/parity/{group}.json"


def parity_group_log(model, group: str) -> str:
    return f"{BUILD}/{model.name}/parity/{group}.log"


def compiler_dir(model, family: str = "") -> str:
    """A toolchain's outputs of one model; a QAIRT family other than the default gets its own folder
    beside it (`ort-qnn-qairt2.49`), so the default build's paths never move."""
    return f"{BUILD}/{model.name}/{model.compiler}" + (f"-qairt{family}" if family else "")


def chip_dir(model, chip: Chip) -> str:
    """Per-chip outputs, under the toolchain's name (and QAIRT family) so two toolchains'
    binaries never mix."""
    return f"{compiler_dir(model, chip.family)}/{chip.name}"


def context_model(model, graph, chip) -> str:
    """EPContext ONNX that points at the context binary beside it."""
    return f"{chip_dir(model, chip)}/{graph.name}.onnx"


def context_binary(model, graph, chip, suffix: str) -> str:
    """The binary's name is the compiler's choice (the EP writes <stem>_qnn.bin;
    qnn-context-binary-generator <--binary_file>.bin): `suffix` is the compiler's binary_suffix."""
    return f"{chip_dir(model, chip)}/{graph.name}{suffix}.bin"


def compile_log(model, graph, chip) -> str:
    return f"{chip_dir(model, chip)}/{graph.name}.compile.log"


def compile_record(model, graph, chip) -> str:
    return f"{chip_dir(model, chip)}/{graph.name}.compile.json"


def shared_dir(model, chip) -> str:
    """A model's window graphs in one context binary whose weights are stored once
    (compilers/ort_qnn/share.py)."""
    return f"{chip_dir(model, chip)}/shared"


def shared_record(model, chip) -> str:
    return f"{chip_dir(model, chip)}/shared.json"


def shared_log(model, chip) -> str:
    return f"{chip_dir(model, chip)}/shared.log"


def verified(model, chip, tier: str = "default") -> str:
    return (f"{chip_dir(model, chip)}/verify.json" if tier == "default"
            else f"{chip_dir(model, chip)}/verify-{tier}.json")


def diagnosis(model, chip) -> str:
    return f"{chip_dir(model, chip)}/diagnose.json"


def verify_log(model, chip, tier: str = "default") -> str:
    return verified(model, chip, tier)[:-len(".json")] + ".log"


def manifest(model, chip) -> str:
    return f"{chip_dir(model, chip)}/manifest.json"


# QAIRT SDK compiler: chip-independent outputs per graph, then per chip in chip_dir().
def compiler_graph_dir(model, graph, family: str = "") -> str:
    """Per-graph outputs of the compiler (QAIRT: converter C++, weights, model libs;
    embedded: the recording)."""
    return f"{compiler_dir(model, family)}/{graph.name}"


def qnn_cpp(model, graph) -> str:
    """Converter output; its file name decides the QNN graph name (qairt.graph_name)."""
    return f"{compiler_graph_dir(model, graph)}/{graph.name}.cpp"


def qnn_weights(model, graph, family: str = "") -> str:
    return f"{compiler_graph_dir(model, graph, family)}/{graph.name}.bin"


def qnn_source(model, graph, family: str = "") -> str:
    """The embedded toolchain's QNN graph: the QNN Saver's C recording of the EP's HTP lowering
    (build/ only: it carries Qualcomm's banner)."""
    return f"{compiler_graph_dir(model, graph, family)}/{graph.name}.c"


def model_libs_dir(model, graph, family: str = "") -> str:
    return f"{compiler_graph_dir(model, graph, family)}/model_libs"


def model_lib(model, graph, target: str, family: str = "") -> str:
    """What qnn-model-lib-generator writes: <out>/<target>/lib<cpp stem>.so."""
    return f"{model_libs_dir(model, graph, family)}/{target}/lib{graph.name}.so"


def htp_config(model, graph, chip, name: str) -> str:
    """htp_backend_extensions.json / htp_config.json of one graph on one chip."""
    return f"{chip_dir(model, chip)}/{graph.name}.config/{name}"


def stage_log(model, graph, stage: str, chip=None, family: str = "") -> str:
    """One log per stage per graph (per chip where the stage is per chip), kept as a target."""
    where = chip_dir(model, chip) if chip else compiler_graph_dir(model, graph, family)
    return f"{where}/{graph.name}.{stage}.log"


def stage_record(model, graph, stage: str, chip=None, family: str = "") -> str:
    return stage_log(model, graph, stage, chip, family)[:-len(".log")] + ".json"


def converter_input_list(model, graph) -> str:
    """A w8a16 graph's calibration list with paths the converter opens from the project root
    (where it runs)."""
    return f"{compiler_graph_dir(model, graph)}/{graph.name}.input_list.txt"


def netrun_scratch(model, graph, chip, tier: str) -> str:
    """qnn-net-run's inputs and outputs during one verify call (removed after each call)."""
    return f"{chip_dir(model, chip)}/netrun-{tier}/{graph.name}"


def calibration(model, graph) -> str:
    """Folder of a w8a16 graph's calibration set (raw files + input_list.txt)."""
    return f"{BUILD}/{model.name}/{graph.name}/calibration"


def calibration_list(model, graph) -> str:
    """One line per sample, the raw files of each graph input, named relative to
    the calibration folder."""
    return f"{calibration(model, graph)}/input_list.txt"


def calibration_record(model, graph) -> str:
    return f"{calibration(model, graph)}/calibration.json"


def calibration_raw(model, graph, index: int, tensor: str) -> str:
    return f"{calibration(model, graph)}/{calibration_raw_name(index, tensor)}"


def calibration_raw_name(index: int, tensor: str) -> str:
    """A tensor name may hold '/' or spaces (exporters write 'encoder/x 0'): not in a file name."""
    return f"{index:04d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', tensor)}.raw"


def calibration_log(model, graph) -> str:
    return f"{calibration(model, graph)}.log"


def quantize_log(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.w8a16.log"


def quantized(model, graph) -> str:
    return f"{BUILD}/{model.name}/{graph.name}/{graph.name}.w8a16.onnx"


def compile_source(model, graph) -> str:
    """The ONNX a compiler takes: the QDQ graph for w8a16, the simplified float graph otherwise."""
    return quantized(model, graph) if graph.precision.quantized else simplified(model, graph)


# Phone-side products: bundles, runtime-library lists, the chip index, device records.
INDEX = f"{BUILD}/chip-index.json"


def bundle_dir(model, chip) -> str:
    return f"{chip_dir(model, chip)}/bundle"


def ort_bundle(model, chip) -> str:
    """EPContext models + their binaries, for onnxruntime's QNN EP on the phone."""
    return f"{bundle_dir(model, chip)}/onnxruntime-qnn-{chip.name}-{model.name}.tar.bz2"


def sherpa_bundle(model, chip) -> str:
    """sherpa-onnx's release name for a per-SoC binary bundle (its export
    workflows'; docs/phone.md)."""
    name = model.bundle_name or model.name
    return f"{bundle_dir(model, chip)}/sherpa-onnx-qnn-{chip.name}-binary-{name}.tar.bz2"


def sherpa_run(model, chip, tier: str = "default") -> str:
    """The sherpa-onnx host loop's record over the unpacked bundle (deploy/sherpa.py)."""
    return f"{chip_dir(model, chip)}/sherpa-run{'' if tier == 'default' else '-' + tier}.json"


def sherpa_run_log(model, chip, tier: str = "default") -> str:
    return sherpa_run(model, chip, tier)[:-len(".json")] + ".log"


def bundle_record(model, chip) -> str:
    return f"{chip_dir(model, chip)}/bundle.json"


def claims(model, chip) -> list[str]:
    """What says a (model, chip)'s binaries passed, or ships them as passed: its verify
    records, manifest, bundles and runtime-loop records (the report removes those a failure
    upstream of them overturned)."""
    return [
        verified(model, chip),
        verified(model, chip, "full"),
        manifest(model, chip),
        bundle_record(model, chip),
        ort_bundle(model, chip),
        sherpa_bundle(model, chip),
        sherpa_run(model, chip),
        sherpa_run(model, chip, "full"),
    ]


def runtime_record(compiler: str, chip: Chip) -> str:
    """The QNN runtime libraries an app ships for one chip, per compiler (SDK version family)."""
    return (
        f"{BUILD}/runtime/{compiler}{f'-qairt{chip.family}' if chip.family else ''}"
        f"/{chip.name}.json"
    )


def qairt_env_dir(family: str) -> str:
    """A QAIRT family's own Python environment (venv/) and its record: shared by every model
    that builds it."""
    return f"{BUILD}/qairt/{family}"


def qairt_env(family: str) -> str:
    return f"{qairt_env_dir(family)}/env.json"


def device_record(model, chip, serial: str) -> str:
    """One phone's measurements: next to the chip's manifest, or under the model when
    no build matched."""
    return f"{chip_dir(model, chip) if chip else model_dir(model)}/device-{serial}.json"


def device_log(model) -> str:
    return f"{BUILD}/{model.name}/device.log"


def step0_log() -> str:
    return f"{BUILD}/step0/step0.log"


def step0_record(serial: str, process: str) -> str:
    return f"{BUILD}/step0/{serial}-{process}.json"


def bundle_log(model, chip) -> str:
    return f"{chip_dir(model, chip)}/bundle.log"
