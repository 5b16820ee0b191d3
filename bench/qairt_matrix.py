"""The multi-QAIRT regression matrix: one model built for every QAIRT family on one chip, each
verified on its own family's simulator, and one table of what changed (binary size, compile s,
simulator s per call, tensor error, cosine, the model's own metric), with a flag on a family worse
than the best (toolchain/stages/report/families.py, the same rows the build report shows).

    python bench/qairt_matrix.py --model whisper-tiny.en --chip SM8750     # run alone: it times
    things -> bench/results/qairt-matrix-<model>-<chip>.json and .md

It runs `doit qairt=all manifest:<model>@<chip>[+qairt<family>]` in the checkout (the families'
environments are made by the build's own qairt_env tasks) and reads the manifests back; load average
is recorded beside the wall."""
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

from toolchain.compilers.ort_qnn import families  # noqa: E402
from toolchain.stages.report import families as family_table  # noqa: E402
from toolchain.stages.report import table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument(
        "--extra", action="store_true", help="the model is in models/extra (doit extra=1)"
    )
    args = parser.parse_args()
    own = families.default().name
    tags = {name: "" if name == own else f"+qairt{name}" for name in families.table()}
    wanted = [f"manifest:{args.model}@{args.chip}{tag}" for tag in tags.values()]
    load = os.getloadavg()
    started = time.monotonic()
    # --continue: a family that cannot build the model is a result of the matrix, not the end of it
    done = subprocess.run([sys.executable, "-m", "doit", "-n", "1", "--continue", "qairt=all",
                           *(["extra=1"] if args.extra else []), *wanted], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - started
    failures = _failures(done.stdout + done.stderr)
    folder = f"build/{args.model}/ort-qnn"
    manifests, why = {}, {}
    for name, tag in tags.items():
        why[name] = [
            f"{task}: {f}"
            for task, f in failures.items()
            if (tag in task if tag else "+qairt" not in task)
        ]
        path = ROOT / f"{folder}{'-qairt' + name if tag else ''}/{args.chip}/manifest.json"
        if path.is_file() and not why[name]:
            manifests[name] = json.loads(path.read_text())
    rows = family_table.rows(list(manifests.values()))
    for name in tags:   # a family that did not build it: why, in the table too
        if name not in manifests:
            rows.append([args.model, args.chip, name, families.table()[name].build_id, *["-"] * 7,
                         "does not build: " + ("; ".join(why[name]) or "no manifest")])
    rows.sort(key=lambda r: r[2])
    durations = _durations(args.model, args.chip, tags)
    result = {
        "model": args.model,
        "chip": args.chip,
        "wall_seconds": round(wall, 1),
        "load_average_at_start": load,
        "load_average_at_end": os.getloadavg(),
        "executed": [line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")],
        "columns": list(family_table.COLUMNS),
        "rows": rows,
        "task_seconds": durations,
        "failures": failures,
        "families": {
            name: {
                "build_id": m["sdk"]["build_id"],
                "tool": m["tools"]["compiler"],
                "binaries": {
                    g: {k: b[k] for k in ("bytes", "sha256", "compile_seconds")}
                    for g, b in m["binaries"].items()
                },
                "verify": {k: m["verify"]["default"][k] for k in ("tensors", "seconds")},
                "task": m["verify"]["default"].get("task", {}).get("summary"),
            }
            for name, m in manifests.items()
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"qairt-matrix-{args.model}-{args.chip}"   # the model name may hold dots: no with_suffix
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    text = (
        f"# {args.model} on {args.chip}, every QAIRT "
        f"family\n\n{table(rows, family_table.COLUMNS)}\n"
        f"`python bench/qairt_matrix.py --model {args.model} --chip "
        f"{args.chip}{' --extra' * args.extra}`: "
        f"wall {wall:.0f} s for "
        f"{len(result['executed'])} tasks, load average {load[0]:.2f} at the start, "
        f"{result['load_average_at_end'][0]:.2f} at the end.\n"
    )
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0


def _failures(text: str) -> dict:
    """{task: its one-line failure} from doit's output (TaskFailed - taskid:<task> then
    the message line)."""
    found, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TaskFailed - taskid:") and i + 1 < len(lines):
            found[line[len("TaskFailed - taskid:"):].strip()] = lines[i + 1].strip()
    return found


def _durations(model: str, chip: str, tags: dict) -> dict:
    """Seconds per task of this run's model and chip, from the build's own durations
    record (progress.py)."""
    path = ROOT / "build" / ".durations.json"
    if not path.is_file():
        return {}
    found = json.loads(path.read_text())
    keys = [k for k in found if model in k and (chip in k or "@" not in k or "+qairt" in k)]
    return {k: found[k] for k in sorted(keys)}


if __name__ == "__main__":
    sys.exit(main())
