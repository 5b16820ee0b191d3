"""The loader of the Project every stage is handed (toolchain/stages/__init__.py): all model specs,
the chip table and the compiler each model builds with. The one place that joins the wings: each
model's compiler is resolved and checked here, before any task runs."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from toolchain import spec
from toolchain.compilers import registry
from toolchain.deploy import sherpa
from toolchain.engine.options import Options
from toolchain.errors import SpecError
from toolchain.rewrites import library as rewrites
from toolchain.shared import modelcode
from toolchain.spec import AUTO
from toolchain.spec import chips as chip_table
from toolchain.stages import Compiler, Project


def load(models_dir: str | Path, options: Options) -> Project:
    """Load every models/*.toml (and models/extra/*.toml with options["extra"]: opt-in models, too
    slow for every build on 2 cores; models/corpus/*.toml with options["corpus"]: real models from
    packages); options["full"]: the chips of the full tier; options["qairt"]: the command line's
    QAIRT families or runtime versions (comma list, 'all'), for every model that can take them
    (toolchain/options.py)."""
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
        # the model file against the model-code protocol: no typo, no hook missing
        modelcode.check(model)
    models, found = with_compilers(models, chips, options)
    return Project(models=models, chips=chips, compilers=found, full_chips=wanted,
                   gated=frozenset(m.name for m in models if sherpa.wanted(m, found[m.compiler])),
                   options=options)


def spec_files(folder: Path) -> list[Path]:
    """The folder's *.toml, without editor and OS droppings (.#x.toml lock links, ._x.toml macOS
    companions, x.toml~ backups, hidden files), each skipped one said on stderr."""
    found = []
    for path in sorted(folder.glob("*.toml*")):
        if path.name.startswith((".", "#")) or not path.name.endswith(".toml"):
            if path.name.endswith((".toml", ".toml~", ".toml#")):
                print(
                    f"{path}: skipped (an editor's or the OS's file, not a spec)", file=sys.stderr
                )
            continue
        found.append(path)
    return found


def with_compilers(models, chips: dict, options: Options) -> tuple[tuple, dict[str, Compiler]]:
    """Each model with its compiler: "auto" resolved (and said on stdout, with the reason),
    the name checked, what the compiler cannot build refused, each compiler preflighted once
    for its models."""
    auto = (
        registry.choose_auto(options["sdk"]) if any(m.compiler == AUTO for m in models) else None
    )
    qairt = options["qairt"]
    if auto:
        print(f'compiler = "auto" -> {auto[0]}: {auto[1]}')
    instances: dict[str, Compiler] = {}
    resolved = []
    for model in models:
        name = auto[0] if auto and model.compiler == AUTO else model.compiler
        if name not in registry.REGISTRY:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, registry.REGISTRY, n=1)
            hint = (
                f"did you mean '{close[0]}'?"
                if close
                else f"known: {', '.join([*registry.REGISTRY, AUTO])}"
            )
            raise SpecError(f"{model.spec_file}: compiler: unknown compiler {name!r}; {hint}")
        compiler = instances.setdefault(name, registry.REGISTRY[name]())
        for field, reason in compiler.spec_problems(model):
            raise SpecError(f"{model.spec_file}: {field}: {reason} (compiler {name})")
        model = dataclasses.replace(model, compiler=name)
        try:
            families = compiler.families(model, qairt)
        except ValueError as err:
            raise SpecError(str(err)) from None
        resolved.append(dataclasses.replace(model, qairt=families))
    for name, compiler in instances.items():
        compiler.preflight([m for m in resolved if m.compiler == name], chips, options)
    return tuple(resolved), instances
