"""Temp projects and timed doit runs for bench/bench.py: the test model in N copies for M chips, a
second checkout, a recorded complete state without running a stage, and doit timed with its CPU."""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures"
sys.path.insert(0, str(ROOT))
from toolchain.spec import chips as chip_table  # noqa: E402  (the repository's, wherever this runs from)

ALL_CHIPS = list(chip_table.load())   # 10 rows; SM8350 has no fp16, so 10-chip builds use w8a16
FP16_CHIPS = [c.name for c in chip_table.load().values() if c.fp16]
W8A16 = {
    'precision = "fp16"': 'precision = "w8a16"\ncalibration = 8',
    "max_rel = 0.02": "max_rel_w8a16 = 0.2",
}
# `python -m doit` that also reports its own CPU time and its step processes' (all waited for)
DOIT = (
    "import resource, sys; from doit.doit_cmd import DoitMain; rc = DoitMain().run(sys.argv[1:]); "
    "s, c = resource.getrusage(resource.RUSAGE_SELF), "
    "resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(f'@@cpu {s.ru_utime + s.ru_stime} {c.ru_utime + c.ru_stime}', file=sys.stderr); "
    "sys.exit(rc)"
)
EXIT = re.compile(r"^# exit \d+ after ([\d.]+) s$", re.M)
RESTORED = "# restored from cache"
_CHECKPOINT: list[Path] = []

FILL = r"""
import functools, os, runpy, sys
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
namespace = runpy.run_path("dodo.py")

def touch(targets):
    for path in targets:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        open(path, "a").close()

def patch(task):
    if task.get("actions"):
        task["actions"] = [(touch, (list(task.get("targets", [])),))]
    return task

def fake(creator):
    @functools.wraps(creator)
    def tasks():
        made = creator()
        return patch(made) if isinstance(made, dict) else (patch(t) for t in made)
    return tasks

for creator in [v for v in namespace.values() if hasattr(v, "create_doit_tasks")]:   # pipeline.in_pipeline_order
    creator.create_doit_tasks = fake(creator.create_doit_tasks)
with open(os.devnull, "w") as out:
    sys.exit(DoitMain(ModuleTaskLoader(namespace), config_filenames=(), extra_config={"GLOBAL": {"outfile": out}}).run([]))
"""  # noqa: E501  (FILL is the source `python -c` runs: wrapping it would change the string)


def make_project(
    root: Path, models: int, chips: list[str], w8a16: bool = False, names=None
) -> Path:
    """A project of `models` copies of the test model (tiny, or tiny00, tiny01, ...) for `chips`."""
    (root / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", root / "dodo.py")
    shutil.copytree(
        ROOT / "toolchain", root / "toolchain", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(FIXTURES / "tinynet.py", root / "models/tinynet.py")
    checkpoint = root / "models/tiny.pt"
    if not _CHECKPOINT:   # one seeded checkpoint, copied into every project
        made = Path(tempfile.mkdtemp(prefix="qnn-bench-ckpt-")) / "tiny.pt"
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(FIXTURES)!r}); import "
                f"tinynet; tinynet.make_checkpoint({str(made)!r}, 0)",
            ],
            check=True,
        )
        _CHECKPOINT.append(made)
    shutil.copy(_CHECKPOINT[0], checkpoint)
    pin = _sha256(checkpoint)
    for name in names or (["tiny"] if models == 1 else [f"tiny{i:02d}" for i in range(models)]):
        if name != "tiny":
            shutil.copy(checkpoint, root / f"models/{name}.pt")
        text = (FIXTURES / "tiny.toml").read_text().replace("@SHA256@", pin)
        text = text.replace('path = "tiny.pt"', f'path = "{name}.pt"')
        text = text.replace('chips = ["SM8550", "SM8750"]', f"chips = {json.dumps(chips)}")
        for old, new in (W8A16.items() if w8a16 else ()):
            text = text.replace(old, new)
        (root / f"models/{name}.toml").write_text(text)
    return root


def checkout(src: Path, dst: Path) -> Path:
    """A second checkout: the sources without build/."""
    dst.mkdir(parents=True)
    shutil.copy(src / "dodo.py", dst / "dodo.py")
    for name in ("models", "toolchain"):
        shutil.copytree(src / name, dst / name, symlinks=True)
    return dst


class Run(NamedTuple):
    wall: float       # seconds
    # CPU seconds of the doit process: loading, scheduling, state, in-process actions
    own_cpu: float
    tools_cpu: float  # CPU seconds of every step process it started
    executed: list

    @property
    def cpu(self) -> float:
        return self.own_cpu + self.tools_cpu


def doit(root: Path, *args: str, cache: Path | None = None) -> Run:
    """`doit` in root, as `python -m doit` runs it, timed; it must succeed."""
    env = environment()
    if cache:
        env["QNN_CACHE"] = str(cache)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", DOIT, *args], cwd=root, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(
            f"doit {' '.join(args)} in {root} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    own, tools = map(float, re.search(r"^@@cpu (\S+) (\S+)$", done.stderr, re.M).groups())
    return Run(
        wall, own, tools, [line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")]
    )


def noop(root: Path, runs: int = 3) -> Run:
    """The median (by wall time) of `runs` no-op `doit` runs; its `executed` should be empty."""
    return sorted((doit(root) for _ in range(runs)), key=lambda r: r.wall)[runs // 2]


def cpu_of(argv: list[str], **kwargs) -> tuple[float, float]:
    """(wall, CPU seconds) of a command and its children."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=environment(), **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.perf_counter() - started,
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def fill(root: Path) -> None:
    """A complete build's doit state without running a stage: each action replaced by one
    that creates its targets empty, so a no-op `doit` then checks exactly what it checks
    after a real build."""
    subprocess.run([sys.executable, "-c", FILL], cwd=root, check=True, env=environment())


def count_tasks(root: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "doit", "list", "--all", "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        env=environment(),
    ).stdout
    return len(out.split())


def tool_seconds(root: Path) -> tuple[float, int]:
    """(seconds, steps) the heavy steps spent in their own processes: the '# exit N after
    S s' lines."""
    found = [
        float(m.group(1))
        for p in (root / "build").rglob("*.log")
        for m in [EXIT.search(p.read_text(errors="replace"))]
        if m and RESTORED not in p.read_text()
    ]
    return sum(found), len(found)


def same_outputs(a: Path, b: Path) -> bool:
    """Identical build/ trees except logs, reports and the timings inside JSON records."""
    def load(path):
        def strip(v):
            if isinstance(v, dict):
                return {
                    k: strip(x) for k, x in v.items() if k not in ("seconds", "compile_seconds")
                }
            return [strip(x) for x in v] if isinstance(v, list) else v
        return strip(json.loads(path.read_text())) if path.suffix == ".json" else path.read_bytes()

    def files(root):
        return {
            str(p.relative_to(root / "build"))
            for p in (root / "build").rglob("*")
            if p.is_file()
            and not p.name.startswith((".doit.db", "report."))
            and p.suffix != ".log"
            and ".locks" not in p.parts
        }

    return files(a) == files(b) and all(
        load(a / "build" / f) == load(b / "build" / f) for f in files(a)
    )


def environment() -> dict:
    """This environment without the cache and limit settings, and with bytecode caching
    on, as a normal install has it (PYTHONDONTWRITEBYTECODE would recompile toolchain/ on
    every doit start)."""
    drop = ("QNN_CACHE", "QNN_LIMITS", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()
