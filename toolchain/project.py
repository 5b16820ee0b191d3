"""All model specs plus the chip table: what dodo.py hands to each stage."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolchain import chips as chip_table
from toolchain import spec
from toolchain.spec import SpecError


@dataclass(frozen=True)
class Project:
    models: tuple[spec.Model, ...]
    chips: dict
    full_chips: tuple[str, ...]   # full verification tier asked for on the command line
    qairt_sdk: object = None      # qairt.Sdk, preflighted, when a model builds with the QAIRT SDK

    def toolchain_models(self, toolchain: str):
        """The models that build with `toolchain` (the other toolchain's stages skip them)."""
        return [m for m in self.models if m.toolchain == toolchain]

    def model_chips(self):
        """(model, chip) for every chip a model targets."""
        for model in self.models:
            for name in model.chips:
                yield model, self.chips[name]

    def graph_chips(self):
        """(model, graph, chip) for every compiled binary."""
        for model, chip in self.model_chips():
            for graph in model.graphs:
                yield model, graph, chip

    def wants_full_tier(self, model, chip) -> bool:
        return chip.name in self.full_chips or chip.name in dict(model.verify)["full_chips"]


def load(models_dir: str | Path = "models", full: str = "", extra: bool = False) -> Project:
    """Load every models/*.toml (and models/extra/*.toml with `extra`: opt-in models, too slow for
    every build on 2 cores); `full` is a comma list of chips ('all' for every chip) for the full tier."""
    chips = chip_table.load()
    files = sorted(Path(models_dir).glob("*.toml")) + (sorted(Path(models_dir, "extra").glob("*.toml")) if extra else [])
    models = tuple(m for f in files for m in spec.load_file(f, chips))
    names = [m.name for m in models]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"{models_dir}: two specs make a model named {name!r} (a variant label repeats a file name)")
    wanted = tuple(c for c in full.split(",") if c)
    if wanted == ("all",):
        wanted = tuple(chips)
    for name in wanted:
        if name not in chips:
            raise SpecError(f"command line: full={full}: unknown chip {name!r}; known: {', '.join(chips)}")
    from toolchain import qairt
    users = [m for m in models if m.toolchain == qairt.NAME]
    sdk = qairt.preflight(users, chips) if users else None   # before any task runs
    return Project(models=models, chips=chips, full_chips=wanted, qairt_sdk=sdk)
