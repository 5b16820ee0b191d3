#!/usr/bin/env python3
"""The CI fan-out rehearsed on one machine against a real HTTP remote cache (issue 23): nginx with
WebDAV PUT (tests/nginx_cache.py) as the team's server, three clones as three runners each building
its `doit matrix` slice concurrently (phase "models", then phase "chips", as the example workflow
does), then a fourth fresh clone building everything from the server. Beside it: what a dead or
silent server costs a build, and the cold serial build the warm one is measured against.

    python bench/cache_fanout.py [--models 3] [--chips SM8550,SM8650,SM8750] [--runners 3]

Writes bench/results/cache-fanout.{json,md}. Run it alone (2 cores: three runners already share
them); the load average is recorded beside every figure."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from projects import RESTORED, ROOT, checkout, doit, make_project  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
import nginx_cache  # noqa: E402  (the tests' server harness)

RESULTS = ROOT / "bench/results"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def plan(root: Path, phase: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "toolchain.matrix", "--phase", phase], cwd=root,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["include"]


def heavy_logs(root: Path) -> dict[str, bool]:
    """{log under build/: restored?} of every heavy step (worker or external tool)."""
    found = {}
    for p in (root / "build").rglob("*.log"):
        text = p.read_text()
        if "\n# exit " in text or RESTORED in text:
            found[str(p.relative_to(root / "build"))] = RESTORED in text
    return found


def delta(after: dict, before: dict) -> dict:
    """Traffic between two server readings: requests and bytes by direction."""
    total = {
        "requests": 0,
        "bytes_uploaded": 0,
        "bytes_downloaded": 0,
        "gets": 0,
        "get_hits": 0,
        "puts": 0,
    }
    for method, m in after.items():
        b = before.get(method, {"requests": 0, "ok": 0, "bytes_in": 0, "bytes_out": 0})
        n, ok = m["requests"] - b["requests"], m["ok"] - b["ok"]
        total["requests"] += n
        if method == "PUT":
            total["puts"] += n
            total["bytes_uploaded"] += m["bytes_in"] - b["bytes_in"]
        if method == "GET":
            total["gets"] += n
            total["get_hits"] += ok
            total["bytes_downloaded"] += m["bytes_out"] - b["bytes_out"]
    return total


def fan_out(runners: list[Path], entries: list[dict], url: str) -> list[dict]:
    """Each runner takes every len(runners)-th job of the phase and runs them one after another; the
    runners run at once."""
    def runner(i: int) -> dict:
        mine = entries[i::len(runners)]
        started, jobs = time.perf_counter(), []
        for entry in mine:
            run = doit(runners[i], *entry["tasks"].split(), cache=url)
            jobs.append(
                {"job": entry["name"], "seconds": round(run.wall, 2), "executed": len(run.executed)}
            )
        return {"runner": i + 1, "jobs": jobs, "seconds": round(time.perf_counter() - started, 2)}
    with ThreadPoolExecutor(len(runners)) as pool:
        return list(pool.map(runner, range(len(runners))))


def dead_server(work: Path, source: Path) -> dict:
    """One model, one chip, built from scratch: no cache, a refused port, a silent
    server (default time-out)."""
    one = make_project(work / "one", 1, ["SM8750"])
    found = {}
    silent = nginx_cache.Silent()
    for name, url in (
        ("no cache", None),
        ("refused port", f"http://127.0.0.1:{nginx_cache.free_port()}/"),
        ("silent server, QNN_CACHE_TIMEOUT=5", silent.url),
    ):
        clone = checkout(one, work / f"dead-{len(found)}")
        before = load()
        run = doit(clone, cache=url) if url else doit(clone)
        found[name] = {
            "seconds": round(run.wall, 2),
            "executed": len(run.executed),
            "load_before": before,
            "load_after": load(),
        }
    base = found["no cache"]["seconds"]
    for v in found.values():
        v["extra_seconds"] = round(v["seconds"] - base, 2)
    silent.close()
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--chips", default="SM8550,SM8650,SM8750")
    p.add_argument("--runners", type=int, default=3)
    args = p.parse_args(argv)
    chips = args.chips.split(",")
    work = Path(tempfile.mkdtemp(prefix="qnn-fanout-"))
    server = nginx_cache.Server(work / "nginx")
    data = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "project": {"models": args.models, "chips": chips, "runners": args.runners},
        "server": "nginx (WebDAV PUT)",
    }
    try:
        src = make_project(work / "src", args.models, chips)
        cold = checkout(src, work / "cold")
        before = load()
        run = doit(cold)
        data["cold"] = {
            "seconds": round(run.wall, 2),
            "executed": len(run.executed),
            "load_before": before,
            "load_after": load(),
            "note": "one clone, serial, no cache",
        }
        runners = [checkout(src, work / f"runner{i + 1}") for i in range(args.runners)]
        data["phases"] = {}
        for phase in ("models", "chips"):
            entries = plan(src, phase)
            reading, before, started = server.traffic(), load(), time.perf_counter()
            slices = fan_out(runners, entries, server.url)
            data["phases"][phase] = {
                "jobs": len(entries),
                "wall": round(time.perf_counter() - started, 2),
                "runners": slices,
                "traffic": delta(server.traffic(), reading),
                "load_before": before,
                "load_after": load(),
            }
        fresh = checkout(src, work / "fresh")
        reading, before = server.traffic(), load()
        run = doit(fresh, cache=server.url)
        logs = heavy_logs(fresh)
        computed = sorted(k for k, restored in logs.items() if not restored)
        binaries = sorted(str(p.relative_to(fresh)) for p in (fresh / "build").rglob("*_qnn.bin"))
        same = all(open(fresh / b, "rb").read() == open(cold / b, "rb").read() for b in binaries)
        data["fresh"] = {
            "seconds": round(run.wall, 2),
            "executed": len(run.executed),
            "heavy_steps": len(logs),
            "computed": computed,
            "compiles": len([c for c in computed if ".compile.log" in c]),
            "binaries": len(binaries),
            "binaries_identical_to_cold": same,
            "traffic": delta(server.traffic(), reading),
            "load_before": before,
            "load_after": load(),
        }
        data["fresh"]["share_of_cold"] = round(
            data["fresh"]["seconds"] / data["cold"]["seconds"], 3
        )
        data["dead_server"] = dead_server(work, src)
    finally:
        server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cache-fanout.json").write_text(json.dumps(data, indent=1) + "\n")
    (RESULTS / "cache-fanout.md").write_text(report(data))
    print(report(data))
    return 0


def report(d: dict) -> str:
    def mb(b):
        return f"{b / 1e6:.2f} MB"

    pr = d["project"]
    lines = [
        f"# Fan-out against one HTTP remote cache ({d['server']})",
        "",
        f"{pr['models']} models x {len(pr['chips'])} chips ({', '.join(pr['chips'])}), "
        f"{pr['runners']} clones as runners "
        f"on one {d['machine']['cpus']}-core machine "
        "(they share the cores: a real fan-out gives each its own).",
        "",
        "| run | wall | what | traffic | load (1/5/15 min, before → after) |",
        "|---|---|---|---|---|",
        f"| cold: one clone, serial, no cache | {d['cold']['seconds']} s | {d['cold']['executed']} "
        "tasks | - | "
        f"{d['cold']['load_before']} → {d['cold']['load_after']} |",
    ]
    for phase, ph in d["phases"].items():
        t = ph["traffic"]
        walls = ", ".join(
            f"runner {r['runner']} {r['seconds']} s ({len(r['jobs'])} jobs)" for r in ph["runners"]
        )
        lines.append(
            f"| phase {phase}: {ph['jobs']} jobs over {pr['runners']} runners at once | "
            f"{ph['wall']} s | {walls} | "
            f"up {mb(t['bytes_uploaded'])} ({t['puts']} PUT), down {mb(t['bytes_downloaded'])} "
            f"({t['get_hits']}/{t['gets']} GET hits) | {ph['load_before']} → {ph['load_after']} |"
        )
    f = d["fresh"]
    t = f["traffic"]
    lines.append(
        f"| fourth, fresh clone: everything | {f['seconds']} s ({f['share_of_cold']:.1%} of cold) "
        "| "
        f"{f['heavy_steps']} heavy steps, {len(f['computed'])} computed, {f['compiles']} compiles; "
        f"{f['binaries']} binaries identical to cold: {f['binaries_identical_to_cold']} | "
        f"up {mb(t['bytes_uploaded'])}, down {mb(t['bytes_downloaded'])} "
        f"({t['get_hits']}/{t['gets']} GET hits) | "
        f"{f['load_before']} → {f['load_after']} |"
    )
    lines += [
        "",
        "What a server that does not answer costs a build (one model, one chip, from scratch):",
        "",
        "| cache | wall | extra | load (before → after) |",
        "|---|---|---|---|",
    ]
    for name, v in d["dead_server"].items():
        lines.append(f"| {name} | {v['seconds']} s | {v['extra_seconds']:+.2f} s | "
                     f"{v['load_before']} → {v['load_after']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
