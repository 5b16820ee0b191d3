"""The benchmarks the README quotes, in one window (measurements, not tests), every figure with the
load average before it:

1. the same work against scripts (bench/same_work.py): the shipped Whisper tiny.en for its
five chips, checkpoint
   to context binaries with the CPU parity, as the 30 s pair and as shipped (with its windows): the
   per-chip script (sherpa-onnx style), the once-per-graph script, `doit -n 1` and `doit`;
2. the first full build of the shipped models (`doit` as the README's first command runs it, in a
fresh copy of
   this checkout) against its floor (every process's CPU seconds over the cores), with
   its critical path;
3. the no-op `doit` after it (the median of 5).

    python bench/bench.py [--out bench/results] [--skip first-build] [--variants pair,shipped]

prints a table and writes bench.md and bench.json to --out (the figures they held before:
CHANGES.md). The synthetic projects of tiny graphs (no-op growth, overhead, fan-out, warm cache) are
bench/synthetic.py's."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import same_work
from noop import shipped

ROOT = same_work.ROOT


def first_build(work: Path) -> dict:
    # this checkout's models and toolchain, its uncommitted changes too
    folder = shipped(work / "first-build")
    result = same_work.timed([sys.executable, "-c", same_work.DOIT], folder)
    result["floor"] = round(result["cpu"] / os.cpu_count(), 1)
    events = json.loads((folder / "build/trace.json").read_text())["traceEvents"]
    result["tasks_run"] = sum(1 for e in events if e["ph"] == "X" and e.get("cat") != "wait")
    result["noop"] = noop(folder)
    return result


def noop(folder: Path, runs: int = 5) -> dict:
    walls, loads = [], []
    for _ in range(runs):
        loads.append(same_work.load())
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", same_work.DOIT],
            cwd=folder,
            env=same_work.environment(folder),
            capture_output=True,
            text=True,
        )
        walls.append(time.perf_counter() - started)
        if done.returncode or any(line.startswith(".  ") for line in done.stdout.splitlines()):
            raise RuntimeError(
                f"the no-op ran something or failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    return {"median": round(statistics.median(walls), 3), "runs": [round(w, 3) for w in walls],
            "load_before": loads}


# the ways each variant is built (bench/same_work.py); the once-per-graph script on the 30 s pair
# only, where the serial build is held to it
WAYS = {"pair": ["script", "lean", "serial", "default"], "shipped": ["script", "serial", "default"]}


def build_rows(data: dict) -> list[tuple[str, str, str, str]]:
    if "first_build" not in data:
        return []
    f, n = data["first_build"], data["first_build"]["noop"]
    return [
        (
            "first full build, shipped models (`doit`)",
            f"{f['wall']:.1f} s ({f['cpu']:.0f} s CPU)",
            f"{f['wall'] / f['floor']:.2f}× its floor ({f['floor']} s)",
            f"load {f['load_before']:.2f} before; {f['tasks_run']} tasks ran; "
            + (same_work.short(f["critical_path"]) if f.get("critical_path")
               else "no critical path line"),
        ),
        (
            "no-op `doit` after it",
            f"{n['median']:.3f} s (median of {len(n['runs'])})",
            f"{n['median'] / 0.30:.2f}× the 0.30 s bar",
            f"runs {', '.join(map(str, n['runs']))}; load {min(n['load_before']):.2f}–"
            f"{max(n['load_before']):.2f} before",
        ),
    ]


def write(out: Path, data: dict, rows: list, stamp: bool = True) -> None:
    if stamp:
        data["ended"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # parts measured apart say when each
    when = data.get("windows") or f"{data['started']} to {data['ended']}"
    text = (f"# Benchmarks\n\n{data['machine']}; {when}, run alone (`python "
            f"bench/bench.py`).\n\n{table(rows)}")
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps(data, indent=1) + "\n")


def table(rows) -> str:
    return ("| measurement | value | ratio | note |\n|---|---|---|---|\n"
            + "".join(f"| {' | '.join(r)} |\n" for r in rows))


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args.add_argument(
        "--skip", default="", help="comma-separated parts to leave out: same-work, first-build"
    )
    args.add_argument("--variants", default="pair,shipped")
    args.add_argument(
        "--render",
        action="store_true",
        help="rewrite bench.md from --out's bench.json, measuring "
        "nothing (after a change to how rows are written)",
    )
    opts = args.parse_args()
    if opts.render:
        data = json.loads((Path(opts.out) / "bench.json").read_text())
        write(
            Path(opts.out),
            data,
            [*same_work.rows(data.get("same_work", {})), *build_rows(data)],
            stamp=False,
        )
        print((Path(opts.out) / "bench.md").read_text())
        return 0
    skip = set(filter(None, opts.skip.split(",")))
    data: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    rows: list = []
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "same-work" not in skip:
            same_work.KEEP = out
            data["same_work"] = same_work.measure(opts.variants.split(","), WAYS, Path(tmp))
            rows += same_work.rows(data["same_work"])
            # each part as it ends: an interrupted run keeps what it measured
            write(out, data, rows)
        if "first-build" not in skip:
            data["first_build"] = first_build(Path(tmp))
            rows += build_rows(data)
            write(out, data, rows)
    print((out / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
