"""The build as GitHub Actions matrices: chip-independent tasks once per model (phase
"models"), chip tasks per (model, chip) (phase "chips"); every job runs `doit <its tasks>`
against one shared cache.

    python -m toolchain.matrix --phase models|chips [--max-jobs 256] [name=value ...]

prints {"include": [{"name": ..., "units": ..., "tasks": ...}, ...]}. A matrix holds at most
--max-jobs jobs (GitHub's limit is 256 per matrix): above it, units sorted by (model, chip)
are cut into consecutive runs of ceil(units / max-jobs), so a job holds few units, mostly
chips of one model."""
from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import sys
from pathlib import Path

from doit.exceptions import InvalidDodoFile, InvalidTask

GITHUB_LIMIT = 256


def load_tasks(dodo: str = "dodo.py", variables: tuple[str, ...] = ()) -> tuple[list, list[str]]:
    """(the doit tasks, DOIT_CONFIG's default_tasks) of dodo.py with these `name=value` variables (a
    dodo reads them from doit's command line, sys.argv, as `doit name=value` gives them)."""
    from doit import loader
    os.chdir(Path(dodo).resolve().parent)   # the dodo's paths are relative to its folder
    argv, sys.argv = sys.argv, ["doit", *variables]
    try:
        namespace = runpy.run_path(Path(dodo).name)
    finally:
        sys.argv = argv
    return loader.load_tasks(namespace), namespace.get("DOIT_CONFIG", {}).get("default_tasks", [])


def units(tasks, stages: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({model: chip-independent task names}, {model@CHIP: chip task names}) of the given stages,
    in doit's order, by whom each task is built for (its meta's owner, stages.named): a chip task's
    unit is its model and chip (and QAIRT family, `model@CHIP+qairt2.49`), another's its model. A
    task of a QAIRT family alone (its environment) is that family's unit (`qairt2.49`). A task that
    is nobody's subtask (report) belongs to the final `doit` job."""
    models: dict[str, list[str]] = {}
    chips: dict[str, list[str]] = {}
    for task in tasks:
        stage = task.name.partition(":")[0]
        owner = (task.meta or {}).get("owner")
        if task.subtask_of is None or stage not in stages or not task.actions or not owner:
            continue
        who = owner.get("model") or owner.get("compiler") or f"qairt{owner['family']}"
        if "chip" in owner:
            family = f"+qairt{owner['family']}" if owner.get("family") else ""
            chips.setdefault(f"{who}@{owner['chip']}{family}", []).append(task.name)
        else:
            models.setdefault(who, []).append(task.name)
    return models, chips


def jobs(groups: dict[str, list[str]], max_jobs: int = GITHUB_LIMIT) -> list[dict]:
    """Matrix entries: one unit per job, or consecutive runs of units when there are
    more than max_jobs."""
    names = sorted(groups)
    size = max(1, math.ceil(len(names) / max_jobs))
    entries = []
    for start in range(0, len(names), size):
        run = names[start:start + size]
        entries.append(
            {
                "name": run[0] + (f" +{len(run) - 1}" if len(run) > 1 else ""),
                "units": " ".join(run),
                "tasks": " ".join(t for unit in run for t in groups[unit]),
            }
        )
    return entries


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolchain.matrix", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--phase", choices=("models", "chips"), required=True)
    parser.add_argument("--max-jobs", type=int, default=GITHUB_LIMIT)
    parser.add_argument("--dodo", default="dodo.py")
    parser.add_argument(
        "variables", nargs="*", metavar="name=value", help="doit variables, e.g. full=SM8750"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.max_jobs <= GITHUB_LIMIT:
        parser.error(f"--max-jobs must be 1..{GITHUB_LIMIT}, got {args.max_jobs}")
    if any("=" not in v for v in args.variables):
        parser.error(f"variables are name=value, got {args.variables}")
    try:
        models, chips = units(*load_tasks(args.dodo, tuple(args.variables)))
    except (InvalidDodoFile, InvalidTask) as err:   # a spec error: one line, as doit prints it
        print(f"ERROR: {err}", file=sys.stderr)
        return 3
    print(json.dumps({"include": jobs(models if args.phase == "models" else chips, args.max_jobs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
