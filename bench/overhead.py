"""Where the time of a build goes, on a real model (a measurement, not a test):

    python bench/overhead.py [--model whisper-tiny.en] [--stage compile] [--out bench/results]

In a fresh clone of this checkout's HEAD (so the build is cold and nothing here is touched), builds
`<stage>:<model>/*` and what it needs twice: serially (`doit -n 1`) and with the default parallelism,
cleaning in between. Reports the wall time of each, the load average before each, the seconds the tools
themselves took (the `seconds` of export.json and *.compile.json: torch.onnx.export and the EP's compile),
the seconds every step's own process took (`# exit N after S s` in the step logs: imports and onnxsim
included), and the ratios: wall / in-tool, wall / step processes, serial / parallel. Writes
<out>/overhead-<model>.json."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXIT = re.compile(r"# exit \d+ after ([\d.]+) s")


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def build(folder: Path, selection: str, jobs: list[str]) -> dict:
    before = load()
    started = time.monotonic()
    done = subprocess.run(["doit", *jobs, selection], cwd=folder, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in ("QNN_JOBS", "QNN_CACHE")})
    wall = time.monotonic() - started
    if done.returncode:
        sys.exit(f"doit {' '.join(jobs)} {selection} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    ran = sum(1 for line in done.stdout.splitlines() if line.startswith(".  "))
    return {"wall_s": round(wall, 1), "load_before": before, "tasks_run": ran}


def seconds(folder: Path, model: str) -> dict:
    build_dir = folder / "build" / model
    tool = {"export": sum(json.loads(p.read_text())["seconds"] for p in build_dir.glob("*/export.json")),
            "compile": sum(json.loads(p.read_text())["seconds"] for p in build_dir.glob("*/*/*.compile.json"))}
    steps = sum(float(m.group(1)) for p in build_dir.rglob("*.log") for m in EXIT.finditer(p.read_text(errors="replace")))
    return {"in_tool_s": {k: round(v, 1) for k, v in tool.items()}, "step_processes_s": round(steps, 1)}


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--model", default="whisper-tiny.en")
    args.add_argument("--stage", default="compile")
    args.add_argument("--out", default=str(ROOT / "bench" / "results"))
    opts = args.parse_args()
    selection = f"{opts.stage}:{opts.model}/*"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "checkout"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
        runs = {}
        for name, jobs in (("serial", ["-n", "1"]), ("default", [])):
            subprocess.run(["doit", "clean", "-a", selection], cwd=folder, capture_output=True)
            subprocess.run(["rm", "-rf", str(folder / "build")])
            runs[name] = {**build(folder, selection, jobs), **seconds(folder, opts.model)}
    serial = runs["serial"]
    in_tool = sum(serial["in_tool_s"].values())
    result = {"model": opts.model, "selection": selection, "cores": os.cpu_count(), "runs": runs,
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(),
              "ratios": {"serial_wall_over_in_tool": round(serial["wall_s"] / in_tool, 2),
                         "serial_wall_over_step_processes": round(serial["wall_s"] / serial["step_processes_s"], 2),
                         "serial_over_default": round(serial["wall_s"] / runs["default"]["wall_s"], 2)}}
    out = Path(opts.out) / f"overhead-{opts.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, run in runs.items():
        print(f"{name:8} wall {run['wall_s']:6.1f} s (load {run['load_before']}), {run['tasks_run']} tasks; in-tool "
              f"{run['in_tool_s']}; step processes {run['step_processes_s']} s")
    print(f"ratios {result['ratios']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
