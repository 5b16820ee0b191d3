"""Where the time of a build goes, on a real model (a measurement, not a test):

    python bench/overhead.py [--model whisper-tiny.en] [--stage compile] [--out bench/results]

In a fresh clone of this checkout's HEAD (so the build is cold and nothing here is touched), builds
`<stage>:<model>/*` and what it needs, cleaning in between:
- serial (`doit -n 1`), every step a fork of the fork server (the default);
- serial with `workers=fresh` (every step a new interpreter, as before the fork server);
- the default (parallel) run, filling a shared cache; then a second clone restores it
all (warm cache); - the per-chip script (bench/sherpa_style.py, one folder and one process per chip,
running the stages the
  doit selection ran, the same stage functions so the same compile options), chips
  one after another.
Reports each wall time with the load average before it, the seconds the tools themselves took
(export.json, onnxsim's line in the simplify log, *.compile.json, the parity step: PyTorch and
onnxruntime on the CPU), the seconds every step's process took (`# exit N after S s`), and the
ratios. Writes <out>/overhead-<model>.json."""
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
EXIT = re.compile(r"# exit \d+ after ([\d.]+) s")
ONNXSIM = re.compile(r"^onnxsim: ([\d.]+) s$", re.M)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def build(folder: Path, selection: str, jobs: list[str]) -> dict:
    before = load()
    started = time.monotonic()
    done = subprocess.run(["doit", *jobs, selection], cwd=folder, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("QNN_JOBS", "QNN_CACHE", "QNN_WORKERS")})
    wall = time.monotonic() - started
    if done.returncode:
        sys.exit(
            f"doit {' '.join(jobs)} {selection} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    ran = [line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")]
    return {"wall_s": round(wall, 1), "load_before": before, "tasks_run": len(ran),
            "stages": sorted({name.split(":")[0] for name in ran})}


def seconds(folder: Path, model: str) -> dict:
    build_dir = folder / "build" / model
    tool = {
        "export": sum(
            json.loads(p.read_text())["seconds"] for p in build_dir.glob("*/export.json")
        ),
        "onnxsim": sum(
            float(m.group(1))
            for p in build_dir.glob("*/*.simplify.log")
            for m in ONNXSIM.finditer(p.read_text(errors="replace"))
        ),
        # parity runs PyTorch and onnxruntime: its step's time (a fork: no imports) is tool time
        "parity": sum(
            float(m.group(1))
            for p in build_dir.glob("parity.log")
            for m in EXIT.finditer(p.read_text(errors="replace"))
        ),
        "compile": sum(
            json.loads(p.read_text())["seconds"] for p in build_dir.glob("*/*/*.compile.json")
        ),
    }
    steps = sum(float(m.group(1)) for p in build_dir.rglob("*.log")
                for m in EXIT.finditer(p.read_text(errors="replace")))
    return {
        "in_tool_s": {k: round(v, 1) for k, v in tool.items()},
        "step_processes_s": round(steps, 1),
    }


def per_chip_script(folder: Path, model: str, stages: list[str], work: Path) -> dict:
    """bench/sherpa_style.py once per chip of `model`, each in a fresh folder whose spec
    lists that chip."""
    spec = folder / "models" / f"{model}.toml"
    text = spec.read_text()
    chips = re.search(r"^chips = \[(.*)\]$", text, re.M).group(1)
    runs, before = {}, load()
    for chip in [c.strip().strip('"') for c in chips.split(",")]:
        job = work / f"job-{chip}"
        shutil.copytree(
            folder / "models", job / "models", ignore=shutil.ignore_patterns("*.toml", "extra")
        )
        (job / "models" / spec.name).write_text(
            re.sub(r"^chips = \[.*\]$", f'chips = ["{chip}"]', text, flags=re.M)
        )
        started = time.monotonic()
        subprocess.run(
            [sys.executable, str(folder / "bench" / "sherpa_style.py"), str(job), ",".join(stages)],
            cwd=folder,
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(folder)},
        )
        runs[chip] = round(time.monotonic() - started, 1)
    return {"wall_s": round(sum(runs.values()), 1), "load_before": before, "per_chip_s": runs}


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--model", default="whisper-tiny.en")
    args.add_argument("--stage", default="compile")
    args.add_argument("--out", default=str(ROOT / "bench" / "results"))
    opts = args.parse_args()
    selection = f"{opts.stage}:{opts.model}/*"
    with tempfile.TemporaryDirectory() as tmp:
        folder, cache = Path(tmp) / "checkout", Path(tmp) / "cache"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
        runs = {}
        for name, jobs in (("serial", ["-n", "1"]), ("serial_fresh", ["-n", "1", "workers=fresh"]),
                           ("default", [f"cache={cache}"])):
            subprocess.run(["rm", "-rf", str(folder / "build")])
            runs[name] = {**build(folder, selection, jobs), **seconds(folder, opts.model)}
        warm = Path(tmp) / "warm"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(warm)], check=True)
        runs["warm_cache"] = build(warm, selection, [f"cache={cache}"])
        runs["per_chip_script"] = per_chip_script(
            folder, opts.model, runs["serial"]["stages"], Path(tmp)
        )
    serial = runs["serial"]
    in_tool = sum(serial["in_tool_s"].values())
    result = {
        "model": opts.model,
        "selection": selection,
        "cores": os.cpu_count(),
        "runs": runs,
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "ratios": {
            "serial_wall_over_in_tool": round(serial["wall_s"] / in_tool, 2),
            "serial_wall_over_step_processes": round(
                serial["wall_s"] / serial["step_processes_s"], 2
            ),
            "fresh_over_forked_serial": round(runs["serial_fresh"]["wall_s"] / serial["wall_s"], 2),
            "serial_over_default": round(serial["wall_s"] / runs["default"]["wall_s"], 2),
            "script_over_serial": round(runs["per_chip_script"]["wall_s"] / serial["wall_s"], 2),
            "script_over_default": round(
                runs["per_chip_script"]["wall_s"] / runs["default"]["wall_s"], 2
            ),
            "warm_over_cold": round(runs["warm_cache"]["wall_s"] / runs["default"]["wall_s"], 3),
        },
    }
    out = Path(opts.out) / f"overhead-{opts.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, run in runs.items():
        print(
            f"{name:15} wall {run['wall_s']:6.1f} s (load {run['load_before']}); in-tool "
            f"{run.get('in_tool_s')}; "
            f"step processes {run.get('step_processes_s')} s"
        )
    print(f"ratios {result['ratios']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
