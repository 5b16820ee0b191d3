"""The embedded compiler: onnxruntime-qnn's HTP backend (QAIRT inside the wheel) and its x86 HTP
simulator. Its stages are the design card's middle nodes: quantize (w8a16) -> convert (QNN Saver
recording of the EP's HTP lowering: <graph>.c + .bin, per graph) -> modellib (lib<graph>.so, per
graph) -> compile (context binary + EPContext ONNX, per chip); oracle (on demand) proves the route's
bytes equal the EP's direct compile."""
from __future__ import annotations

from collections.abc import Mapping

from toolchain import artifacts, stages
from toolchain.compilers.ort_qnn import (
    compile,
    convert,
    ep,
    families,
    familyrun,
    modellib,
    oracle,
    qairt_env,
    quantize,
    share,
)
from toolchain.engine.options import Options
from toolchain.errors import SpecError
from toolchain.shared.iorecord import io_record
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Stage

NAME = ep.NAME


class Compiler(stages.Compiler):
    name = NAME
    binary_suffix = "_qnn"   # the EP writes <stem>_qnn.bin beside <stem>.onnx
    emits_context_model = True
    calibration_layout = "onnx"
    stages = (
        Stage(
            "qairt_env",
            qairt_env.tasks,
            "A QAIRT family's own Python environment (onnxruntime-qnn wheel "
            "pair, no torch), per family a model builds besides the default; ort-qnn.",
            "qairt",
        ),
        Stage(
            "quantize",
            quantize.tasks,
            "Float ONNX -> w8a16 QDQ ONNX, per w8a16 graph (embedded toolchain).",
            "graph",
        ),
        Stage(
            "convert",
            convert.tasks,
            "ONNX -> QNN graph <graph>.c + weights .bin (the EP's HTP lowering "
            "recorded by the QNN Saver), per graph; ort-qnn.",
            "graph",
            memory_gb=1.0,
            output_kind="code",
        ),
        Stage(
            "modellib",
            modellib.tasks,
            "QNN graph .c -> model library lib<graph>.so (x86_64-linux, system C "
            "compiler), per graph; ort-qnn.",
            "graph",
            output_kind="code",
        ),
        Stage(
            "compile",
            compile.tasks,
            "Model library -> HTP context binary + EPContext ONNX (libQnnHtp.so "
            "with the chip's settings), per graph and chip; ort-qnn.",
            "graph@chip",
            memory_gb=1.0,
        ),
        # a Whisper compile peaks at 0.9 GB
        Stage(
            "share",
            share.tasks,
            "A model's [windows] graphs in one context binary per chip, weights stored "
            "once (EP share_ep_contexts), read back; ort-qnn.",
            "model@chip",
            memory_gb=2.5,
        ),
        # tiny.en's six window graphs in one process peak at 2.1 GB (docs/whisper-windows.md)
        Stage(
            "oracle",
            oracle.tasks,
            "The route's binary == the EP's direct compile, byte for byte, per graph "
            "and chip; ort-qnn, on demand.",
            "graph@chip",
            default=False,
            memory_gb=1.0,
            output_kind="result",
        ),
    )

    def preflight(self, models: list[Model], chips: dict, options: Options) -> None:
        """The route's model libraries need a C compiler: one line at load when there is none."""
        routed = [m for m in models if any(ep.uses_route(g) for g in m.graphs)]
        if routed and modellib.compiler() is None:
            raise SpecError(f"{routed[0].spec_file}: {modellib.missing_compiler_message()}")

    def families(self, model: Model, override: str = "") -> tuple[str, ...]:
        """`[compile] runtime_qairt` / `qairt`, or the command line's `qairt=` for this run:
        family names, "" for the build's own (the default family keeps today's task names,
        paths and settings)."""
        where = f"{model.spec_file}: compile"
        names = (families.parse_var(override) or ()) if override else \
            families.resolve(model.compile.get("runtime_qairt"), model.compile.get("qairt"), where)
        own = families.default().name
        return () if names in ((), (own,)) else tuple("" if n == own else n for n in names)

    def spec_problems(self, model: Model) -> list[tuple[str, str]]:
        """A graph's [graphs.<g>.compile] takes `ep_options = {name = value}`, checked against
        the EP's own."""
        found = []
        for graph in model.graphs:
            where = f"graphs.{graph.name}.compile"
            found += ep.route_problems(graph)
            for key, value in graph.compile.items():
                if key == "route":
                    continue
                if key != "ep_options":
                    hint = " (that is a QAIRT option)" if key in ("converter_args",) else ""
                    found.append(
                        (
                            f"{where}.{key}",
                            f"unknown key{hint}; this compiler takes ep_options = {{...}}",
                        )
                    )
                elif not isinstance(value, Mapping):
                    found.append(
                        (f"{where}.ep_options", f"expected a table of EP options, got {value!r}")
                    )
                else:
                    found += [
                        (f"{where}.ep_options.{name}", why)
                        for name, why in ep.option_problems(value)
                    ]
        return found

    def options(self, model: Model, graph: Graph, chip: Chip) -> dict:
        """The EP options one graph is compiled and simulated with."""
        return ep.graph_options(model, graph, chip)

    def identity(self, chip: Chip | None = None) -> dict:
        family = _family(chip)
        return family.identity() if family else ep.version()

    def tool_files(self, chip: Chip | None = None) -> list[str]:
        """The wheel's libraries; a family's environment record (it holds the
        family's library sizes)."""
        family = _family(chip)
        return [artifacts.qairt_env(family.name)] if family else ep.library_files()

    def sdk_version(self, chip: Chip | None = None) -> str:
        return self.identity(chip)["qairt"]

    def runtime_view(self, graph: Graph) -> dict:
        return io_record(graph)   # the EP keeps ONNX names and layouts

    def simulator(self, model: Model, graph: Graph, chip: Chip, tier: str) -> tuple:
        found = {
            "ctx_model": artifacts.context_model(model, graph, chip),
            "options": self.options(model, graph, chip),
        }
        family = _family(chip)
        if family:   # the family's own simulator, in its own interpreter (familyrun.py)
            return familyrun.simulator, {**found, "python": families.interpreter(family),
                                         "env": families.environ(family)}
        return ep.simulator, found

    def piece_runner(self, model: Model, graph: Graph, chip: Chip) -> tuple | None:
        if _family(chip):
            # pieces compile in the verify step's own process: the build's own QAIRT only
            return None
        if graph.precision.quantized:
            # a w8a16 piece would need its own calibration: not cut (docs/add-a-model.md)
            return None
        return ep.piece_simulator, {"options": self.options(model, graph, chip)}

    def verify_settings(self, model: Model, chip: Chip, tier: str) -> dict:
        found = {"options": ep.provider_options(chip.record(), model.compile["optimization"]),
                 "tool": self.identity(chip)}
        own = {
            g.name: ep.option_strings(g.compile["ep_options"])
            for g in model.graphs
            if "ep_options" in g.compile
        }
        # as before for graphs without their own
        return {**found, "graph_options": own} if own else found

    def verify_runner_name(self) -> str:
        return "HTP simulator"

    def host_libraries(self) -> dict:
        return {"backend_lib": None, "system_lib": None}

    def runtime_libraries(self, chip: Chip) -> dict:
        return ep.runtime_libraries(chip.record(), _family(chip) or families.default())

    def manifest_sources(self, model: Model, chip: Chip) -> dict:
        """What each graph became on the NPU (QNN op counts, weight bytes), from
        its convert record."""
        routed = {g.name: artifacts.stage_record(model, g, "convert", family=chip.family)
                  for g in model.graphs if ep.uses_route(g)}
        found = {"qnn_graph": routed} if routed else {}
        # the windows' shared context (share.py): its size and read-back
        if model.windows and not chip.family:
            found["shared_context"] = {"record": artifacts.shared_record(model, chip)}
        return found


def _family(chip: Chip | None) -> families.Family | None:
    """The chip's QAIRT family when it is not the build's own (None: the default, today's build)."""
    name = chip.family if chip is not None else ""
    return families.table()[name] if name else None
