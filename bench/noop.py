#!/usr/bin/env python3
"""What a no-op `doit` (everything up to date) costs: the shipped models (models/*.toml) and a
generated project of 20 models x 10 chips (the test model, w8a16), each with its doit state filled
as after a real build (projects.fill: no stage runs), timed several times; the median wall and CPU
time, and the load average before each run.

    python bench/noop.py [--runs 7] [--before REV] [--profile] [--out FILE]
    /path/to/venv/bin/python bench/noop.py ...   # the same, in another environment (a user's venv)

--before REV also times the same projects with the toolchain (and dodo.py) of REV, runs alternating
so both see the same machine. --profile then adds the median time of each phase of a no-op (PHASES)
to noop.json, and writes where one no-op of the shipped project spends its time (cProfile through
the same harness, and `python -X importtime`) to bench/results/noop-profile.txt. "doit-floor" is a
one-task doit project without the toolchain: what any no-op costs on this machine, so the
toolchain's share is the difference. Goals (issue 33): <= 0.3 s wall for the shipped project, <= 1 s
for 20 x 10. Writes bench/results/noop.json; run it alone (the load average is recorded). The floor
depends on the environment (doit scans every installed distribution for plugins; an editable install
adds an import finder to every start), so the record names the interpreter and counts them."""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from projects import ALL_CHIPS, DOIT, ROOT, count_tasks, doit, environment, fill, make_project  # noqa: E402

GOALS = {"shipped": 0.3, "synthetic-20x10": 1.0}   # seconds of wall time
# The floor: a doit project of one up-to-date task and no toolchain. What any no-op costs on this
# machine (Python's start with its site-packages, doit's imports, doit's scan of every installed
# distribution for plugins), timed beside the others so the toolchain's own share is the difference.
FLOOR_DODO = ('"""One task with one input, up to date after the first run."""\n\n\n'
              'def task_floor():\n    return {"actions": None, "file_dep": ["dodo.py"]}\n')
PROFILE = (
    "import cProfile, pstats, sys; p = cProfile.Profile(); p.enable(); from doit.doit_cmd import "
    "DoitMain; "
    "rc = DoitMain().run(sys.argv[1:]); p.disable(); s = pstats.Stats(p, stream=sys.stderr); "
    "s.sort_stats('cumulative').print_stats(40); s.sort_stats('tottime').print_stats(25); "
    "sys.exit(rc)"
)
IMPORT_TIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$", re.M)
# One no-op in phases, in its own process: doit's imports, the toolchain's, the dodo (project, task
# dicts), doit's setup (plugins, Task objects), its up-to-date checks (Dependency.get_status) and
# the rest of its run (state DB, reporter). The interpreter's own start is `python -c pass`.
PHASES = r"""
import json, os, runpy, time
started = time.perf_counter()
from doit import dependency, runner
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
marks = {"import doit": time.perf_counter()}
import toolchain.tasks
marks["import toolchain"] = time.perf_counter()
namespace = runpy.run_path("dodo.py")
marks["dodo: project and task dicts"] = time.perf_counter()
spent = {"run_all": 0.0, "get_status": 0.0}

def timed(owner, name):
    real = getattr(owner, name)
    def wrapper(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - begun
    setattr(owner, name, wrapper)

timed(runner.Runner, "run_all")
timed(dependency.Dependency, "get_status")
with open(os.devnull, "w") as out:
    main = DoitMain(ModuleTaskLoader(namespace), config_filenames=(),
                    extra_config={"GLOBAL": {"outfile": out}})
    rc = main.run([])
ended, last, found = time.perf_counter(), started, {}
for name, at in marks.items():
    found[name], last = at - last, at
found["doit setup: plugins, Task objects"] = ended - last - spent["run_all"]
found["up-to-date checks (get_status)"] = spent["get_status"]
found["rest of the run: state DB, reporter"] = spent["run_all"] - spent["get_status"]
print(json.dumps({"rc": rc, "seconds": found}))
"""


