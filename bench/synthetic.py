"""Benchmarks of the build on this machine (measurements, not tests), each a ratio from one run:

1. no-op `doit`: the shipped models, and synthetic projects of tiny graphs up to 20 models
x 10 chips;
2. orchestration overhead: a clean build's wall time vs the time its steps spent in their tools;
3. `doit -n 2` vs serial on the chip fan-out;
4. our build vs bench/sherpa_style.py (every step from scratch per chip) for 1, 5 and 10 chips;
5. a warm-cache build in a second checkout vs the cold build that filled the cache.

    python bench/synthetic.py [--out bench/results]

prints a table and writes synthetic.md, synthetic.json and synthetic.png (matplotlib) to --out.
Heavy parts use the test model (tests/fixtures/tinynet.py); every project is a temp folder with its
own copy of toolchain/."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from projects import (
    ALL_CHIPS,
    EXIT,
    FP16_CHIPS,
    RESTORED,
    ROOT,
    checkout,
    count_tasks,
    cpu_of,
    doit,
    fill,
    make_project,
    noop,
    same_outputs,
    tool_seconds,
)


def bench_noop(work: Path, rows: list, data: dict) -> None:
    shipped = work / "shipped"
    shipped.mkdir()
    shutil.copy(ROOT / "dodo.py", shipped / "dodo.py")
    shutil.copytree(ROOT / "models", shipped / "models", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "toolchain", shipped / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
    )
    fill(shipped)
    run, tasks = noop(shipped), count_tasks(shipped)
    models = sorted(p.stem for p in (shipped / "models").glob("*.toml"))
    data["noop_shipped"] = {
        "seconds": run.wall,
        "cpu": run.cpu,
        "tasks": tasks,
        "executed": len(run.executed),
        "models": models,
    }
    rows.append(
        (
            "no-op doit, shipped models",
            f"{run.wall:.2f} s ({run.cpu:.2f} s CPU)",
            f"{run.wall:.2f}x the 1 s goal",
            f"{tasks} tasks ({', '.join(models)}); {len(run.executed)} ran",
        )
    )
    data["noop_growth"] = []
    for models, chips in ((1, 1), (5, 5), (10, 10), (20, 10)):
        root = make_project(
            work / f"synthetic-{models}x{chips}", models, ALL_CHIPS[:chips], w8a16=True
        )
        fill(root)
        run = noop(root)
        data["noop_growth"].append(
            {
                "models": models,
                "chips": chips,
                "tasks": count_tasks(root),
                "seconds": run.wall,
                "cpu": run.cpu,
                "executed": len(run.executed),
            }
        )
    first, last = data["noop_growth"][0], data["noop_growth"][-1]
    per_task = (last["cpu"] - first["cpu"]) / (last["tasks"] - first["tasks"]) * 1000
    rows.append(
        (
            "no-op doit, 20 models x 10 chips (w8a16)",
            f"{last['seconds']:.2f} s ({last['cpu']:.2f} s CPU)",
            f"{last['cpu'] / first['cpu']:.1f}x the CPU of 1x1",
            f"{last['tasks']} tasks vs {first['tasks']}: {per_task:.2f} ms CPU per extra task; "
            f"{last['executed']} ran",
        )
    )


def bench_build(work: Path, rows: list, data: dict) -> None:
    cold = make_project(work / "cold", 2, FP16_CHIPS[:2], names=["tiny", "tiny2"])
    cache = work / "cache"
    run = doit(cold, cache=cache)
    inside, steps = tool_seconds(cold)
    data["overhead"] = {
        "wall": run.wall,
        "tools_wall": inside,
        "steps": steps,
        "tasks": len(run.executed),
        "own_cpu": run.own_cpu,
        "tools_cpu": run.tools_cpu,
    }
    rows.append(
        (
            "orchestration overhead, clean build 2x2",
            f"{run.wall:.1f} s wall, {inside:.1f} s in step processes",
            f"{(run.wall - inside) / run.wall:.1%} of wall",
            f"{steps} steps, {len(run.executed)} tasks; an empty cache filled on the way",
        )
    )
    rows.append(
        (
            "  same build, CPU",
            f"{run.own_cpu:.1f} s doit vs {run.tools_cpu:.1f} s steps",
            f"{run.own_cpu / run.cpu:.1%} in doit",
            "doit: loading, scheduling, state DB, cache, "
            "in-process checks; steps: every process they started",
        )
    )
    again = noop(cold)
    data["noop_tiny_real"] = {
        "seconds": again.wall,
        "cpu": again.cpu,
        "executed": len(again.executed),
    }
    rows.append(
        (
            "no-op doit after that real build",
            f"{again.wall:.2f} s ({again.cpu:.2f} s CPU)",
            f"{again.wall:.2f}x the 1 s goal",
            f"{len(run.executed)} tasks; {len(again.executed)} ran",
        )
    )
    warm_root = checkout(cold, work / "warm")
    warm = doit(warm_root, cache=cache)
    restored = sum(RESTORED in p.read_text() for p in (warm_root / "build").rglob("*.log"))
    data["cache"] = {"cold": run.wall, "warm": warm.wall, "cold_cpu": run.cpu, "warm_cpu": warm.cpu,
                     "restored": restored, "identical": same_outputs(cold, warm_root)}
    rows.append(
        (
            "warm cache, second checkout vs cold",
            f"{warm.wall:.1f} s vs {run.wall:.1f} s ({warm.cpu:.1f} vs {run.cpu:.1f} s CPU)",
            f"{run.wall / warm.wall:.0f}x faster",
            f"{restored} heavy steps restored; outputs identical: {data['cache']['identical']}",
        )
    )


def bench_parallel(work: Path, rows: list, data: dict) -> None:
    chips = FP16_CHIPS[:8]
    base = make_project(work / "fanout", 1, chips)
    doit(base, "parity:tiny", "inspect:tiny/net")   # the chip-independent part, once
    runs = {}
    for label, args in (("serial", ()), ("-n 2", ("-n", "2")),
                        ("-n 2 limits=compile:2", ("-n", "2", "limits=compile:2"))):
        root = work / f"fanout-{len(runs)}"
        shutil.copytree(base, root, symlinks=True)
        runs[label] = (doit(root, *args), root)
    serial = runs["serial"][0]
    data["parallel"] = {k: v[0].wall for k, v in runs.items()} | {
        "cpu": {k: v[0].cpu for k, v in runs.items()}, "chips": len(chips),
        "identical": same_outputs(runs["serial"][1], runs["-n 2"][1])}
    for label in ("-n 2", "-n 2 limits=compile:2"):
        run = runs[label][0]
        rows.append((f"{label} vs serial, fan-out 1 model x {len(chips)} chips",
                     f"{run.wall:.1f} s vs {serial.wall:.1f} s", f"{serial.wall / run.wall:.2f}x",
                     ("compile 1 slot (default)" if label == "-n 2" else "2 compiles at once")
                     + f"; CPU {run.cpu:.0f} vs {serial.cpu:.0f} s; "
                       f"outputs identical: {data['parallel']['identical']}"))


def bench_script(work: Path, rows: list, data: dict) -> None:
    data["script"] = []
    for count in (1, 5, 10):
        chips = ALL_CHIPS[:count]
        root = make_project(work / f"ours-{count}", 1, chips, w8a16=True)
        ours, steps = doit(root), tool_seconds(root)[1]
        wall = cpu = 0.0
        for chip in chips:
            root = make_project(work / f"script-{count}-{chip}", 1, [chip], w8a16=True)
            w, c = cpu_of([sys.executable, str(ROOT / "bench/sherpa_style.py"), str(root)])
            wall, cpu = wall + w, cpu + c
        data["script"].append(
            {
                "chips": count,
                "ours": ours.wall,
                "script": wall,
                "ours_cpu": ours.cpu,
                "script_cpu": cpu,
                "steps": steps,
            }
        )
        rows.append(
            (
                f"ours vs per-chip script, {count} chip(s)",
                f"{ours.cpu:.0f} s vs {cpu:.0f} s CPU ({ours.wall:.0f} vs {wall:.0f} s wall)",
                f"{cpu / ours.cpu:.2f}x",
                "w8a16 tiny: chip-independent work once vs once per chip",
            )
        )
    one = data["script"][0]
    per_step = (one["ours_cpu"] - one["script_cpu"]) / one["steps"]
    data["step_process_cpu"] = per_step
    rows.append(
        (
            "  cost of a step process",
            f"{per_step:.1f} s CPU",
            f"x {one['steps']} steps at 1 chip",
            "(ours - script) / steps at 1 chip: a fresh Python and its imports (torch, onnx, "
            "onnxruntime) "
            "per step, where the script pays them once",
        )
    )


def bench_projection(rows: list, data: dict, build: Path = ROOT / "build") -> None:
    """Ours vs per-chip script for real models, projected from the step times of this checkout's own
    build/ logs (not measured here): chip-independent seconds C once, vs C again for every chip."""
    data["projection"] = {}
    for model in sorted(p for p in build.iterdir() if p.is_dir()) if build.is_dir() else []:
        shared, per_chip = 0.0, {}
        for log in model.rglob("*.log"):
            found = EXIT.search(log.read_text(errors="replace"))
            if not found or RESTORED in log.read_text(errors="replace"):
                continue
            chip = next(
                (part for part in log.relative_to(model).parts[:-1] if part in ALL_CHIPS), None
            )
            if chip:
                per_chip.setdefault(chip, []).append(float(found.group(1)))
            else:
                shared += float(found.group(1))
        done = [
            sum(v)
            for c, v in per_chip.items()
            if (model / log_dir(model, c) / "verify.log").is_file()
        ]
        if not done or not shared:
            continue
        chip = statistics.mean(done)
        data["projection"][model.name] = {
            "chip_independent": shared,
            "per_chip": chip,
            "chips_seen": len(done),
        }
        ratios = ", ".join(
            f"{m}: {m * (shared + chip) / (shared + m * chip):.2f}x" for m in (1, 5, 10)
        )
        rows.append(
            (
                f"projection, {model.name}",
                f"{shared:.0f} s once + {chip:.0f} s per chip",
                ratios,
                f"script / ours from this checkout's build logs ({len(done)} chips), not measured",
            )
        )


def log_dir(model: Path, chip: str) -> str:
    """The chip folder under a model (build/<model>/<toolchain>/<CHIP>), relative to the model."""
    found = next(model.glob(f"*/{chip}"), None)
    return str(found.relative_to(model)) if found else chip


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 5, figsize=(22, 4.2))
    growth = data["noop_growth"]
    ax[0].plot(
        [g["tasks"] for g in growth],
        [g["seconds"] for g in growth],
        "o-",
        label="synthetic (models x chips)",
    )
    ax[0].plot(
        [g["tasks"] for g in growth],
        [g["cpu"] for g in growth],
        "o--",
        c="#888",
        label="same, CPU s",
    )
    for g in growth:
        ax[0].annotate(f"{g['models']}x{g['chips']}", (g["tasks"], g["seconds"]), fontsize=8)
    ax[0].plot(
        [data["noop_shipped"]["tasks"]],
        [data["noop_shipped"]["seconds"]],
        "s",
        label="shipped models",
    )
    ax[0].axhline(1.0, ls="--", c="grey", lw=1)
    ax[0].set(title="no-op doit (wall; CPU dashed)", xlabel="tasks", ylabel="s")
    ax[0].legend(fontsize=8)
    o = data["overhead"]
    ax[1].bar(["steps", "doit"], [o["tools_cpu"], o["own_cpu"]], color=["#2c6fbb", "#c0392b"])
    ax[1].set(
        title=f"clean build 2x2: {o['own_cpu'] / (o['own_cpu'] + o['tools_cpu']):.0%} of CPU in "
              "doit",
        ylabel="CPU s",
    )
    p = data["parallel"]
    labels = ["serial", "-n 2", "-n 2 limits=compile:2"]
    ax[2].bar(["serial", "-n 2", "-n 2\ncompile:2"], [p[k] for k in labels], color="#2c6fbb")
    ax[2].set(title=f"chip fan-out, {p['chips']} chips", ylabel="s")
    s = data["script"]
    ax[3].plot([x["chips"] for x in s], [x["ours_cpu"] for x in s], "o-", label="doit build")
    ax[3].plot([x["chips"] for x in s], [x["script_cpu"] for x in s], "o-", label="per-chip script")
    ax[3].set(title="ours vs sherpa-style script", xlabel="chips", ylabel="CPU s")
    ax[3].legend(fontsize=8)
    c = data["cache"]
    ax[4].bar(["cold", "warm (2nd checkout)"], [c["cold"], c["warm"]], color=["#888", "#2a7d2e"])
    ax[4].set(title=f"shared cache: {c['cold'] / c['warm']:.0f}x", ylabel="s")
    fig.suptitle(f"qnn-npu-compile on {data['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench/results"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
        "load_before": os.getloadavg()[0],
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="qnn-bench-") as tmp:
        for part in (bench_noop, bench_build, bench_parallel, bench_script):
            started = time.perf_counter()
            part(Path(tmp), rows, data)
            print(
                f"[{part.__name__}: {time.perf_counter() - started:.0f} s]",
                file=sys.stderr,
                flush=True,
            )
    bench_projection(rows, data)
    data["load_after"] = os.getloadavg()[0]
    table = ["| measurement | value | ratio | note |", "|---|---|---|---|"] + [
        f"| {' | '.join(r)} |" for r in rows
    ]
    text = (
        f"# Benchmarks\n\n{data['machine']}; 1-min load average {data['load_before']:.1f} before, "
        f"{data['load_after']:.1f} after (other work on the machine inflates every time).\n\n"
        + "\n".join(table)
        + "\n"
    )
    print(text)
    (out / "synthetic.md").write_text(text)
    (out / "synthetic.json").write_text(json.dumps(data, indent=2) + "\n")
    try:
        plot(data, out / "synthetic.png")
    except ImportError:
        print(
            "matplotlib is not installed (pip install matplotlib): no synthetic.png",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

