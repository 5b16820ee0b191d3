"""The stage contract: the record that names a stage (Stage), the surface every compiler implements
(Compiler) and the record every stage's tasks() is handed (Project), in one low place that every
stage, compiler and deploy module imports.

A stage module has `tasks(project)` yielding doit task dicts; what a compiler does differently it
asks of `project.compiler(model)`, never of the compiler's name. The ordered list of every stage,
the compilers' included, is toolchain/pipeline.py; toolchain/project.py loads the Project."""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable

from toolchain.engine.options import Options
from toolchain.shared import modeldata
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model

# What one task of a stage is per, which decides its name and the `model:` / `chip:` aliases it
# joins. qairt: per QAIRT family what a later step does with a stage's outputs: reads and checks
# them (data), believes them (result: a check's record, a bundle shipped as built), or runs them
# (code); engine/cache/__init__.py's KINDS
OUTPUT_KINDS = ("data", "result", "code")
SCOPES = ("model", "graph", "graph@chip", "model@chip", "compiler@chip", "qairt", "build", "phone")


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: its doit task group, how it makes its tasks and what
    a step costs."""

    # doit's task group name: `doit <name>`, `<name>:<model>/<graph>@<CHIP>`
    name: str
    tasks: Callable            # tasks(project) -> doit task dicts (or one dict)
    doc: str                   # one line for `doit list`
    scope: str                 # one of SCOPES
    default: bool = True       # part of a plain `doit` (and of the model:/chip: aliases)
    threads: int = 1           # cores one step keeps busy (the x86 HTP simulator runs ~2 threads)
    # peak memory of one step, measured (limits.slots_for sizes the slots from both)
    memory_gb: float = 0.5
    # stages whose steps share one set of slots (every simulator stage: "simulator")
    pool: str = ""
    # "code" when a later step compiles, links, loads or imports the outputs (a QNN graph's C
    # source, a model library): such outputs are rebuilt here, never taken from a shared cache
    # (docs/scale.md, "Trust"); "result" when no later step checks them (a check's record, a
    # bundle): restored only from a signed entry
    output_kind: str = "data"

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"stage {self.name}: scope {self.scope!r} is not one of {SCOPES}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(
                f"stage {self.name}: output_kind {self.output_kind!r} is not one of {OUTPUT_KINDS}"
            )


def named(
    model: Model | str,
    graph: Graph | str | None = None,
    chip: Chip | None = None,
    family: str = "",
) -> dict:
    """A task's name and its owner, made from the records it is built for: `name` is
    `<model>[/<graph>][@<CHIP>][+qairt<family>]` (`convert:m/g+qairt2.49` has a family, no chip),
    `owner` is {model, graph, chip, family} (those it has). The pipeline moves `owner` into the
    task's meta, where the aliases, the trace and the CI matrix read it: nothing parses a name back.
    `graph` is a graph or the name of a group of graphs (parity); `model` a model or, for a task
    that serves no model (a compiler's runtime), the compiler's name (owner `compiler`); a chip's
    family is its own (chip.family)."""
    owner = {"compiler": model} if isinstance(model, str) else {"model": model.name}
    name = model if isinstance(model, str) else model.name
    if graph is not None:
        owner["graph"] = graph if isinstance(graph, str) else graph.name
        name += f"/{owner['graph']}"
    family = chip.family if chip is not None else family
    if chip is not None:
        owner["chip"] = chip.name
        name += f"@{chip.name}"
    if family:
        owner["family"] = family
        name += f"+qairt{family}"
    return {"name": name, "owner": owner}


class Compiler(ABC):
    """What a spec's `compiler =` names (compilers/<name>/): one subclass per compiler. Stages,
    bundles and the phone code ask these questions of `project.compiler(model)`, never of a
    compiler's name; a third compiler is one folder implementing this class plus one line in
    compilers/registry.py."""

    name = ""                    # what a spec's `compiler =` says; names build/<model>/<name>/
    # <graph><suffix>.bin: the file name the compiler gives a context binary
    binary_suffix = ""
    emits_context_model = False  # writes an onnxruntime EPContext .onnx beside each binary
    # "onnx" or "qnn": the axes order its quantizer reads raw calibration files in
    calibration_layout = "onnx"
    stages: tuple[Stage, ...] = ()   # its own Stage records, in run order (pipeline.py places them)

    def preflight(self, models: list[Model], chips: dict[str, Chip], options: Options) -> None:
        """Check at load time, before any task runs, what the models need of this compiler; raise
        SpecError. `options`: this run's settings (toolchain/options.py), e.g. where an SDK is."""

    def spec_problems(self, model: Model) -> list[tuple[str, str]]:
        """(field, reason) for what this compiler cannot build as declared (refused
        at load time)."""
        return []

    def families(self, model: Model, override: str = "") -> tuple[str, ...]:
        """The QAIRT families one model builds, "" for the compiler's own ((): its own only);
        `override`: the command line's `qairt=`. Raises ValueError naming the field."""
        return ()

    @abstractmethod
    def identity(self, chip: Chip | None = None) -> dict:
        """Tool build id (of `chip`'s QAIRT family where a compiler builds several): part of the
        settings of every task whose output the compiler decides."""

    def tool_files(self, chip: Chip | None = None) -> list[str]:
        """Files whose bytes decide its outputs (compiler and simulator libraries): every task
        whose output the compiler decides lists them in its file_dep, so changed bytes rebuild
        under the same version."""
        return []

    @abstractmethod
    def sdk_version(self, chip: Chip | None = None) -> str:
        """The QAIRT version of the compiler: the runtime libraries must come from
        the same family."""

    def sdk_root(self) -> str | None:
        """An SDK folder holding the device libraries (lib/aarch64-android,
        lib/hexagon-v*), if any."""
        return None

    @abstractmethod
    def runtime_view(self, graph: Graph) -> dict:
        """{"inputs"/"outputs": [[name, shape, dtype]]} as the runtime sees the compiled graph:
        names, layouts and dtypes after the compiler, in declaration order, from the spec alone."""

    @abstractmethod
    def simulator(self, model: Model, graph: Graph, chip: Chip, tier: str) -> tuple:
        """(factory, kwargs): factory(**kwargs) in the verify worker returns run(feeds) -> outputs
        for the compiled binary on the x86 HTP simulator, in ONNX names and layouts."""

    def piece_runner(self, model: Model, graph: Graph, chip: Chip) -> tuple | None:
        """(factory, kwargs): factory(piece=<onnx path>, **kwargs) in the diagnose worker compiles a
        cut of the graph as the graph itself is compiled and returns run(feeds) on the simulator;
        None when this compiler cannot (the diagnose stage then has no task for the model)."""
        return None

    @abstractmethod
    def verify_settings(self, model: Model, chip: Chip, tier: str) -> dict:
        """What besides the checks decides a verify result (runner, options, tool)."""

    @abstractmethod
    def verify_runner_name(self) -> str:
        """How `doit list` names the simulator runner."""

    @abstractmethod
    def host_libraries(self) -> dict:
        """{"backend_lib", "system_lib"}: the x86_64 QNN libraries that open this compiler's
        binaries (None: the ones of the onnxruntime-qnn wheel)."""

    @abstractmethod
    def runtime_libraries(self, chip: Chip) -> dict:
        """What an app ships next to one chip's binaries (recorded in the manifest)."""

    def manifest_sources(self, model: Model, chip: Chip) -> dict:
        """Extra records of this compiler a chip's manifest includes: {section: {graph: path}}."""
        return {}


@dataclass(frozen=True)
class Project:
    """The models and chips of one build folder, each model's compiler and this run's options: what
    every stage's tasks() reads (toolchain/project.py loads it)."""

    models: tuple[Model, ...]
    chips: dict[str, Chip]
    # a loaded model's `compiler` (resolved: never "auto") -> its class
    compilers: dict[str, Compiler]
    full_chips: tuple[str, ...]   # full verification tier asked for on the command line
    # models whose deployed runtime's own loop is their full tier (deploy/sherpa.py)
    gated: frozenset = frozenset()
    # this run's settings (toolchain/options.py), resolved once when dodo.py loads
    options: Options = Options({})
    # data_files(), per folder
    listed: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def compiler(self, model: Model) -> Compiler:
        """The compiler that builds `model`."""
        return self.compilers[model.compiler]

    def data_files(self, model: Model) -> list[str]:
        """Every file of the model's data folder (its checks depend on all of them), listed once per
        load: the checks of every chip ask (100 listings made a no-op `doit` of the shipped models
        20 ms slower)."""
        if model.data_dir not in self.listed:
            self.listed[model.data_dir] = modeldata.data_files(model.data_dir)
        return list(self.listed[model.data_dir])

    def models_of(self, compiler: str) -> list[Model]:
        """The models that build with `compiler` (a compiler's own stages take only these)."""
        return [m for m in self.models if m.compiler == compiler]

    def model_chips(self, compiler: str | None = None) -> Iterator[tuple[Model, Chip]]:
        """(model, chip) for every chip a model targets (of one compiler's models, if given), once
        per QAIRT family it builds: a non-default family's chip carries it (chip.family; its tasks
        are named @<CHIP>+qairt<family>)."""
        for model in self.models if compiler is None else self.models_of(compiler):
            for family in model.qairt or ("",):
                for name in model.chips:
                    chip = self.chips[name]
                    yield model, (dataclasses.replace(chip, family=family) if family else chip)

    def graph_chips(self, compiler: str | None = None) -> Iterator[tuple[Model, Graph, Chip]]:
        """(model, graph, chip) for every compiled binary."""
        for model, chip in self.model_chips(compiler):
            for graph in model.graphs:
                yield model, graph, chip

    def wants_full_tier(self, model: Model, chip: Chip) -> bool:
        return chip.name in self.full_chips or chip.name in model.verify.full_chips

    def runtime_gate(self, model: Model) -> bool:
        """The deployed runtime's loop checks this model (sherpa:), and is its
        full tier (sherpa_full:)."""
        return model.name in self.gated
