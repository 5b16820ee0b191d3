"""The embedded compiler: onnxruntime-qnn's HTP backend (QAIRT inside the wheel) compiles ONNX -> EPContext
model + context binary, and its x86 HTP simulator runs them. Its stages: quantize (w8a16), compile."""
from __future__ import annotations

from toolchain.backends import base
from toolchain.backends.ort_qnn import compile, ep, quantize
from toolchain.engine import paths
from toolchain.stages import Stage
from toolchain.stages.export import io_record

NAME = ep.NAME


class Backend(base.Backend):
    name = NAME
    binary_suffix = "_qnn"   # the EP writes <stem>_qnn.bin beside <stem>.onnx
    emits_context_model = True
    calibration_layout = "onnx"
    stages = (Stage("quantize", quantize.tasks, "Float ONNX -> w8a16 QDQ ONNX, per w8a16 graph (embedded toolchain).",
                    "graph"),
              Stage("compile", compile.tasks, "ONNX -> HTP context binary (onnxruntime-qnn), per graph and chip; "
                    "ort-qnn models.", "graph@chip", memory_gb=1.0))   # a Whisper compile peaks at 0.9 GB

    def identity(self) -> dict:
        return ep.version()

    def tool_files(self) -> list[str]:
        return ep.library_files()

    def sdk_version(self) -> str:
        return ep.version()["qairt"]

    def runtime_view(self, graph) -> dict:
        return io_record(graph)   # the EP keeps ONNX names and layouts

    def simulator(self, model, graph, chip, tier: str) -> tuple:
        return ep.simulator, {"ctx_model": paths.context_model(model, graph, chip),
                              "options": ep.provider_options(chip.record(), model.compile["optimization"])}

    def verify_settings(self, model, chip, tier: str) -> dict:
        return {"options": ep.provider_options(chip.record(), model.compile["optimization"]), "tool": ep.version()}

    def verify_runner_name(self) -> str:
        return "HTP simulator"

    def host_libraries(self) -> dict:
        return {"backend_lib": None, "system_lib": None}

    def runtime_libraries(self, chip: dict) -> dict:
        return ep.runtime_libraries(chip)
