"""Alias tasks `chip:<CHIP>` and `model:<name>`: a misspelt name fails (exit 3) where a
wildcard that matches nothing would silently succeed."""

QAIRT_GRAPH_STAGES = ("convert", "modellib", "pagesize")   # QAIRT models only; per chip: the next three
QAIRT_CHIP_STAGES = ("htpconfig", "context", "readback")
GRAPH_STAGES = ("export", "simplify", "inspect", "calibrate", "quantize", *QAIRT_GRAPH_STAGES, *QAIRT_CHIP_STAGES,
                "compile")   # named <model>/<graph>[@<CHIP>]
CHIP_STAGES = (*QAIRT_CHIP_STAGES, "compile", "verify", "manifest", "sherpa")


def chip_tasks(project):
    for chip in project.chips.values():
        if any(chip.name in m.chips for m in project.models):
            yield {"name": chip.name, "doc": f"every model's tasks for {chip.name}",
                   "task_dep": [f"{stage}:*@{chip.name}" for stage in CHIP_STAGES], "actions": None}


def model_tasks(project):
    from toolchain import parity
    for model in project.models:
        # Patterns end in "/*" or "@*", so model "tiny" never picks up model "tiny2".
        exact = ([f"checkpoint:{model.name}"] if model.checkpoint else []) + \
                ([f"parity:{model.name}"] if parity.available(model) else [])
        yield {"name": model.name, "doc": f"every task of {model.name} (toolchain {model.toolchain})",
               "task_dep": exact + [f"{stage}:{model.name}/*" for stage in GRAPH_STAGES] +
                           [f"{stage}:{model.name}@*" for stage in CHIP_STAGES], "actions": None}
