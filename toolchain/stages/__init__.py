"""The compiler-independent doit stages (one module each) and the record that names a stage.

A stage module has `tasks(project)` yielding doit task dicts; what a compiler does differently it asks of
`model.backend` (toolchain/backends/base.py), never of the compiler's name. The ordered list of every
stage, backends' included, is toolchain/pipeline.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# What one task of a stage is per, which decides its name and the `model:` / `chip:` aliases it joins.
# qairt: per QAIRT family
SCOPES = ("model", "graph", "graph@chip", "model@chip", "toolchain@chip", "qairt", "build", "phone")


@dataclass(frozen=True)
class Stage:
    name: str                  # doit's task group name: `doit <name>`, `<name>:<model>/<graph>@<CHIP>`
    tasks: Callable            # tasks(project) -> doit task dicts (or one dict)
    doc: str                   # one line for `doit list`
    scope: str                 # one of SCOPES
    default: bool = True       # part of a plain `doit` (and of the model:/chip: aliases)
    threads: int = 1           # cores one step keeps busy (the x86 HTP simulator runs ~2 threads)
    memory_gb: float = 0.5     # peak memory of one step, measured (limits.slots_for sizes the slots from both)
    pool: str = ""             # stages whose steps share one set of slots (every simulator stage: "simulator")

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"stage {self.name}: scope {self.scope!r} is not one of {SCOPES}")
