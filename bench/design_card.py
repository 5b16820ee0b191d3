"""The design card's route against the EP's direct compile, from a build's own records (a
measurement, not a test). Run `doit oracle` first (it builds convert -> modellib -> compile and
compiles each graph directly with the EP once more per chip), then:

    python bench/design_card.py [--build build] [--out bench/results]

Per graph: the recording's size, the convert and modellib seconds (once per graph), and per chip the
route's context step and the EP's direct compile (the oracle's own compile) with both binaries' md5
and whether they are byte-identical. Writes <out>/design-card.json and design-card.md. The seconds
are those of the build that made the records (`doit -n 2` runs two steps at once: note the load
given with the figures).

    python bench/design_card.py --time SM8750 [--repeat 2]

times, alone and serially, each graph's route step for one chip against the EP's direct compile for
it, each in a fresh interpreter (wall seconds of the whole process, imports included, as a build
step pays them), and writes <out>/design-card-time.json with the load average before each.

    python bench/design_card.py --sample SM8750 --graph whisper-tiny.en/encoder [--repeat 6]

for a graph whose compiler is not byte-reproducible: N route and N EP compiles (fresh interpreters),
their md5s and how many route binaries equal an EP one (the same distribution, or not):
<out>/design-card-sample.json (a further run adds its samples to the same graph's)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--build", default=str(ROOT / "build"))
    args.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args.add_argument(
        "--time", metavar="CHIP", help="time route vs EP per graph for this chip, serially"
    )
    args.add_argument("--repeat", type=int, default=2)
    args.add_argument(
        "--sample", metavar="CHIP", help="md5 distribution of route vs EP compiles for --graph"
    )
    args.add_argument("--graph", metavar="MODEL/GRAPH")
    opts = args.parse_args()
    if opts.time:
        return time_steps(Path(opts.build), opts.time, opts.repeat, Path(opts.out))
    if opts.sample:
        return sample(Path(opts.build), opts.sample, opts.graph, opts.repeat, Path(opts.out))
    build, rows = Path(opts.build), []
    for converted in sorted(build.glob("*/ort-qnn/*/*.convert.json")):
        model, graph = converted.parts[-4], converted.parts[-2]
        c = json.loads(converted.read_text())
        lib = json.loads((converted.parent / f"{graph}.modellib.json").read_text())
        chips = {}
        for oracle in sorted(build.glob(f"{model}/ort-qnn/*/{graph}.oracle.json")):
            o = json.loads(oracle.read_text())
            compiled = json.loads((oracle.parent / f"{graph}.compile.json").read_text())
            chips[oracle.parent.name] = {
                "route_s": compiled["seconds"],
                "ep_s": o["ep_seconds"],
                "route_md5": o["route_md5"],
                "ep_md5s": o.get("ep_md5s", [o["ep_md5"]]),
                "status": o.get("status", "identical" if o["identical"] else "differs"),
                "identical": o["identical"],
                "wrapper_identical": o["wrapper_identical"],
                "bytes_differing": o.get("bytes_differing"),
            }
        rows.append(
            {
                "model": model,
                "graph": graph,
                "qnn_nodes": c["nodes"],
                "weights_mb": round(c["weight_bytes"] / 1e6, 1),
                "source_c_mb": round(os.path.getsize(converted.parent / f"{graph}.c") / 1e6, 2),
                "convert_s": c["seconds"],
                "modellib_s": lib["seconds"],
                "chips": chips,
            }
        )
    route = sum(
        r["convert_s"] + r["modellib_s"] + sum(c["route_s"] for c in r["chips"].values())
        for r in rows
    )
    direct = sum(c["ep_s"] for r in rows for c in r["chips"].values())
    pairs = [c for r in rows for c in r["chips"].values()]
    result = {
        "graphs": rows,
        "pairs": len(pairs),
        "identical": sum(c["identical"] for c in pairs),
        "compiler_not_reproducible": sum(c["status"] == "compiler-not-reproducible" for c in pairs),
        "differs": sum(c["status"] == "differs" for c in pairs),
        "wrappers_identical": sum(c["wrapper_identical"] for c in pairs),
        "route_total_s": round(route, 1),
        "ep_total_s": round(direct, 1),
    }
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "design-card.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "| model/graph | chip | route md5 | EP md5 (each EP compile) | oracle | route s (chip) | "
        "EP s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for chip, c in r["chips"].items():
            shown = c["status"] if not c["bytes_differing"] else (
                f"{c['status']} (route vs EP {c['bytes_differing']['route_vs_ep']} B, EP vs EP "
                f"{c['bytes_differing']['ep_vs_ep']} B)")
            lines.append(
                f"| {r['model']}/{r['graph']} | {chip} | {c['route_md5']} | "
                f"{', '.join(c['ep_md5s'])} | "
                f"{shown} | {c['route_s']:.1f} | {c['ep_s']:.1f} |"
            )
    lines += ["", "| model/graph | QNN nodes | weights MB | .c MB | convert s | modellib s |",
              "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['model']}/{r['graph']} | {r['qnn_nodes']} | {r['weights_mb']} | {r['source_c_mb']} "
        "| "
        f"{r['convert_s']:.1f} | {r['modellib_s']:.1f} |"
        for r in rows
    ]
    lines += [
        "",
        f"{result['identical']}/{result['pairs']} binaries byte-identical to an EP compile, "
        f"{result['compiler_not_reproducible']} where the EP does not reproduce itself, "
        f"{result['differs']} "
        f"differing; {result['wrappers_identical']}"
        f"/{result['pairs']} wrappers; route {result['route_total_s']} s (convert + modellib once "
        "per graph + "
        f"context per chip) vs EP {result['ep_total_s']} s (one compile per chip)",
    ]
    (out / "design-card.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if result["differs"] else 0


def sample(build: Path, chip: str, name: str, repeat: int, out: Path) -> int:
    model, graph = name.split("/")
    folder = build / model / "ort-qnn" / graph
    options = json.loads((build / model / "ort-qnn" / chip / f"{graph}.compile.json").read_text())[
        "options"
    ]
    route = (f"{ROUTE}import hashlib; print(hashlib.md5(r.binary).hexdigest())")
    ep_md5 = (f"{EP[:-1]}\n    import hashlib; print(hashlib.md5(open(tmp + '/g_qnn.bin', "
              "'rb').read()).hexdigest())\n")
    found = {
        "model": model,
        "graph": graph,
        "chip": chip,
        "load_before": [_load()],
        "route": [],
        "ep": [],
    }
    known = out / "design-card-sample.json"
    if known.exists():   # a further round adds to the same graph's samples
        old = json.loads(known.read_text())
        if (old["model"], old["graph"], old["chip"]) == (model, graph, chip):
            found.update(
                route=old["route"], ep=old["ep"], load_before=[*old["load_before"], _load()]
            )
    for _ in range(repeat):
        found["route"].append(_last([sys.executable, "-c", route,
                                     str(folder / "model_libs/x86_64-linux" / f"lib{graph}.so"),
                                     str(folder / f"{graph}.bin"), chip, json.dumps(options)]))
        found["ep"].append(
            _last(
                [
                    sys.executable,
                    "-c",
                    ep_md5,
                    str(build / model / graph / f"{graph}.onnx"),
                    json.dumps(options),
                ]
            )
        )
    found["distinct_route"], found["distinct_ep"] = len(set(found["route"])), len(set(found["ep"]))
    found["route_equal_to_an_ep_compile"] = sum(m in found["ep"] for m in found["route"])
    found["ep_equal_to_another_ep_compile"] = sum(found["ep"].count(m) > 1 for m in found["ep"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "design-card-sample.json").write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1))
    return 0


def _last(argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


ROUTE = """import sys, json
from toolchain.compilers.ort_qnn import context, ep
from toolchain.spec import chips
chip = chips.load()[sys.argv[3]].record()
r = context.compose(sys.argv[1], sys.argv[2], chip, context.graph_settings(json.loads(sys.argv[4])))
assert r.binary and not r.errors, r.errors
"""
EP = """import sys, json, tempfile
from toolchain.compilers.ort_qnn import ep
with tempfile.TemporaryDirectory() as tmp:
    ep.compile(sys.argv[1], tmp + "/g.onnx", json.loads(sys.argv[2]))
