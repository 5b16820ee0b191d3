"""build/trace.json: where a build's time went, in the Chrome trace-event format (opens as it is in
Perfetto and chrome://tracing), build/trace.svg (the same as a picture, one row per lane) and the
critical path of what ran, as one line at the end of the build. A doit reporter mixin (`Traced`):
every reporter of the build carries it, the console one of a CI log too. A run that ran nothing
writes nothing. The last few traces are kept in build/traces/.

Lanes are slots, not threads: each task that ran goes on the lowest lane free when it started, so a
lane never overlaps itself and the lanes in use at a moment are the tasks running then. A task's
wait for a stage slot (limits.py) is a slice of its own on its lane, before the task's.

The critical path walks back from the task that ended last to what let it start: the dependency
(task_dep, or the task whose target it reads) that ended last or, when it started later than that
because every job or its stage's slots were taken, the task that ended last before it started (a `⇢`
in the line: it waited for a job or a slot).

Every build ends with one line of counts: `N ran, M up to date, K failed (…)`, or `nothing to do`
for a no-op; what failed is kept in build/failed.json (failures.py) until it passes."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from html import escape

from doit.reporter import ConsoleReporter

from toolchain.engine import paths
from toolchain.engine.files import atomic_path
from toolchain.engine.state import failures

KEPT = 5   # traces of earlier builds kept in build/traces/
# seconds after its last dependency ended that a start counts as a wait for a job or a slot
LATE = 0.5

# What an action says of its own run, for the trace (a restore from the cache, a wait for a slot):
# actions run in doit's threads of this process (par_type "thread"), the reporter reads it when
# the task ends.
_noted: dict[str, dict] = {}
_lock = threading.Lock()


def note(task_name: str, **fields) -> None:
    """Record a fact of the task's run: restored=True (cache/), slot_wait=(start,
    end) in time.monotonic()."""
    with _lock:
        _noted.setdefault(task_name, {}).update(fields)


def _take(task_name: str) -> dict:
    with _lock:
        return _noted.pop(task_name, {})


@dataclass(frozen=True)
class Slice:
    task: str
    start: float    # seconds since the build began (after its slot wait, if it waited)
    end: float
    status: str     # "ran", "restored" (from the artifact cache) or "failed"
    waited: float = 0.0   # seconds it waited for a stage slot before `start`
    # whom the task is built for, from its meta (the stage's owner: model, graph, chip, family)
    owner: dict = field(default_factory=dict)

    def parts(self) -> dict:
        """Its stage (doit's task group, the name before ':') and its owner's parts."""
        return {"stage": self.task.partition(":")[0], **self.owner}


def lanes(slices: list[Slice]) -> list[int]:
    """The lane of each slice (its slot wait included): the lowest one free when it began."""
    free_at: list[float] = []
    lane_of = []
    for s in slices:
        began = s.start - s.waited
        lane = next((i for i, t in enumerate(free_at) if t <= began), len(free_at))
        if lane == len(free_at):
            free_at.append(0.0)
        free_at[lane] = s.end
        lane_of.append(lane)
    return lane_of


def critical_path(slices: list[Slice], deps: dict[str, set[str]]) -> list[tuple[Slice, bool]]:
    """The chain that set the build's length, first to last: (slice, True when it waited for a job
    or a slot after what it depends on ended, and the slice before it is the one that freed it)."""
    by_name = {s.task: s for s in slices}
    if not by_name:
        return []

    def ran_deps(name: str, seen: set) -> set[str]:
        """Its dependencies that ran (through those that did not, to theirs)."""
        found = set()
        for dep in deps.get(name, ()):
            if dep not in seen:
                seen.add(dep)
                found |= {dep} if dep in by_name else ran_deps(dep, seen)
        return found

    last = max(slices, key=lambda s: s.end)
    path: list[tuple[Slice, bool]] = []
    while True:
        began = last.start - last.waited
        before = [by_name[d] for d in ran_deps(last.task, set()) if by_name[d].end <= began + 1e-6]
        ready = max((s.end for s in before), default=0.0)
        freed = [s for s in slices if ready < s.end <= last.start + 1e-6 and s is not last]
        if freed and last.start - ready > LATE:   # it was ready, but every job or slot was taken
            path.append((last, True))
            last = max(freed, key=lambda s: s.end)
        elif before:
            path.append((last, False))
            last = max(before, key=lambda s: s.end)
        else:
            path.append((last, False))
            return path[::-1]


def summary(slices: list[Slice], deps: dict[str, set[str]], wall: float, jobs: int) -> str:
    path = critical_path(slices, deps)
    length = sum(s.end - s.start for s, _ in path)
    busy = sum(s.end - s.start for s in slices) / max(wall * jobs, 1e-9)
    steps = "".join((" ⇢ " if waited else " → ") * (i > 0) + f"{s.task} {s.end - s.start:.1f} s"
                    for i, (s, waited) in enumerate(path))
    return (
        f"critical path {length:.1f} s of {wall:.1f} s wall: {steps}; {jobs} jobs, {busy:.0%} busy"
    )


def events(slices: list[Slice], load: list[tuple[float, float]]) -> list[dict]:
    """Trace events: a complete event per slice (and per slot wait) on its lane, lane names, and
    counters of tasks running and of the 1-minute load average."""
    out: list[dict] = []
    lane_of = lanes(slices)
    for lane in sorted(set(lane_of)):
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": lane,
                "args": {"name": f"slot {lane}"},
            }
        )
    out.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "doit"}})
    for s, lane in zip(slices, lane_of):
        if s.waited:
            out.append(
                {
                    "ph": "X",
                    "name": f"{s.task} (waits for a {s.parts()['stage']} slot)",
                    "cat": "wait",
                    "pid": 1,
                    "tid": lane,
                    "ts": _us(s.start - s.waited),
                    "dur": _us(s.waited),
                    "args": {**s.parts(), "status": "waited for a slot"},
                }
            )
        out.append(
            {
                "ph": "X",
                "name": s.task,
                "cat": s.parts()["stage"],
                "pid": 1,
                "tid": lane,
                "ts": _us(s.start),
                "dur": _us(s.end - s.start),
                "args": {**s.parts(), "status": s.status},
            }
        )
    edges = sorted([(s.start, 1) for s in slices] + [(s.end, -1) for s in slices])
    running = 0
    for t, step in edges:
        running += step
        out.append(
            {"ph": "C", "name": "tasks running", "pid": 1, "ts": _us(t), "args": {"tasks": running}}
        )
    for t, value in load:
        out.append(
            {"ph": "C", "name": "load average", "pid": 1, "ts": _us(t), "args": {"1 min": value}}
        )
    return out


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


COLORS = {"export": "#4e79a7", "simplify": "#76b7b2", "parity": "#f28e2b", "rewrite": "#edc948",
          "convert": "#59a14f", "quantize": "#b07aa1", "compile": "#e15759", "verify": "#9c755f",
          "wait": "#dddddd"}


def picture(slices: list[Slice], summary_line: str) -> str:
    """The timeline as a self-contained SVG: one row per lane, a box per task (its stage's colour,
    grey for a slot wait), the task's name as its tooltip."""
    lane_of, wall = lanes(slices), max((s.end for s in slices), default=1.0) or 1.0
    width, row, left = 960, 22, 60
    scale = (width - left - 10) / wall
    rows = max(lane_of, default=0) + 1
    boxes = [
        f'<text x="4" y="{30 + i * row + 15}" font-size="11">slot {i}</text>' for i in range(rows)
    ]
    for s, lane in zip(slices, lane_of):
        y = 30 + lane * row
        for start, end, colour, name in (
            [(s.start - s.waited, s.start, COLORS["wait"], f"{s.task}: slot wait")]
            if s.waited
            else []
        ) + [(s.start, s.end, COLORS.get(s.parts()["stage"], "#bab0ac"), s.task)]:
            boxes.append(
                f'<rect x="{left + start * scale:.1f}" y="{y}" '
                f'width="{max((end - start) * scale, 0.5):.1f}" '
                f'height="{row - 4}" fill="{colour}"><title>{escape(name)} {end - start:.1f} '
                's</title></rect>'
            )
    ticks = "".join(
        f'<text x="{left + t * scale:.1f}" y="{30 + rows * row + 12}" font-size="10">{t:.0f} '
        's</text>'
        for t in [wall * i / 5 for i in range(6)]
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{50 + rows * row}" '
        'font-family="sans-serif"><text x="4" y="16" '
        f'font-size="12">{escape(summary_line[:150])}</text>'
        + "".join(boxes)
        + ticks
        + "</svg>\n"
    )


