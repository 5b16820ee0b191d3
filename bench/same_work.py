"""The same work four ways (a measurement, not a test): the shipped Whisper tiny.en for its five
chips, from the checkpoint to every chip's context binary with the CPU parity (stages checkpoint,
export, simplify, inspect, parity, convert, modellib, compile), as shipped (with its [windows]) and
as the 30 s pair alone (the windows removed from a copy of the spec):
- the per-chip script: bench/sherpa_style.py once per chip, each in a fresh folder, one after
another (what a
  per-SoC CI matrix does, on one machine);
- the once-per-graph script: bench/once_per_graph.py (each chip-independent step once, one fresh
process per step);
- `doit -n 1 compile parity` and `doit compile parity` (default jobs), each in a fresh folder.
Each figure with the load average before it; for doit, its CPU seconds (every process) over the
cores (the floor), and the critical path its trace printed.

    python bench/same_work.py [--variants pair,shipped] [--ways script,lean,serial,default]

returns the rows and data bench/bench.py writes; run alone as a script, it prints them."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "whisper-tiny.en"
STAGES = "checkpoint,export,simplify,inspect,parity,convert,modellib,compile"
DOIT = ("import sys; from doit.doit_cmd import DoitMain; sys.exit(DoitMain().run(sys.argv[1:]))")


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def project(folder: Path, variant: str, chips: list[str] | None = None) -> Path:
    """A folder with dodo.py, this checkout's toolchain/ and the model (its spec edited
    for the variant)."""
    (folder / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", folder / "dodo.py")
    shutil.copytree(
        ROOT / "toolchain", folder / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("whisper_npu.py",):
        shutil.copy(ROOT / "models" / name, folder / "models" / name)
    (folder / "models" / "data").symlink_to(ROOT / "models" / "data")
    text = (ROOT / "models" / f"{MODEL}.toml").read_text()
    if variant == "pair":
        text = text.split("\n[windows]")[0] + "\n"
    if chips:
        text = re.sub(
            r"^chips = \[.*\]$", f"chips = {json.dumps(chips)}", text, count=1, flags=re.M
        )
    (folder / "models" / f"{MODEL}.toml").write_text(text)
    return folder


def chips() -> list[str]:
    found = re.search(r"^chips = (\[.*\])$", (ROOT / "models" / f"{MODEL}.toml").read_text(), re.M)
    return json.loads(found.group(1)) if found else []


def environment(folder: Path) -> dict:
    drop = ("QNN_CACHE", "QNN_LIMITS", "QNN_JOBS", "CI", "PYTHONDONTWRITEBYTECODE")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(folder)}


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq). A step forked from doit's fork server is no waited-for child of doit, so getrusage
    misses it; the benchmark runs alone, so the machine's busy time over a run is that run's."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], folder: Path) -> dict:
    """wall and CPU seconds of a command that must succeed, the load before it, and the critical
    path it printed."""
    before, cpu0, started = load(), machine_cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=folder, env=environment(folder), capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, machine_cpu() - cpu0
    if done.returncode:
        raise RuntimeError(
            f"{' '.join(argv[:3])} in {folder} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    path = next(
        (line for line in done.stdout.splitlines() if line.startswith("critical path ")), None
    )
    return {
        "wall": round(wall, 1),
        "cpu": round(cpu, 1),
        "load_before": before,
        "critical_path": path,
    }


def run_way(way: str, variant: str, work: Path) -> dict:
    if way == "script":   # one fresh folder and process per chip, chips one after another
        runs = [
            timed(
                [sys.executable, str(ROOT / "bench/sherpa_style.py"), ".", STAGES],
                project(work / f"{variant}-script-{chip}", variant, [chip]),
            )
            for chip in chips()
        ]
        return {
            "wall": round(sum(r["wall"] for r in runs), 1),
            "cpu": round(sum(r["cpu"] for r in runs), 1),
            "load_before": runs[0]["load_before"],
            "per_chip": [r["wall"] for r in runs],
        }
    folder = project(work / f"{variant}-{way}", variant)
    if way == "lean":
        return timed([sys.executable, str(ROOT / "bench/once_per_graph.py"), ".", STAGES], folder)
    args = ["-n", "1"] if way == "serial" else []
    result = timed([sys.executable, "-c", DOIT, *args, "compile", "parity"], folder)
    events = json.loads((folder / "build/trace.json").read_text())["traceEvents"]
    ran = [e for e in events if e["ph"] == "X" and e.get("cat") != "wait"]
    lanes = {e["tid"] for e in ran}
    end = max(e["ts"] + e["dur"] for e in ran) / 1e6
    result.update(
        tasks=len(ran),
        lanes=len(lanes),
        busy_s=round(sum(e["dur"] for e in ran) / 1e6, 1),
        idle_lane_s=round(end * len(lanes) - sum(e["dur"] for e in ran) / 1e6, 1),
    )
    if KEEP:   # the trace itself, to open in a viewer
        shutil.copy(folder / "build/trace.json", KEEP / f"trace-{variant}-{way}.json")
    return result


KEEP: Path | None = None   # where bench/bench.py keeps each doit run's trace


def measure(variants, ways: dict, work: Path) -> dict:
    """`ways`: {variant: the ways to build it}."""
    data: dict = {"cores": os.cpu_count(), "model": MODEL, "chips": chips(), "stages": STAGES}
    for variant in variants:
        data[variant] = {}
        for way in ways[variant]:
            data[variant][way] = result = run_way(way, variant, work)
            print(
                f"{variant} {way}: {result['wall']} s wall, {result['cpu']} s CPU, load "
                f"{result['load_before']}",
                flush=True,
            )
        if "default" in data[variant]:
            data[variant]["floor"] = round(data[variant]["default"]["cpu"] / data["cores"], 1)
    return data


NAMES = {"script": "per-chip script (sherpa-onnx style)", "lean": "once-per-graph script",
         "serial": "`doit -n 1`", "default": "`doit` (default jobs)"}


def rows(data: dict) -> list[tuple[str, str, str, str]]:
    found = []
    for variant in ("pair", "shipped"):
        if variant not in data:
            continue
        runs, label = (
            data[variant],
            "30 s pair" if variant == "pair" else "as shipped (with windows)",
        )
        script, lean = runs.get("script"), runs.get("lean")
        for way, r in runs.items():
            if way == "floor":
                continue
            vs = (
                f"{script['wall'] / r['wall']:.2f}× the per-chip script"
                if script and way != "script"
                else ""
            )
            if lean and way == "serial":
                vs += f"; {r['wall'] / lean['wall']:.2f}× the once-per-graph script's wall"
            if way == "default":
                vs += (
                    f"; {r['wall'] / runs['floor']:.2f}× its floor ({runs['floor']} s = {r['cpu']} "
                    "s CPU ÷ "
                    f"{data['cores']} cores)"
                )
            found.append(
                (
                    f"{label}: {NAMES[way]}",
                    f"{r['wall']:.1f} s ({r['cpu']:.0f} s CPU)",
                    vs.lstrip("; "),
                    f"load {r['load_before']:.2f} before"
                    + (
                        f"; {short(r['critical_path'])}, {r['idle_lane_s']} s of lanes idle"
                        if r.get("critical_path")
                        else ""
                    ),
                )
            )
    return found


def short(line: str) -> str:
    """A critical path line cut to its length, its first and last steps and how many it has (the
    whole line is in bench.json and the kept trace)."""
    head, _, steps = line.partition(" wall: ")
    steps, _, tail = steps.rpartition("; ")
    parts = steps.replace(" ⇢ ", " → ").split(" → ")
    return f"{head} wall, {len(parts)} steps: {parts[0]} … {parts[-1]}; {tail}"


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--variants", default="pair,shipped")
    args.add_argument("--ways", default="script,lean,serial,default")
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants = opts.variants.split(",")
        data = measure(variants, {v: opts.ways.split(",") for v in variants}, Path(tmp))
    print(json.dumps(data, indent=1))
    for row in rows(data):
        print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
