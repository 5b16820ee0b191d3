#!/usr/bin/env python3
"""What the cache's trust rules (issue 30: code never restored, data checked, relocatable keys) cost
a normal build: the same project of test models built with the toolchain of a commit before them and
with the working tree's, alternating so both see the same machine — a cold build filling a folder
cache, a no-op `doit`, and a warm rebuild (a fresh checkout restoring from that cache; after the
change it rebuilds the graph sources and model libraries itself).

    python bench/cache_trust.py [--before HEAD] [--models 2] [--chips SM8550,SM8750] [--runs 5]

Writes bench/results/cache-trust.{json,md}. Run it alone (2 cores); the load average is recorded
beside every figure."""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from projects import RESTORED, ROOT, checkout, doit, make_project  # noqa: E402

RESULTS = ROOT / "bench/results"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def with_toolchain_of(root: Path, rev: str) -> None:
    """Replace the project's dodo.py and toolchain/ with those of commit `rev`."""
    shutil.rmtree(root / "toolchain")
    data = subprocess.run(
        ["git", "archive", rev, "toolchain", "dodo.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(root, filter="data")


def steps(root: Path) -> dict:
    """Heavy steps of a build: restored from the cache, or computed here."""
    logs = [p.read_text(errors="replace") for p in (root / "build").rglob("*.log")]
    logs = [text for text in logs if "\n# exit " in text]
    return {
        "restored": sum(RESTORED in t for t in logs),
        "computed": sum(RESTORED not in t for t in logs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", default="HEAD", help="the commit before the change (default: HEAD)"
    )
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--chips", default="SM8550,SM8750")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    before = subprocess.run(
        ["git", "rev-parse", "--short", args.before],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    sides = {"before": before, "after": "working tree"}
    found = {side: {"cold": None, "noop": [], "warm": []} for side in sides}
    with tempfile.TemporaryDirectory(prefix="cache-trust-") as tmp:
        tmp = Path(tmp)
        roots = {}
        for side in sides:
            roots[side] = make_project(tmp / side / "p", args.models, args.chips.split(","))
            if side == "before":
                with_toolchain_of(roots[side], before)
        for side, root in roots.items():
            started_load = load()
            run = doit(root, cache=tmp / side / "cache")
            found[side]["cold"] = {"wall": round(run.wall, 2), "load": started_load, **steps(root)}
        for i in range(args.runs):   # alternating: both sides see the same machine
            for side, root in roots.items():
                started_load = load()
                run = doit(root)
                assert not run.executed, run.executed
                found[side]["noop"].append({"wall": round(run.wall, 3), "load": started_load})
                clone = checkout(root, tmp / side / f"warm{i}")
                started_load = load()
                run = doit(clone, cache=tmp / side / "cache")
                found[side]["warm"].append(
                    {"wall": round(run.wall, 2), "load": started_load, **steps(clone)}
                )
                shutil.rmtree(clone)
    for side in sides:
        for what in ("noop", "warm"):
            found[side][f"{what}_median"] = statistics.median(r["wall"] for r in found[side][what])
    record = {
        "before": before,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "models": args.models,
        "chips": args.chips,
        "runs": args.runs,
        "results": found,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cache-trust.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        f"# Cache trust rules: cost on a normal build ({args.models} test models x {args.chips}, "
        f"{args.runs} alternating runs)",
        "",
        "| | before (" + before + ") | after |",
        "|---|---|---|",
    ]
    for label, key in (("cold build, filling a folder cache (s)", "cold"),):
        b, a = found["before"][key], found["after"][key]
        lines.append(f"| {label} | {b['wall']} (load {b['load']}; {b['computed']} steps) | "
                     f"{a['wall']} (load {a['load']}; {a['computed']} steps) |")
    for label, key in (
        ("no-op doit, median (s)", "noop"),
        ("warm rebuild from the cache, median (s)", "warm"),
    ):
        b, a = found["before"], found["after"]
        loads = f"load {b[key][0]['load']} .. {a[key][-1]['load']}"
        lines.append(f"| {label} | {b[key + '_median']:.3f} | {a[key + '_median']:.3f} ({loads}) |")
    b, a = found["before"]["warm"][0], found["after"]["warm"][0]
    lines.append(f"| warm rebuild: steps restored / computed | {b['restored']} / {b['computed']} | "
                 f"{a['restored']} / {a['computed']} |")
    (RESULTS / "cache-trust.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
