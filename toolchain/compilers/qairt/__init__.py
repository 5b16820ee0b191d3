"""The QAIRT SDK compiler ($QNN_SDK_ROOT), as sherpa-onnx's CI runs it: qnn-onnx-converter -> C++
graph + weights -> qnn-model-lib-generator -> model libs -> qnn-context-binary-generator ->
context binary per chip, read back; qnn-net-run is its simulator runner. The SDK is preflighted
at load time."""
from __future__ import annotations

from toolchain import artifacts, stages
from toolchain.compilers.qairt import (
    context,
    convert,
    htpconfig,
    modellib,
    netrun,
    pagesize,
    readback,
    tools,
)
from toolchain.engine.options import Options
from toolchain.qnn.layout import c_name, native_permutation
from toolchain.qnn.sdk import Sdk
from toolchain.shared.iorecord import io_record
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Stage

NAME = tools.NAME


class Compiler(stages.Compiler):
    name = NAME
    binary_suffix = ""            # qnn-context-binary-generator writes <--binary_file>.bin
    # wrapping binaries in EPContext ONNX (gen_qnn_ctx_onnx_model.py) is not done
    emits_context_model = False
    # --use_native_input_files: raw files in the converter's native layout
    calibration_layout = "qnn"
    stages = (
        Stage(
            "convert",
            convert.tasks,
            "ONNX -> QNN graph C++ + weights (qnn-onnx-converter), per graph; QAIRT SDK models.",
            "graph",
            output_kind="code",
        ),
        Stage(
            "modellib",
            modellib.tasks,
            "QNN graph -> model libs x86_64 / aarch64-android "
            "(qnn-model-lib-generator), per graph; QAIRT.",
            "graph",
            output_kind="code",
        ),
        Stage(
            "pagesize",
            pagesize.tasks,
            "aarch64-android model lib LOAD segments aligned to 16 KiB, per graph; QAIRT.",
            "graph",
        ),
        Stage(
            "htpconfig",
            htpconfig.tasks,
            "Chip table -> HTP backend config JSON, per graph and chip; QAIRT.",
            "graph@chip",
        ),
        Stage(
            "context",
            context.tasks,
            "x86_64 model lib -> context binary (qnn-context-binary-generator), "
            "per graph and chip; QAIRT.",
            "graph@chip",
            memory_gb=1.0,
        ),
        Stage(
            "readback",
            readback.tasks,
            "Context binary read back: build id, graph name, chip, I/O, per graph and chip; QAIRT.",
            "graph@chip",
            output_kind="result",
        ),
    )

    def __init__(self):
        self.sdk: Sdk | None = None   # set by preflight()

    def preflight(self, models: list[Model], chips: dict, options: Options) -> None:
        self.sdk = tools.preflight(models, chips, options["sdk"], options["qairt_python"])

    def families(self, model: Model, override: str = "") -> tuple[str, ...]:
        """The SDK's own QAIRT only: a spec's family keys are refused (`override` is the
        embedded compiler's)."""
        if "runtime_qairt" in model.compile or "qairt" in model.compile:
            raise ValueError(
                f"{model.spec_file}: compile.runtime_qairt/qairt: the {self.name} toolchain builds "
                "with "
                "the one QAIRT it has; the embedded toolchain (ort-qnn) builds for several"
            )
        return ()

    def spec_problems(self, model: Model) -> list[tuple[str, str]]:
        """The converter renames every non-word character to '_' (done here the same way);
        refused: names it would make collide, and names starting with a digit (not a C++
        identifier either way)."""
        found = []
        for graph in model.graphs:
            # [graphs.<g>.compile]: converter_args = [...]
            for key, value in graph.compile.items():
                where = f"graphs.{graph.name}.compile.{key}"
                if key != "converter_args":
                    hint = (
                        " (that is the embedded compiler's, toolchain ort-qnn)"
                        if key == "ep_options"
                        else ""
                    )
                    found.append(
                        (where, f"unknown key{hint}; this compiler takes converter_args = [...]")
                    )
                else:
                    found += [(where, why) for why in tools.converter_arg_problems(value)]
            if c_name(graph.name)[0].isdigit():
                found.append(
                    (
                        f"graphs.{graph.name}",
                        "a QAIRT graph name must not start with a digit (the converter "
                        "makes it a C++ identifier): rename the graph",
                    )
                )
            for kind, tensors in (("inputs", graph.inputs), ("outputs", graph.outputs)):
                seen: dict[str, str] = {}
                for t in tensors:
                    where = f"graphs.{graph.name}.{kind}.{t.name}"
                    if c_name(t.name)[0].isdigit():
                        found.append(
                            (
                                where,
                                "starts with a digit: the QAIRT converter cannot keep it as a C++ "
                                "identifier; rename the tensor in the export",
                            )
                        )
                    other = seen.setdefault(c_name(t.name), t.name)
                    if other != t.name:
                        found.append(
                            (
                                where,
                                f"the QAIRT converter names both '{other}' and '{t.name}' "
                                f"'{c_name(t.name)}' (non-word characters become '_'): rename one",
                            )
                        )
        return found

    def identity(self, chip: Chip | None = None) -> dict:
        return tools.sdk_of(self).record()

    def tool_files(self, chip: Chip | None = None) -> list[str]:
        return [tools.sdk_of(self).host_lib(name) for name in ("libQnnHtp.so", "libQnnSystem.so")]

    def sdk_version(self, chip: Chip | None = None) -> str:
        return tools.sdk_of(self).build_id

    def sdk_root(self) -> str | None:
        return tools.sdk_of(self).root

    def runtime_view(self, graph: Graph) -> dict:
        """Names as the converter writes them; inputs in its native layout (3-D last two axes
        swapped, 4-D NHWC); a calibrated (w8a16) graph's float I/O is UFIXED_POINT_16 with a
        scale and offset."""
        quantized = graph.precision.quantized

        def tensor(t, is_input):
            shape = (
                [t.shape[i] for i in native_permutation(len(t.shape))]
                if is_input
                else list(t.shape)
            )
            dtype = "ufixed16" if quantized and t.dtype == "float32" else t.dtype
            return [c_name(t.name), shape, dtype]

        return {
            "inputs": [tensor(t, True) for t in graph.inputs],
            "outputs": [tensor(t, False) for t in graph.outputs],
        }

    def simulator(self, model: Model, graph: Graph, chip: Chip, tier: str) -> tuple:
        binary = artifacts.context_binary(model, graph, chip, self.binary_suffix)
        work = artifacts.netrun_scratch(model, graph, chip, tier)
        sdk = tools.sdk_of(self)
        return netrun.simulator, {
            "argv": tools.netrun_argv(sdk, binary, f"{work}/input_list.txt", f"{work}/output"),
            "env": tools.env(sdk),
            "work": work,
            "io": io_record(graph),
            "record": artifacts.compile_record(model, graph, chip),
        }

    def verify_settings(self, model: Model, chip: Chip, tier: str) -> dict:
        runner = {g.name: self.simulator(model, g, chip, tier)[1]["argv"] for g in model.graphs}
        return {
            "runner": runner,
            "env": tools.env(tools.sdk_of(self)),
            "sdk": tools.sdk_of(self).record(),
            "chip": chip.record(),
        }

    def verify_runner_name(self) -> str:
        return f"qnn-net-run (x86_64 HTP) [qairt {tools.sdk_of(self).build_id}]"

    def host_libraries(self) -> dict:
        sdk = tools.sdk_of(self)
        return {
            "backend_lib": sdk.host_lib("libQnnHtp.so"),
            "system_lib": sdk.host_lib("libQnnSystem.so"),
        }

    def runtime_libraries(self, chip: Chip) -> dict:
        return tools.runtime_libraries(tools.sdk_of(self), chip.record())

    def manifest_sources(self, model: Model, chip: Chip) -> dict:
        # the model libs (x86_64, aarch64-android) and their page alignment
        return {
            "model_libs": {
                g.name: artifacts.stage_record(model, g, "pagesize") for g in model.graphs
            }
        }
