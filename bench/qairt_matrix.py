"""The multi-QAIRT regression matrix: one model built for every QAIRT family on one chip, each verified on its own
family's simulator, and one table of what changed (binary size, compile s, simulator s per call, tensor error,
cosine, the model's own metric), with a flag on a family worse than the best (toolchain/stages/families.py, the
same rows the build report shows).

    python bench/qairt_matrix.py --model whisper-tiny.en --chip SM8750     # run alone: it times things
    -> bench/results/qairt-matrix-<model>-<chip>.json and .md

It runs `doit qairt=all manifest:<model>@<chip>[+qairt<family>]` in the checkout (the families' environments are
made by the build's own qairt_env tasks) and reads the manifests back; load average is recorded beside the wall."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolchain.backends.ort_qnn import families  # noqa: E402
from toolchain.stages import families as family_table  # noqa: E402
from toolchain.stages.report import table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    own = families.default().name
    tags = {name: "" if name == own else f"+qairt{name}" for name in families.table()}
    wanted = [f"manifest:{args.model}@{args.chip}{tag}" for tag in tags.values()]
    load = os.getloadavg()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "doit", "-n", "1", "qairt=all", *wanted], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
        return done.returncode
    folder = f"build/{args.model}/ort-qnn"
    manifests = {name: json.loads((ROOT / f"{folder}{'' if not tag else '-qairt' + name}/{args.chip}/manifest.json")
                                  .read_text()) for name, tag in tags.items()}
    rows = family_table.rows(list(manifests.values()))
    durations = _durations(args.model, args.chip, tags)
    result = {"model": args.model, "chip": args.chip, "wall_seconds": round(wall, 1), "load_average_at_start": load,
              "load_average_at_end": os.getloadavg(), "executed": [line[3:] for line in done.stdout.splitlines()
                                                                   if line.startswith(".  ")],
              "columns": list(family_table.COLUMNS), "rows": rows, "task_seconds": durations,
              "families": {name: {"build_id": m["sdk"]["build_id"], "tool": m["tools"]["compiler"],
                                  "binaries": {g: {k: b[k] for k in ("bytes", "sha256", "compile_seconds")}
                                               for g, b in m["binaries"].items()},
                                  "verify": {k: m["verify"]["default"][k] for k in ("tensors", "seconds")},
                                  "task": m["verify"]["default"].get("task", {}).get("summary")}
                           for name, m in manifests.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"qairt-matrix-{args.model}-{args.chip}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    text = (f"# {args.model} on {args.chip}, every QAIRT family\n\n{table(rows, family_table.COLUMNS)}\n"
            f"`python bench/qairt_matrix.py --model {args.model} --chip {args.chip}`: wall {wall:.0f} s for "
            f"{len(result['executed'])} tasks, load average {load[0]:.2f} at the start, "
            f"{result['load_average_at_end'][0]:.2f} at the end.\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


def _durations(model: str, chip: str, tags: dict) -> dict:
    """Seconds per task of this run's model and chip, from the build's own durations record (progress.py)."""
    path = ROOT / "build" / ".durations.json"
    if not path.is_file():
        return {}
    found = json.loads(path.read_text())
    keys = [k for k in found if model in k and (chip in k or "@" not in k or "+qairt" in k)]
    return {k: found[k] for k in sorted(keys)}


if __name__ == "__main__":
    sys.exit(main())
