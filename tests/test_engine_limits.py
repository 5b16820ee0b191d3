"""Parallel out of the box with slots sized per stage (engine/run/limits.py,
pipeline.default_slots): the cores, the simulator's threads and the memory set the slots, a stage
limit caps concurrent steps, the simulator stages share one pool, and `doit -n 2` gives the serial
build's bytes and state."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time

from conftest import RESTORED, assert_same_outputs, cacheable, checkout, doit, tool_logs

from toolchain import options, pipeline
from toolchain.engine.run import limits


def test_slots_follow_the_cores_the_simulators_threads_and_the_memory():
    assert pipeline.default_slots(2, 24) == {
        "verify": 1,
        "verify_full": 1,
        "diagnose": 1,
        "sherpa": 1,
        "sherpa_full": 1,
    }
    eight = pipeline.default_slots(8, 24)
    # compiles (0.9 GB peak) fit 8 at once in 24 GB
    assert eight["verify"] == 4 and "compile" not in eight
    assert pipeline.default_slots(8, 4)["compile"] == 3      # 4 GB: three 1-GB compiles, not eight
    assert limits.slots_for(1, 0.5, 1, 24) == 0              # serial: nothing to limit


def test_doit_is_parallel_by_default_with_the_cores_it_has():
    assert options.resolve_given({}, {})["jobs"] == os.cpu_count()
    assert options.resolve_given({}, {"QNN_JOBS": "3"})["jobs"] == 3


def test_a_stage_limit_caps_concurrent_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eight = pipeline.slots(options.resolve_given({}, {"QNN_JOBS": "8"}))
    configured = pipeline.slots(
        options.resolve_given({}, {"QNN_JOBS": "8", "QNN_LIMITS": "compile:1,verify:2"})
    )
    # over the defaults
    assert eight["verify"] == 4 and configured["compile"] == 1 and configured["verify"] == 2
    assert {k: v for k, v in configured.items() if k not in ("compile", "verify")} == \
        {k: v for k, v in eight.items() if k not in ("compile", "verify")}
    for stage, slots in (("compile", 1), ("verify", 2), ("export", 4)):
        def inside(step, stage=stage):
            with limits.slot(stage, configured.get(stage, 0)):
                step()
        assert _peak([inside] * 4) == slots, stage


def _peak(runners) -> int:
    """Run each runner(step) in its own thread at once; the most steps that were inside
    at one time."""
    running, peak, lock = [0], [0], threading.Lock()

    def step():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
    threads = [threading.Thread(target=run, args=(step,)) for run in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return peak[0]


def test_every_simulator_stage_holds_a_slot_of_one_pool(project, monkeypatch):
    """Default verify, full verify, diagnose and the sherpa gates: never two simulators at once
    on 2 cores."""
    from toolchain import pipeline
    from toolchain import project as project_mod
    sims = {s.name for s in pipeline.STAGES if s.pool == pipeline.SIMULATOR}
    assert sims == {"verify", "verify_full", "diagnose", "sherpa", "sherpa_full"}
    project.add_tiny()
    monkeypatch.chdir(project.root)
    made = pipeline.task_creators(
        project_mod.load("models", options.resolve_given({}, {"QNN_JOBS": "2"}))
    )
    tasks = [t for stage in ("verify", "verify_full", "diagnose") for t in made[f"task_{stage}"]()
             if "@SM8750" in t["name"]]
    assert {t["meta"]["pool"] for t in tasks} == {"simulator"} and {
        t["meta"]["slots"] for t in tasks
    } == {1}
    class Task:   # what limits.call reads of a doit task: its name and meta
        def __init__(self, name, meta):
            self.name, self.meta = name, meta
    runners = [lambda step, t=t: limits.call(Task(t["name"], t["meta"]), step) for t in tasks]
    assert len(runners) == 3 and _peak(runners) == 1   # three stages, one simulator at a time


def test_parallel_build_is_byte_identical_to_serial_and_keeps_the_state(reference, tmp_path):
    # The chip-independent work comes from the serial build's cache (hash-checked), so
    # the test's time goes to the fan-out: 4 compiles and 4 simulator runs 2-wide
    # (threads: DOIT_CONFIG par_type).
    ref, shared = reference
    partial = tmp_path / "cache"
    shutil.copytree(shared / "blobs", partial / "blobs")
    (partial / "entries").mkdir()
    for entry in (shared / "entries").glob("*.json"):
        if "@" not in json.loads(entry.read_text())["material"]["task"]:
            shutil.copy(entry, partial / "entries")
    par = checkout(ref, tmp_path / "par")
    executed, _ = doit(par, "-n", "2", cache_dir=partial)
    assert len(executed) == len(set(executed)) == 29
    computed = sorted(
        rel for rel, text in cacheable(tool_logs(par)).items() if RESTORED not in text
    )
    # verify: a result, here
    assert len(computed) == 4 and all(rel.endswith(".compile.log") for rel in computed)
    assert_same_outputs(ref, par)
    with sqlite3.connect(par / "build/.doit.db") as db:
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    assert doit(par, "-n", "2")[0] == []   # every task's state was committed
