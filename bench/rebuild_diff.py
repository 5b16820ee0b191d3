#!/usr/bin/env python3
"""What a tree built with an older commit rebuilds after updating to this checkout, without building
anything: for every task of the shipped project (models/*.toml, all stages), what doit decides
staleness on — the settings given to config_changed, the file_dep (by content), the targets — in a
clean copy of the older commit and here.

    python bench/rebuild_diff.py [--before 1b64965] [--variables full=SM8750 ...]

Prints the tasks whose settings or inputs differ (each of which reruns, with what follows
from its changed outputs), and the count of the others. A measurement, not a test: it needs
the examples installed."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run in a project folder (its toolchain first on sys.path): every task's name, settings,
# file_dep and targets.
DUMP = r"""
import hashlib, json, os, runpy, sys
sys.path.insert(0, os.getcwd())
def digest(path):
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
here = os.getcwd() + os.sep
found = {}
for obj in runpy.run_path("dodo.py").values():
    create = getattr(obj, "create_doit_tasks", None)
    made = create() if create else []
    for task in [made] if isinstance(made, dict) else made:
        name = f"{create.basename}:{task['name']}" if task.get("name") else create.basename
        settings = [u.config for u in task.get("uptodate", []) if hasattr(u, "config")]
        deps = {p.replace(here, ""): digest(p) for p in task.get("file_dep", [])
                if not p.startswith("build/")}   # built inputs: equal when their producers are
        built = sorted(p for p in task.get("file_dep", []) if p.startswith("build/"))
        found[name] = {"settings": settings, "deps": deps, "built_deps": built,
                       "targets": sorted(task.get("targets", []))}
print(json.dumps(found, default=repr, sort_keys=True))
"""


def dump(folder: Path, variables: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QNN_CACHE")}
    env["PYTHONPATH"] = str(folder)
    done = subprocess.run(
        [sys.executable, "-c", DUMP, *variables],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{folder}: loading the tasks failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="1b64965", help="the commit a tree was built with")
    parser.add_argument("--variables", nargs="*", default=[], metavar="name=value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rebuild-diff-") as scratch:
        old = Path(scratch) / "before"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        new = Path(scratch) / "now"
        files = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for rel in files:   # this checkout as it is (committed or not), without build/
            src, dst = ROOT / rel, new / rel
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
        before, now = dump(old, args.variables), dump(new, args.variables)
    changed = {}
    for name in sorted(set(before) | set(now)):
        a, b = before.get(name), now.get(name)
        if a is None or b is None:
            changed[name] = "new task" if a is None else "task gone"
            continue
        why = [part for part in ("settings", "deps", "built_deps", "targets") if a[part] != b[part]]
        if why:
            detail = [
                p for p in set(a["deps"]) | set(b["deps"]) if a["deps"].get(p) != b["deps"].get(p)
            ]
            changed[name] = ", ".join(why) + (
                f" ({', '.join(sorted(detail)[:4])})" if detail else ""
            )
    for name, why in changed.items():
        print(f"{name}: {why}")
    same = len(set(before) & set(now)) - sum(1 for n in changed if n in before and n in now)
    print(
        f"{len(changed)} task(s) differ, {same} the same (of {len(now)} now, {len(before)} before "
        f"{args.before})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
