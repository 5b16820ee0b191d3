#!/usr/bin/env python3
"""What the stamp memo (ctime and inode beside size and mtime: toolchain/engine/state/stamps.py)
costs a no-op `doit`: the full task graph of the models shipped at the commit before (both trees the
same graph), its doit state filled as after a real build (projects.fill), timed with the toolchain
of a commit before the memo and with this one, runs alternating so both see the same machine.

    python bench/noop_stamps.py [--before 3127870] [--runs 7]

Writes bench/results/noop-stamps.json. Run it alone; the load average is recorded."""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from projects import ROOT, count_tasks, doit, fill  # noqa: E402


def tree(dst: Path, rev: str, own_toolchain: bool) -> Path:
    """The models shipped at `rev` (the same task graph for both), with the toolchain of `rev` or of
    the working tree (`own_toolchain`)."""
    dst.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "toolchain", "dodo.py", "models"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dst, filter="data")
    if own_toolchain:
        shutil.rmtree(dst / "toolchain")
        shutil.copytree(
            ROOT / "toolchain", dst / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy(ROOT / "dodo.py", dst / "dodo.py")
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="3127870")
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="qnn-noop-"))
    trees = {
        "before": tree(work / "before", args.before, False),
        "after": tree(work / "after", args.before, True),
    }
    for root in trees.values():
        fill(root)
        # the first no-op after filling: learns the stamps (after) / warms the page cache (both)
        doit(root)
    walls = {name: [] for name in trees}
    cpus = {name: [] for name in trees}
    loads = [os.getloadavg()]
    for _ in range(args.runs):
        for name, root in trees.items():
            run = doit(root)
            assert not run.executed, run.executed
            walls[name].append(run.wall)
            cpus[name].append(run.cpu)
        loads.append(os.getloadavg())
    data = {"tasks": count_tasks(trees["after"]), "runs": args.runs, "before_commit": args.before,
            "median_wall": {n: round(statistics.median(w), 3) for n, w in walls.items()},
            "median_cpu": {n: round(statistics.median(c), 3) for n, c in cpus.items()},
            "walls": {n: [round(x, 3) for x in w] for n, w in walls.items()},
            "load_average": [[round(x, 2) for x in load] for load in loads],
            "stamps_file_bytes": os.path.getsize(trees["after"] / "build/.stamps.json")}
    data["after_vs_before"] = round(data["median_wall"]["after"] / data["median_wall"]["before"], 3)
    # a tree built by the commit before, then this toolchain: nothing runs; the first no-op reads
    # every file once
    old = trees["before"]
    shutil.rmtree(old / "toolchain")
    shutil.copytree(
        ROOT / "toolchain", old / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
    )
    first, second = doit(old), doit(old)
    data["upgrade"] = {
        "first_noop": {"seconds": round(first.wall, 3), "executed": first.executed},
        "second_noop": {"seconds": round(second.wall, 3), "executed": second.executed},
    }
    out = ROOT / "bench/results/noop-stamps.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
