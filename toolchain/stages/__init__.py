"""The compiler-independent doit stages (one module each) and the record that names a stage.

A stage module has `tasks(project)` yielding doit task dicts; what a compiler does differently it asks of
`model.backend` (toolchain/backends/base.py), never of the compiler's name. The ordered list of every
stage, backends' included, is toolchain/pipeline.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# What one task of a stage is per, which decides its name and the `model:` / `chip:` aliases it joins.
# qairt: per QAIRT family
# what a later step does with a stage's outputs: reads and checks them (data), believes them (result: a check's
# record, a bundle shipped as built), or runs them (code); engine/cache/__init__.py's KINDS
OUTPUT_KINDS = ("data", "result", "code")
SCOPES = ("model", "graph", "graph@chip", "model@chip", "toolchain@chip", "qairt", "build", "phone")


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: its doit task group, how it makes its tasks and what a step costs."""

    name: str                  # doit's task group name: `doit <name>`, `<name>:<model>/<graph>@<CHIP>`
    tasks: Callable            # tasks(project) -> doit task dicts (or one dict)
    doc: str                   # one line for `doit list`
    scope: str                 # one of SCOPES
    default: bool = True       # part of a plain `doit` (and of the model:/chip: aliases)
    threads: int = 1           # cores one step keeps busy (the x86 HTP simulator runs ~2 threads)
    memory_gb: float = 0.5     # peak memory of one step, measured (limits.slots_for sizes the slots from both)
    pool: str = ""             # stages whose steps share one set of slots (every simulator stage: "simulator")
    # "code" when a later step compiles, links, loads or imports the outputs (a QNN graph's C source, a model
    # library): such outputs are rebuilt here, never taken from a shared cache (docs/scale.md, "Trust");
    # "result" when no later step checks them (a check's record, a bundle): restored only from a signed entry
    output_kind: str = "data"

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"stage {self.name}: scope {self.scope!r} is not one of {SCOPES}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(f"stage {self.name}: output_kind {self.output_kind!r} is not one of {OUTPUT_KINDS}")
