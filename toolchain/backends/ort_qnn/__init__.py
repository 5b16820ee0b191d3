"""The embedded compiler: onnxruntime-qnn's HTP backend (QAIRT inside the wheel) compiles ONNX -> EPContext
model + context binary, and its x86 HTP simulator runs them. Its stages: quantize (w8a16), compile."""
from __future__ import annotations

from collections.abc import Mapping

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

    def spec_problems(self, model) -> list[tuple[str, str]]:
        """A graph's [graphs.<g>.compile] takes `ep_options = {name = value}`, checked against the EP's own."""
        found = []
        for graph in model.graphs:
            where = f"graphs.{graph.name}.compile"
            for key, value in graph.compile.items():
                if key != "ep_options":
                    hint = " (that is a QAIRT option)" if key in ("converter_args",) else ""
                    found.append((f"{where}.{key}", f"unknown key{hint}; this compiler takes ep_options = {{...}}"))
                elif not isinstance(value, Mapping):
                    found.append((f"{where}.ep_options", f"expected a table of EP options, got {value!r}"))
                else:
                    found += [(f"{where}.ep_options.{name}", why) for name, why in ep.option_problems(value)]
        return found

    def options(self, model, graph, chip) -> dict:
        """The EP options one graph is compiled and simulated with."""
        return ep.provider_options(chip.record(), model.compile["optimization"], graph.compile.get("ep_options"))

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
                              "options": self.options(model, graph, chip)}

    def piece_runner(self, model, graph, chip) -> tuple | None:
        if graph.precision != "fp16":
            return None   # a w8a16 piece would need its own calibration: not cut (docs/diagnose.md)
        return ep.piece_simulator, {"options": self.options(model, graph, chip)}

    def verify_settings(self, model, chip, tier: str) -> dict:
        found = {"options": ep.provider_options(chip.record(), model.compile["optimization"]), "tool": ep.version()}
        own = {g.name: ep.option_strings(g.compile["ep_options"]) for g in model.graphs if "ep_options" in g.compile}
        return {**found, "graph_options": own} if own else found   # as before for graphs without their own

    def verify_runner_name(self) -> str:
        return "HTP simulator"

    def host_libraries(self) -> dict:
        return {"backend_lib": None, "system_lib": None}

    def runtime_libraries(self, chip: dict) -> dict:
        return ep.runtime_libraries(chip)
