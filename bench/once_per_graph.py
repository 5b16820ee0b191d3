"""A lean script build of a project for all its chips (a measurement's baseline, not the tool): each
chip-independent step once (export, simplify, parity, convert, ...), each chip's steps once per
chip, one after another, every heavy step in a fresh Python process (the QNN EP numbers tensors per
process, so a compile in a process that made sessions before writes other bytes: one compile per
fresh process). No dependency graph, no state, nothing skipped: the steps in pipeline order, as a
hand-written CI script would run them. The work and the tools are those of the doit build: the same
stage functions, called with the arguments its tasks give them.

    python bench/once_per_graph.py <project folder> [stage,stage,...]

bench/same_work.py runs it against doit and against the per-chip script (bench/sherpa_style.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from sherpa_style import STEPS, steps

from toolchain import options
from toolchain import project as projects
from toolchain.engine.run import external, worker

# the child: the step's function by its qualified name, its arguments as JSON on stdin
CHILD = ("import json, sys; from toolchain.engine.run import worker; "
         "step = worker._function(sys.argv[1]); step(**worker.from_json(sys.stdin.read()))")


def main(folder: str, names=STEPS) -> int:
    os.chdir(folder)
    project = projects.load("models", options.resolve())
    for task in steps(project, names):
        for action in task["actions"]:
            function, args, kwargs = (tuple(action) + ({},))[:3]
            # a heavy step: a fresh process of its own, output to its log
            if function is worker.run:
                step, kw, log = args
                os.makedirs(os.path.dirname(log), exist_ok=True)
                with open(log, "w") as out:
                    done = subprocess.run(
                        [sys.executable, "-c", CHILD, worker.qualified(step)],
                        input=json.dumps(worker.to_json(kw)),
                        text=True,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, "PYTHONPATH": folder},
                    )
                if done.returncode:
                    print(f"{task['name']}: failed, see {log}", file=sys.stderr)
                    return 1
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
    sys.exit(
        main(os.path.abspath(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else STEPS)
    )
