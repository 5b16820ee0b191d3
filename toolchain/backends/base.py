"""The surface every compiler implements. Stages, bundles and the phone code ask these questions of
`model.backend` and never of a compiler's name; a third compiler is one folder implementing this class
plus one line in backends/__init__.py."""
from __future__ import annotations

from abc import ABC, abstractmethod

from toolchain.engine.options import Options
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Stage


class Backend(ABC):
    name = ""                    # what a spec's `toolchain =` says; names build/<model>/<name>/
    binary_suffix = ""           # <graph><suffix>.bin: the file name the compiler gives a context binary
    emits_context_model = False  # writes an onnxruntime EPContext .onnx beside each binary
    calibration_layout = "onnx"  # "onnx" or "qnn": the axes order its quantizer reads raw calibration files in
    stages: tuple[Stage, ...] = ()   # its own toolchain/stages.Stage records, in run order (pipeline.py places them)

    def preflight(self, models: list[Model], chips: dict[str, Chip], options: Options) -> None:
        """Check at load time, before any task runs, what the models need of this compiler; raise SpecError.
        `options`: this run's settings (toolchain/options.py), e.g. where an SDK is."""

    def spec_problems(self, model: Model) -> list[tuple[str, str]]:
        """(field, reason) for what this compiler cannot build as declared (refused at load time)."""
        return []

    def families(self, model: Model, override: str = "") -> tuple[str, ...]:
        """The QAIRT families one model builds, "" for the compiler's own ((): its own only); `override`: the
        command line's `qairt=`. Raises ValueError naming the field."""
        if "runtime_qairt" in model.compile or "qairt" in model.compile:
            raise ValueError(f"{model.spec_file}: compile.runtime_qairt/qairt: the {self.name} toolchain builds with "
                             "the one QAIRT it has; the embedded toolchain (ort-qnn) builds for several")
        return ()

    @abstractmethod
    def identity(self, chip: Chip | None = None) -> dict:
        """Tool build id (of `chip`'s QAIRT family where a compiler builds several): part of the settings of every
        task whose output the compiler decides."""

    def tool_files(self, chip: Chip | None = None) -> list[str]:
        """Files whose bytes decide its outputs (compiler and simulator libraries): every task whose output
        the compiler decides lists them in its file_dep, so changed bytes rebuild under the same version."""
        return []

    @abstractmethod
    def sdk_version(self, chip: Chip | None = None) -> str:
        """The QAIRT version of the compiler: the runtime libraries must come from the same family."""

    def sdk_root(self) -> str | None:
        """An SDK folder holding the device libraries (lib/aarch64-android, lib/hexagon-v*), if any."""
        return None

    @abstractmethod
    def runtime_view(self, graph: Graph) -> dict:
        """{"inputs"/"outputs": [[name, shape, dtype]]} as the runtime sees the compiled graph: names,
        layouts and dtypes after the compiler, in declaration order, from the spec alone."""

    @abstractmethod
    def simulator(self, model: Model, graph: Graph, chip: Chip, tier: str) -> tuple:
        """(factory, kwargs): factory(**kwargs) in the verify worker returns run(feeds) -> outputs for
        the compiled binary on the x86 HTP simulator, in ONNX names and layouts."""

    def piece_runner(self, model: Model, graph: Graph, chip: Chip) -> tuple | None:
        """(factory, kwargs): factory(piece=<onnx path>, **kwargs) in the diagnose worker compiles a cut of
        the graph as the graph itself is compiled and returns run(feeds) on the simulator; None when this
        compiler cannot (the diagnose stage then has no task for the model)."""
        return None

    @abstractmethod
    def verify_settings(self, model: Model, chip: Chip, tier: str) -> dict:
        """What besides the checks decides a verify result (runner, options, tool)."""

    @abstractmethod
    def verify_runner_name(self) -> str:
        """How `doit list` names the simulator runner."""

    @abstractmethod
    def host_libraries(self) -> dict:
        """{"backend_lib", "system_lib"}: the x86_64 QNN libraries that open this compiler's binaries
        (None: the ones of the onnxruntime-qnn wheel)."""

    @abstractmethod
    def runtime_libraries(self, chip: Chip) -> dict:
        """What an app ships next to one chip's binaries (recorded in the manifest)."""

    def manifest_sources(self, model: Model, chip: Chip) -> dict:
        """Extra records of this compiler a chip's manifest includes: {section: {graph: path}}."""
        return {}
