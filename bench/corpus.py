"""The corpus table (docs/corpus.md): each model of models/corpus/ built alone, from its TOML only,
in a fresh project, for SM8550 and SM8750, through verify in the simulator (or to its refusal), one
model at a time.

    python bench/corpus.py [model ...]     # -> bench/results/corpus.json and the table on stdout

Per model: the outcome (100 % HTP and verified, or the refusal's line), the rules "auto" applied and
the nodes they replaced, the QNN ops each graph became, the context binary's size, the tensor
agreement of the simulator with the CPU ONNX per chip (max relative error, cosine), and the wall
time of the build, with the load average before and after (2 cores: run it alone)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "models" / "corpus"
CHIPS = ("SM8550", "SM8750")
OUT = ROOT / "bench" / "results" / "corpus.json"


def build(name: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "models" / "corpus"
        corpus.mkdir(parents=True)
        shutil.copy(ROOT / "dodo.py", root)
        for module in CORPUS.glob("*.py"):
            shutil.copy(module, corpus)
        shutil.copy(CORPUS / f"{name}.toml", corpus)
        # the clips the speech feeds read
        (root / "models" / "data").symlink_to(ROOT / "models" / "data")
        load_before = os.getloadavg()
        started = time.monotonic()
        targets = [f"verify:{name}@{c}" for c in CHIPS]
        run = subprocess.run([sys.executable, "-m", "doit", "--continue", "corpus=1", *targets],
                             cwd=root, capture_output=True, text=True)
        wall = time.monotonic() - started
        return {"wall_s": round(wall, 1), "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()], "rc": run.returncode,
                **collect(root / "build" / name, run.stdout + run.stderr)}


def collect(build: Path, text: str) -> dict:
    refusals = [
        line.split("STAGE-FAILED: ", 1)[1]
        for log in sorted(build.rglob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("STAGE-FAILED: ")
    ]
    graphs: dict[str, dict] = {}
    # every graph that got as far as simplify
    for rewrites in sorted(build.glob("*/*.rewrites.json")):
        graph = rewrites.parent.name
        applied = json.loads(rewrites.read_text())["applied"]
        # none for a graph the EP compiles directly
        record = build / "ort-qnn" / graph / f"{graph}.convert.json"
        convert = json.loads(record.read_text()) if record.is_file() else {}
        graphs[graph] = {
            "qnn_ops": convert.get("nodes"),
            "cpu_nodes": len(convert.get("cpu_nodes", [])),
            "rules": {a["rewrite"]: len(a["nodes"]) for a in applied},
            "binary_bytes": {c: _size(build / "ort-qnn" / c / f"{graph}_qnn.bin") for c in CHIPS},
        }
    verify = {}
    for chip in CHIPS:
        path = build / "ort-qnn" / chip / "verify.json"
        if path.is_file():
            record = json.loads(path.read_text())
            verify[chip] = {
                "status": record["status"],
                "failure": (record.get("failures") or [""])[0],
                "tensors": {
                    g: {
                        "max_rel": round(t["max_rel"], 5),
                        "cosine": round(t["cosine"], 6),
                        "calls": t["calls"],
                    }
                    for g, t in record["tensors"].items()
                },
            }
    return {
        "graphs": graphs,
        "verify": verify,
        "refused": refusals[:1],
        "outcome": outcome(verify, refusals),
    }


def outcome(verify: dict, refusals: list) -> str:
    """Verified on both chips; built but failing verify (the simulator disagrees with the CPU);
    or refused before."""
    if len(verify) == len(CHIPS) and all(v["status"] == "passed" for v in verify.values()):
        return "100 % HTP, verified on " + ", ".join(CHIPS)
    if verify:
        return "built, verify failed on " + ", ".join(
            c for c, v in verify.items() if v["status"] != "passed"
        )
    return "refused" if refusals else "failed"


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def table(results: dict) -> str:
    rows = [
        "| model | outcome | rules applied (nodes) | QNN ops | binary MB | max rel SM8550 / SM8750 "
        "| wall s "
        "(load) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rules = (
            "; ".join(
                f"{g}: " + (", ".join(f"{k} ({n})" for k, n in v["rules"].items()) or "none")
                for g, v in r["graphs"].items()
            )
            or "-"
        )
        ops = ", ".join(str(v["qnn_ops"]) for v in r["graphs"].values()) or "-"
        size = (
            ", ".join(
                f"{(v['binary_bytes'].get('SM8750') or 0) / 1e6:.2f}" for v in r["graphs"].values()
            )
            or "-"
        )
        rel = " / ".join(
            ", ".join(
                f"{t['max_rel']:.4f}" for t in r["verify"].get(c, {}).get("tensors", {}).values()
            )
            or "-"
            for c in CHIPS
        )
        said = (
            r["outcome"]
            if r["outcome"] != "refused"
            else f"refused: {r['refused'][0].split(': ', 1)[-1][:90]}…"
        )
        rows.append(f"| {name} | {said} | {rules} | {ops} | {size} | {rel} | {r['wall_s']} "
                    f"({r['load_before'][0]}) |")
    return "\n".join(rows)


def main(names: list[str]) -> None:
    names = names or sorted(p.stem for p in CORPUS.glob("*.toml"))
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    # the outcome is worded from the recorded fields: an older record reads as a new one
    for r in results.values():
        r["outcome"] = outcome(r["verify"], r["refused"])
    for name in names:
        print(f"{name} ...", flush=True)
        results[name] = build(name)
        print(f"  {results[name]['outcome']} in {results[name]['wall_s']} s", flush=True)
    OUT.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")
    print(table(dict(sorted(results.items()))))


if __name__ == "__main__":
    main(sys.argv[1:])