"""


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return round(time.monotonic() - started, 2)


def time_steps(build: Path, chip: str, repeat: int, out: Path) -> int:
    rows = []
    for converted in sorted(build.glob("*/ort-qnn/*/*.convert.json")):
        model, graph = converted.parts[-4], converted.parts[-2]
        compiled = json.loads(
            (build / model / "ort-qnn" / chip / f"{graph}.compile.json").read_text()
        )
        options = json.dumps(compiled["options"])
        lib = converted.parent / "model_libs" / "x86_64-linux" / f"lib{graph}.so"
        weights, src = converted.parent / f"{graph}.bin", build / model / graph / f"{graph}.onnx"
        if not src.exists():
            src = build / model / graph / f"{graph}.w8a16.onnx"
        row = {"model": model, "graph": graph, "load_before": _load(), "route_s": [], "ep_s": []}
        for _ in range(repeat):
            row["route_s"].append(
                _timed([sys.executable, "-c", ROUTE, str(lib), str(weights), chip, options])
            )
            row["ep_s"].append(_timed([sys.executable, "-c", EP, str(src), options]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "chip": chip,
        "graphs": rows,
        "route_total_s": round(sum(min(r["route_s"]) for r in rows), 2),
        "ep_total_s": round(sum(min(r["ep_s"]) for r in rows), 2),
        "cores": os.cpu_count(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "design-card-time.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "graphs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