def write(slices: list[Slice], load: list[tuple[float, float]], summary_line: str) -> None:
    """build/trace.json and trace.svg (each written whole, then renamed), and a copy of the trace in
    build/traces/ with the last KEPT."""
    trace = {"traceEvents": events(slices, load), "displayTimeUnit": "ms",
             "otherData": {"critical_path": summary_line}}
    text = json.dumps(trace, ensure_ascii=False)
    with atomic_path(paths.TRACE) as tmp:
        tmp.write_text(text)
    with atomic_path(paths.TRACE_SVG) as tmp:
        tmp.write_text(picture(slices, summary_line))
    os.makedirs(paths.TRACES, exist_ok=True)
    with atomic_path(os.path.join(paths.TRACES, time.strftime("%Y%m%d-%H%M%S") + ".json")) as tmp:
        tmp.write_text(text)
    kept = sorted(f for f in os.listdir(paths.TRACES) if f.endswith(".json"))
    for old in kept[:-KEPT]:
        os.remove(os.path.join(paths.TRACES, old))


class Traced:
    """A doit reporter mixin: records when each task with actions ran, and at the end of a run that
    ran any, writes the trace, prints the critical path and calls each of `after(summary_line)` (the
    report's section of the last build). `jobs`: the steps at once of this run."""

    jobs = 1
    after: tuple = ()
    # no `-- task` line per up-to-date task: the build's last line counts them
    quiet_up_to_date = True

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)  # type: ignore[misc]
        self._tasks, self._t0, self._open, self._slices = tasks, time.monotonic(), {}, []
        self._load = [(0.0, round(os.getloadavg()[0], 2))]
        # task -> its one-line reason (tasks that ran and failed)
        self._failed: dict[str, str] = {}
        self._up_to_date = 0

    def _dependencies(self) -> dict[str, set[str]]:
        """Each task's task_dep and setup tasks, and the tasks whose targets it reads (made only
        when a task ran: a no-op pays nothing for the trace)."""
        producer = {t: name for name, task in self._tasks.items() for t in task.targets}
        return {
            name: set(task.task_dep)
            | set(task.setup_tasks)
            | {producer[f] for f in task.file_dep if f in producer}
            for name, task in self._tasks.items()
        }

    def execute_task(self, task):
        super().execute_task(task)  # type: ignore[misc]
        if task.actions:
            self._open[task.name] = time.monotonic() - self._t0

    def _ended(self, task, status: str) -> None:
        start = self._open.pop(task.name, None)
        if start is None:
            return
        now, noted = time.monotonic() - self._t0, _take(task.name)
        waited = 0.0
        if "slot_wait" in noted:
            waited = max(0.0, min(noted["slot_wait"][1] - self._t0, now) - start)
        status = "restored" if status == "ran" and noted.get("restored") else status
        owner = (task.meta or {}).get("owner", {})
        self._slices.append(Slice(task.name, start + waited, now, status, round(waited, 6), owner))
        self._load.append((now, round(os.getloadavg()[0], 2)))

    def add_success(self, task):
        self._ended(task, "ran")
        super().add_success(task)  # type: ignore[misc]

    def add_failure(self, task, fail):
        # it ran (doit reports the tasks it skipped for it as failures too)
        if task.name in self._open:
            self._failed[task.name] = failures.reason(fail)
        self._ended(task, "failed")
        super().add_failure(task, fail)  # type: ignore[misc]

    def skip_uptodate(self, task):
        if task.actions:
            self._up_to_date += 1
        if not self.quiet_up_to_date:
            super().skip_uptodate(task)  # type: ignore[misc]

    def complete_run(self):
        slices = sorted(self._slices, key=lambda s: s.start - s.waited)
        if slices and os.path.isdir(paths.BUILD):
            deps = self._dependencies()
            line = summary(slices, deps, time.monotonic() - self._t0, self.jobs)
            try:
                write(slices, self._load, line)
                failures.update(
                    self._tasks,
                    deps,
                    {s.task for s in slices if s.status != "failed"},
                    self._failed,
                )
                for then in self.after:
                    try:
                        then(line)
                    # a record it reads is damaged or old: one line
                    except (KeyError, ValueError, TypeError) as err:
                        self.write(
                            f"after the build: {getattr(then, '__qualname__', then)} stopped: "
                            f"{err!r}\n"
                        )  # type: ignore[attr-defined]
            except OSError:
                pass   # a read-only build/: the build's outcome is not the trace's
            self.write(line + "\n")  # type: ignore[attr-defined]
        super().complete_run()  # type: ignore[misc]
        self.write(self.counts(slices) + "\n")  # type: ignore[attr-defined]

    def counts(self, slices: list[Slice]) -> str:
        """The build's last line: what ran, what was up to date, what failed (Ninja's "no work to
        do" for a no-op)."""
        if not slices:
            return f"nothing to do: {self._up_to_date} tasks up to date"
        ran = sum(1 for s in slices if s.status == "ran")
        restored = sum(1 for s in slices if s.status == "restored")
        line = f"{ran} ran, " + (f"{restored} restored from the cache, " if restored else "")
        line += f"{self._up_to_date} up to date, {len(self._failed)} failed"
        if self._failed:
            names = sorted(self._failed)
            line += (
                f" ({', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
            )
            line += f"; {paths.FAILED})" if os.path.isfile(paths.FAILED) else ")"
        return line


def console(jobs: int, after: tuple = ()) -> type:
    """doit's own console reporter with the trace (a CI log: no [n/N] lines)."""
    return type("TracedConsoleReporter", (Traced, ConsoleReporter), {"jobs": jobs, "after": after})
