"""A sherpa-onnx-style build of a project for its one chip, from scratch: what one job of a per-SoC CI
matrix does (peers.md §A7). Every step runs in sequence in this one process, with no dependency graph
and nothing reused from another chip's job. The work and the tools are those of the doit build: the
same stage functions, called with the arguments dodo.py's tasks give them.

    python bench/sherpa_style.py <project folder>     (its models/*.toml list exactly one chip)

bench/bench.py runs it once per chip, each time in a fresh folder, against one doit build of all chips."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys

import toolchain.calibrate
import toolchain.checkpoint
import toolchain.compile
import toolchain.export
import toolchain.inspect
import toolchain.manifest
import toolchain.parity
import toolchain.project
import toolchain.quantize
import toolchain.simplify
import toolchain.verify
from toolchain import worker


def steps(project):
    """The task dicts of one build, in the order a script would run them."""
    for module in (toolchain.checkpoint, toolchain.export, toolchain.simplify, toolchain.inspect,
                   toolchain.parity, toolchain.calibrate, toolchain.quantize, toolchain.compile):
        yield from module.tasks(project)
    yield from toolchain.verify.tasks(project, "default")
    yield from toolchain.manifest.tasks(project)


def main(folder: str) -> int:
    os.chdir(folder)
    project = toolchain.project.load("models")
    if len({c for m in project.models for c in m.chips}) != 1:
        print(f"{folder}: the models must list exactly one chip (one CI job = one chip)", file=sys.stderr)
        return 2
    for task in steps(project):
        for action in task["actions"]:
            function, args, kwargs = (tuple(action) + ({},))[:3]
            if function is worker.run:   # a heavy step: here, in this process, output to its log
                name, kw, log = args
                module, _, attr = name.partition(":")
                os.makedirs(os.path.dirname(log), exist_ok=True)
                with open(log, "w") as out, contextlib.redirect_stdout(out):
                    getattr(importlib.import_module(module), attr)(**kw)
            elif function(*args, **kwargs) not in (None, True):
                print(f"{task['name']}: failed", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
