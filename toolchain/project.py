"""All model specs, the chip table and the compiler each model builds with: what every stage is handed.
The one place that joins the wings: spec records get their backend here, checked before any task runs."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from toolchain import backends, spec
from toolchain.backends.base import Backend
from toolchain.deploy import sherpa_run
from toolchain.engine.options import Options
from toolchain.errors import SpecError
from toolchain.rewrites import library as rewrites
from toolchain.shared import modelcode, modeldata
from toolchain.spec import AUTO
from toolchain.spec import chips as chip_table


@dataclass(frozen=True)
class Project:
    """The models and chips of one build folder, and this run's options: what every stage's tasks() reads."""

    models: tuple[spec.Model, ...]
    chips: dict
    full_chips: tuple[str, ...]   # full verification tier asked for on the command line
    gated: frozenset = frozenset()   # models whose deployed runtime's own loop is their full tier (sherpa_run)
    options: Options = Options({})   # this run's settings (toolchain/options.py), resolved once when dodo.py loads
    listed: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)   # data_files(), per data folder

    def data_files(self, model) -> list[str]:
        """Every file of the model's data folder (its checks depend on all of them), listed once per load:
        the checks of every chip ask (100 listings made a no-op `doit` of the shipped models 20 ms slower)."""
        if model.data_dir not in self.listed:
            self.listed[model.data_dir] = modeldata.data_files(model.data_dir)
        return list(self.listed[model.data_dir])

    def models_of(self, toolchain: str):
        """The models that build with `toolchain` (a compiler's own stages take only these)."""
        return [m for m in self.models if m.toolchain == toolchain]

    def model_chips(self, toolchain: str | None = None):
        """(model, chip) for every chip a model targets (of one compiler's models, if given), once per QAIRT family
        it builds: a non-default family's chip carries it (chip.family; its tasks are named @<CHIP>+qairt<family>)."""
        for model in self.models if toolchain is None else self.models_of(toolchain):
            for family in model.qairt or ("",):
                for name in model.chips:
                    chip = self.chips[name]
                    yield model, (dataclasses.replace(chip, family=family) if family else chip)

    def graph_chips(self, toolchain: str | None = None):
        """(model, graph, chip) for every compiled binary."""
        for model, chip in self.model_chips(toolchain):
            for graph in model.graphs:
                yield model, graph, chip

    def wants_full_tier(self, model, chip) -> bool:
        return chip.name in self.full_chips or chip.name in model.verify["full_chips"]

    def runtime_gate(self, model) -> bool:
        """The deployed runtime's loop checks this model (sherpa:), and is its full tier (sherpa_full:)."""
        return model.name in self.gated


def load(models_dir: str | Path, options: Options) -> Project:
    """Load every models/*.toml (and models/extra/*.toml with options["extra"]: opt-in models, too slow for
    every build on 2 cores; models/corpus/*.toml with options["corpus"]: real models from packages);
    options["full"]: the chips of the full tier; options["qairt"]: the command line's QAIRT
    families or runtime versions (comma list, 'all'), for every model that can take them (toolchain/options.py)."""
    extra, wanted = options["extra"], options["full"]
    chips = chip_table.load()
    files = spec_files(Path(models_dir)) + (spec_files(Path(models_dir, "extra")) if extra else [])
    files += spec_files(Path(models_dir, "corpus")) if options["corpus"] else []
    models = tuple(m for f in files for m in spec.load_file(f, chips))
    names = [m.name for m in models]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"{models_dir}: two specs make a model named {name!r} "
                            "(a variant label repeats a file name)")
    for model in models:   # the rule names a spec gives (the spec reads the value's shape only)
        for graph in model.graphs:
            problem = rewrites.problems(graph.rewrite) if graph.rewrite else ""
            if problem:
                raise SpecError(f"{model.spec_file}: graphs.{graph.name}.rewrite: {problem}")
        modelcode.check(model)   # the model file against the model-code protocol: no typo, no hook missing
    models = with_backends(models, chips, options)
    return Project(models=models, chips=chips, full_chips=wanted,
                   gated=frozenset(m.name for m in models if sherpa_run.wanted(m)), options=options)


def spec_files(folder: Path) -> list[Path]:
    """The folder's *.toml, without editor and OS droppings (.#x.toml lock links, ._x.toml macOS
    companions, x.toml~ backups, hidden files), each skipped one said on stderr."""
    found = []
    for path in sorted(folder.glob("*.toml*")):
        if path.name.startswith((".", "#")) or not path.name.endswith(".toml"):
            if path.name.endswith((".toml", ".toml~", ".toml#")):
                print(f"{path}: skipped (an editor's or the OS's file, not a spec)", file=sys.stderr)
            continue
        found.append(path)
    return found


def with_backends(models, chips: dict, options: Options) -> tuple:
    """Each model with its compiler: "auto" resolved (and said on stdout, with the reason), the name
    checked, what the compiler cannot build refused, each compiler preflighted once for its models."""
    auto = backends.choose_auto(options["sdk"]) if any(m.toolchain == AUTO for m in models) else None
    qairt = options["qairt"]
    if auto:
        print(f'toolchain = "auto" -> {auto[0]}: {auto[1]}')
    instances: dict[str, Backend] = {}
    resolved = []
    for model in models:
        name = auto[0] if auto and model.toolchain == AUTO else model.toolchain
        if name not in backends.REGISTRY:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, backends.REGISTRY, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join([*backends.REGISTRY, AUTO])}"
            raise SpecError(f"{model.spec_file}: toolchain: unknown compiler {name!r}; {hint}")
        backend = instances.setdefault(name, backends.REGISTRY[name]())
        for field, reason in backend.spec_problems(model):
            raise SpecError(f"{model.spec_file}: {field}: {reason} (toolchain {name})")
        model = dataclasses.replace(model, toolchain=name, backend=backend)
        try:
            families = backend.families(model, qairt)
        except ValueError as err:
            raise SpecError(str(err)) from None
        resolved.append(dataclasses.replace(model, qairt=families))
    for name, backend in instances.items():
        backend.preflight([m for m in resolved if m.toolchain == name], chips, options)
    return tuple(resolved)
