"""The first `doit` of the shipped models, as the README's first command runs it (a measurement, not
a test): in a fresh clone of this checkout's HEAD, `doit` with the defaults (parallel, steps forked
from the fork server). Reports the wall time with the load average before it, the seconds every
step's own process took (`# exit N after S s` in the step logs), and the seconds inside the tools,
from the records: export (torch.onnx.export), onnxsim, convert (QNN Saver), modellib (gcc), compile
(per chip), verify (simulator and CPU reference), and, from their steps' times (forks: no imports),
parity (PyTorch and CPU) and the sherpa-onnx loop. Writes <out>/first-build.json.

    python bench/first_build.py [--out bench/results] [--commit REV --name first-build-REV]

--commit builds another commit of this repository the same way (a baseline measured on the same
machine, in the same hour: the machine's speed varies between sessions by up to 2x)."""
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
EXIT = re.compile(r"^# exit \d+ after ([\d.]+) s$", re.M)
ONNXSIM = re.compile(r"^onnxsim: ([\d.]+) s$", re.M)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def records(build: Path, pattern: str) -> float:
    return sum(json.loads(p.read_text()).get("seconds", 0) for p in build.glob(pattern))


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args.add_argument("--commit", help="build this commit instead of HEAD")
    args.add_argument("--name", default="first-build", help="result file name (without .json)")
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "checkout"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
        if opts.commit:
            subprocess.run(["git", "checkout", "-q", opts.commit], cwd=folder, check=True)
        before, started = load(), time.monotonic()
        # PYTHONPATH: the clone's own toolchain, not the editable install's (its finder would win
        # in doit's process)
        env = {k: v for k, v in os.environ.items() if k not in ("QNN_JOBS", "QNN_CACHE", "CI")}
        done = subprocess.run(["doit"], cwd=folder, capture_output=True, text=True,
                              env={**env, "PYTHONPATH": str(folder)})
        wall = time.monotonic() - started
        if done.returncode:
            sys.exit(f"doit failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        build = folder / "build"
        logs = [p.read_text(errors="replace") for p in build.rglob("*.log")]
        steps = sum(float(s) for text in logs for s in EXIT.findall(text))
        tools = {
            "export": records(build, "*/*/export.json"),
            "onnxsim": sum(float(s) for text in logs for s in ONNXSIM.findall(text)),
            # the design card's route (issue 20)
            "convert": records(build, "*/*/*/*.convert.json"),
            "modellib": records(build, "*/*/*/*.modellib.json"),
            "compile": records(build, "*/*/*/*.compile.json"),
            "parity": sum(
                float(s) for p in build.glob("*/parity.log") for s in EXIT.findall(p.read_text())
            ),
            "verify": records(build, "*/*/*/verify.json"),
            # the sherpa loop's record has no own timing: its step's process time (a
            # fork: no imports)
            "sherpa": sum(
                float(s)
                for p in build.glob("*/*/*/sherpa-run*.log")
                for s in EXIT.findall(p.read_text())
            ),
        }
        ran = sum(1 for line in done.stdout.splitlines() if line.startswith(".  "))
    result = {
        "wall_s": round(wall, 1),
        "load_before": before,
        "cores": os.cpu_count(),
        "tasks_run": ran,
        "step_processes_s": round(steps, 1),
        "in_tool_s": {k: round(v, 1) for k, v in tools.items()},
        "in_tool_total_s": round(sum(tools.values()), 1),
        "commit": subprocess.run(
            ["git", "rev-parse", opts.commit or "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    out = Path(opts.out) / f"{opts.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
