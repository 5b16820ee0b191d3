"""A sherpa-onnx-style build of a project for its one chip, from scratch: what one job of a per-SoC
CI matrix does (k2-fsa/sherpa-onnx .github/workflows/export-*-qnn.yaml). Every step runs in sequence
in this one process, with no dependency graph and nothing reused from another chip's job. The work
and the tools are those of the doit build: the same stage functions, called with the arguments
dodo.py's tasks give them.

    python bench/sherpa_style.py <project folder> [stage,stage,...]   (its models/*.toml list
    exactly one chip)

With a stage list, only those stages run (bench/overhead.py gives the stages its
doit selection ran).

bench/bench.py runs it once per chip, each time in a fresh folder, against one doit build
of all chips."""
from __future__ import annotations

import contextlib
import os
import sys

from toolchain import options, pipeline
from toolchain import project as projects
from toolchain.engine.run import external, worker

STEPS = (
    "checkpoint",
    "export",
    "simplify",
    "inspect",
    "parity",
    "calibrate",
    "quantize",
    "compile",
    "verify",
    "manifest",
)   # what a per-chip CI script runs, in pipeline order


def steps(project, names=STEPS):
    """The task dicts of one build, in the order a script would run them."""
    for stage in pipeline.STAGES:
        if stage.name in names:
            made = stage.tasks(project)
            yield from [made] if isinstance(made, dict) else made


def main(folder: str, names=STEPS) -> int:
    os.chdir(folder)
    project = projects.load("models", options.resolve())
    if len({c for m in project.models for c in m.chips}) != 1:
        print(
            f"{folder}: the models must list exactly one chip (one CI job = one chip)",
            file=sys.stderr,
        )
        return 2
    for task in steps(project, names):
        for action in task["actions"]:
            function, args, kwargs = (tuple(action) + ({},))[:3]
            if function is worker.run:   # a heavy step: here, in this process, output to its log
                step, kw, log = args
                os.makedirs(os.path.dirname(log), exist_ok=True)
                with open(log, "w") as out, contextlib.redirect_stdout(out):
                    step(**kw)
            # an external tool (modellib's cc): its run, without doit's task
            elif function is external.action:
                if external.run(*args[:5]) is not None:
                    print(f"{task['name']}: failed, see {args[2]}", file=sys.stderr)
                    return 1
            elif function(*args, **kwargs) not in (None, True):
                print(f"{task['name']}: failed", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else STEPS))