def shipped(root: Path) -> Path:
    """The shipped models with this checkout's dodo.py and toolchain."""
    root.mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", root / "dodo.py")
    for name in ("models", "toolchain"):
        shutil.copytree(
            ROOT / name, root / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def with_toolchain_of(src: Path, dst: Path, rev: str) -> Path:
    """A copy of the project `src` (not yet filled: its state names its toolchain's files) whose
    toolchain and dodo.py are those of commit `rev`."""
    shutil.copytree(src, dst, symlinks=True)
    shutil.rmtree(dst / "toolchain")
    archive = subprocess.run(
        ["git", "archive", rev, "toolchain", "dodo.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dst, filter="data")
    return dst


def time_noops(trees: dict[str, Path], runs: int) -> dict:
    """`runs` no-op runs of each tree, alternating; the load average (1 min) is read
    before each run."""
    for root in trees.values():
        # the first no-op after filling learns the stamps and warms the page cache: not counted
        doit(root)
    found: dict = {name: {"walls": [], "cpus": [], "load_before": []} for name in trees}
    for _ in range(runs):
        for name, root in trees.items():
            load = os.getloadavg()[0]
            run = doit(root)
            assert not run.executed, f"{name}: not a no-op, ran {run.executed}"
            found[name]["walls"].append(round(run.wall, 3))
            found[name]["cpus"].append(round(run.own_cpu, 3))
            found[name]["load_before"].append(round(load, 2))
    for name, row in found.items():
        row["median_wall"] = round(statistics.median(row["walls"]), 3)
        row["median_cpu"] = round(statistics.median(row["cpus"]), 3)
        row["tasks"] = count_tasks(trees[name])
        goal = GOALS.get(name.split(" ")[0])
        if goal and " " not in name:
            row["goal_wall"], row["meets_goal"] = goal, row["median_wall"] <= goal
    return found


def phases(root: Path, runs: int = 5) -> dict:
    """Median seconds of each phase of a no-op in `root` (PHASES), and of the
    interpreter's own start."""
    env, found = environment(), {}
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        found.setdefault("python start (interpreter, site)", []).append(
            time.perf_counter() - started
        )
        done = subprocess.run(
            [sys.executable, "-c", PHASES], cwd=root, env=env, capture_output=True, text=True
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["rc"] == 0, done.stderr
        for name, seconds in result["seconds"].items():
            found.setdefault(name, []).append(seconds)
    return {name: round(statistics.median(values), 3) for name, values in found.items()}


def profile(root: Path, top: int = 25) -> str:
    """cProfile of one no-op in `root` (cumulative and own time), and its slowest
    imports (-X importtime)."""
    env = environment()
    done = subprocess.run(
        [sys.executable, "-c", PROFILE], cwd=root, env=env, capture_output=True, text=True
    )
    stats = done.stderr.strip()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", DOIT],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    imports = sorted(
        (
            (int(cum), len(indent) // 2, name)
            for _, cum, indent, name in IMPORT_TIME.findall(done.stderr)
        ),
        reverse=True,
    )
    heavy = [name for name in ("numpy", "onnx", "onnxruntime", "torch", "onnxsim")
             if any(n == name for _, _, n in imports)]
    lines = [
        f"-X importtime: {len(imports)} modules imported; heavy ones: {', '.join(heavy) or 'none'}",
        "slowest (cumulative us, depth, module):",
    ]
    lines += [f"  {cum:>8} {depth:>2} {name}" for cum, depth, name in imports[:top]]
    return "\n".join(lines) + "\n\ncProfile of one no-op:\n" + stats + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--before", help="also time the toolchain of this commit on the same projects")
    p.add_argument("--profile", action="store_true", help="write bench/results/noop-profile.txt")
    p.add_argument("--out", default=str(ROOT / "bench/results/noop.json"))
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="qnn-noop-"))
    trees = {
        "shipped": shipped(work / "shipped"),
        "synthetic-20x10": make_project(work / "synthetic-20x10", 20, ALL_CHIPS[:10], w8a16=True),
    }
    if args.before:
        for name, root in list(trees.items()):
            trees[f"{name} before"] = with_toolchain_of(root, work / f"{name}-before", args.before)
    for root in trees.values():
        fill(root)
    trees["doit-floor"] = work / "doit-floor"
    trees["doit-floor"].mkdir()
    (trees["doit-floor"] / "dodo.py").write_text(FLOOR_DODO)
    data = {
        "cores": os.cpu_count(),
        "runs": args.runs,
        "before_commit": args.before,
        "head": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "environment": {
            "python": sys.prefix,
            "distributions": len(list(metadata.distributions())),
            "path_files": sorted(
                p.name for p in Path(sysconfig.get_paths()["purelib"]).glob("*.pth")
            ),
        },
        "projects": time_noops(trees, args.runs),
    }
    out = Path(args.out)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for name, row in data["projects"].items():
        print(
            f"{name:28} {row['tasks']:5} tasks  wall {row['median_wall']:.3f} s  CPU "
            f"{row['median_cpu']:.3f} s  "
            f"load {min(row['load_before']):.2f}-{max(row['load_before']):.2f}"
            + (
                f"  goal {row['goal_wall']} s: {'met' if row['meets_goal'] else 'NOT met'}"
                if "goal_wall" in row
                else ""
            )
        )
    if args.profile:
        data["phases"] = {name: phases(trees[name]) for name in ("shipped", "synthetic-20x10")}
        (ROOT / "bench/results/noop-profile.txt").write_text(profile(trees["shipped"]))
        print(json.dumps(data["phases"], indent=1))
        print(f"profile: {ROOT / 'bench/results/noop-profile.txt'}")
    out.write_text(json.dumps(data, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
