"""The trace of a build (toolchain/engine/run/trace.py): build/trace.json in the trace-event
format, build/trace.svg, the critical path at the end of the build and in build/report.md; a
no-op writes nothing."""
from __future__ import annotations

import io
import json
import os
import time

from conftest import Project
from doit.task import Task

from toolchain.engine.run import trace
from toolchain.engine.run.trace import Slice


def ran_slices(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e.get("cat") != "wait"]


def test_a_build_writes_its_trace_and_critical_path_and_a_no_op_writes_nothing(tmp_path):
    project = Project(tmp_path / "proj")
    project.add_tiny()
    done = project.doit_cli("-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")}
    data = json.loads((project.root / "build/trace.json").read_text())
    slices = ran_slices(data["traceEvents"])
    assert sorted(e["name"] for e in slices) == sorted(ran)   # one slice per task that ran
    for e in slices:
        assert (
            e["args"]["stage"] == e["name"].split(":")[0]
            and e["args"]["status"] == "ran"
            and e["dur"] >= 0
        )
    assert {e["args"].get("chip") for e in slices if e["name"].startswith("compile:")} == {
        "SM8550",
        "SM8750",
    }
    for lane in {e["tid"] for e in slices}:  # a lane never overlaps itself
        mine = sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in data["traceEvents"]
            if e["ph"] == "X" and e["tid"] == lane
        )
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:])), mine
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert max(e["args"]["tasks"] for e in counters if e["name"] == "tasks running") >= 1
    assert any(e["name"] == "load average" for e in counters)
    line = next(x for x in done.stdout.splitlines() if x.startswith("critical path "))
    assert line == data["otherData"]["critical_path"]
    assert " → report " in line and line.endswith("% busy") and "2 jobs" in line
    report = (project.root / "build/report.md").read_text()
    assert f"## Last build\n\n{line}\n" in report and "(trace.svg)" in report
    assert "<svg" in (project.root / "build/report.html").read_text()
    assert (project.root / "build/trace.svg").read_text().startswith("<svg")
    assert len(os.listdir(project.root / "build/traces")) == 1

    before = {p: (project.root / p).read_bytes() for p in ("build/trace.json", "build/report.md")}
    again = project.doit_cli("-n", "2")
    assert (
        again.returncode == 0 and ".  " not in again.stdout and "critical path" not in again.stdout
    )
    # the report's section is its own
    assert {p: (project.root / p).read_bytes() for p in before} == before
    assert len(os.listdir(project.root / "build/traces")) == 1


def test_lanes_never_overlap_and_reuse_the_lowest_free():
    slices = [
        Slice("a", 0, 4, "ran"),
        Slice("b", 0, 1, "ran"),
        Slice("c", 1, 3, "ran"),
        Slice("d", 4, 5, "ran"),
    ]
    assert trace.lanes(slices) == [0, 1, 1, 0]
    # waits from 3.5
    assert trace.lanes([Slice("a", 0, 4, "ran"), Slice("d", 4.5, 5, "ran", waited=1.0)]) == [0, 1]


def test_the_critical_path_follows_dependencies_and_waits_for_a_job():
    deps = {
        "export:m/enc": set(),
        "export:m/dec": set(),
        "parity:m": {"export:m/enc", "export:m/dec"},
        "compile:m/enc@A": {"parity:m"},
        "compile:m/enc@B": {"parity:m"},
    }
    slices = [
        Slice("export:m/enc", 0, 6, "ran"),
        Slice("export:m/dec", 0, 2, "ran"),
        Slice("parity:m", 6, 9, "ran"),
        Slice("compile:m/enc@A", 9, 20, "ran"),
        Slice("compile:m/enc@B", 20, 31, "ran"),
    ]
    path = trace.critical_path(slices, deps)
    assert [(s.task, waited) for s, waited in path] == [
        ("export:m/enc", False),
        ("parity:m", False),
        ("compile:m/enc@A", False),
        ("compile:m/enc@B", True),
    ]
    line = trace.summary(slices, deps, wall=31.5, jobs=1)
    assert line.startswith(
        "critical path 31.0 s of 31.5 s wall: export:m/enc 6.0 s → parity:m 3.0 s → "
    )
    assert "compile:m/enc@A 11.0 s ⇢ compile:m/enc@B 11.0 s; 1 jobs, " in line
    # a dependency that did not run counts through to the one it depends on
    assert [
        s.task
        for s, _ in trace.critical_path(
            slices[:3], {**deps, "parity:m": {"group"}, "group": {"export:m/enc"}}
        )
    ] == ["export:m/enc", "parity:m"]


def test_the_reporter_marks_restored_tasks_and_slot_waits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("build")
    after = []
    reporter = trace.console(2, (after.append,))(io.StringIO(), {})
    tasks = {"a": Task("a", ["true"], targets=["x"]), "b": Task("b", ["true"], file_dep=["x"])}
    reporter.initialize(tasks, ["b"])
    reporter.execute_task(tasks["a"])
    trace.note("a", restored=True)
    reporter.add_success(tasks["a"])
    reporter.execute_task(tasks["b"])
    asked = time.monotonic()
    time.sleep(0.05)
    trace.note("b", slot_wait=(asked, time.monotonic()))
    reporter.add_success(tasks["b"])
    reporter.complete_run()
    events = json.loads(open("build/trace.json").read())["traceEvents"]
    by_name = {e["name"]: e for e in events if e["ph"] == "X"}
    assert by_name["a"]["args"]["status"] == "restored" and by_name["b"]["args"]["status"] == "ran"
    wait = by_name["b (waits for a b slot)"]
    assert (
        wait["cat"] == "wait"
        and wait["dur"] >= 40_000
        and wait["ts"] + wait["dur"] == by_name["b"]["ts"]
    )
    assert (
        len(after) == 1
        and after[0].startswith("critical path ")
        and "a " in after[0]
        and " → b " in after[0]
    )
