"""Progress with an ETA, as a doit reporter (doit's reporter API: nothing prints from actions).
Keeps the console reporter's `.  task` lines (not its `-- task` per up-to-date task: the build's
last line counts them) and adds, as each task ends, `[n/N]` over the tasks with actions that were
selected, its duration, the time so far and an estimate of the time left from the durations earlier
builds recorded (build/.durations.json), or "unknown" when there is none yet. `CI=true` keeps doit's
plain reporter; `--reporter` chooses another as usual."""
from __future__ import annotations

import json
import os
import sys
import time

from doit.reporter import ConsoleReporter

from toolchain.engine import paths
from toolchain.engine.files import atomic_path
from toolchain.engine.run.trace import Traced


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def requested_jobs(argv: list[str], default: int) -> int:
    """`-n N` / `--process=N` from doit's command line (its options do not reach a
    reporter), else `default`."""
    for i, arg in enumerate(argv):
        if arg in ("-n", "--process") and i + 1 < len(argv) and argv[i + 1].isdigit():
            return max(1, int(argv[i + 1]))
        if arg.startswith(("-n", "--process=")) and arg.split("=")[-1].lstrip("-n").isdigit():
            return max(1, int(arg.split("=")[-1].lstrip("-n")))
    return default


def load_durations() -> dict:
    try:
        with open(paths.DURATIONS) as f:
            return {k: float(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def for_run(jobs: int, after: tuple = ()) -> type[ProgressReporter]:
    """doit's `reporter` for this run (doit makes it with its stream and options): `jobs` as
    resolved at load, `after`: what to call with the critical path after a build that ran
    something (trace.Traced)."""
    return type("ProgressReporter", (ProgressReporter,), {"default_jobs": jobs, "after": after})


class ProgressReporter(Traced, ConsoleReporter):
    desc = "console output with [n/N], task durations and an ETA"
    default_jobs = 1   # steps at once without -n (for_run gives this run's)

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.jobs = requested_jobs(sys.argv, self.default_jobs)
        self.known = load_durations()
        self.started_at, self.running, self.done, self.ran, self.total = (
            time.monotonic(),
            {},
            set(),
            {},
            0,
        )
        self.pending = set()

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        wanted, todo = set(), list(selected_tasks)
        while todo:   # the selected tasks and everything they depend on
            name = todo.pop()
            if name in wanted or name not in tasks:
                continue
            wanted.add(name)
            task = tasks[name]
            todo += list(task.task_dep) + list(task.setup_tasks)
        self.pending = {n for n in wanted if tasks[n].actions and not n.startswith("_")}
        self.total = len(self.pending)

    def execute_task(self, task):
        super().execute_task(task)
        self.running[task.name] = time.monotonic()

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        self._finished(task, None)

    def skip_ignore(self, task):
        super().skip_ignore(task)
        self._finished(task, None)

    def add_success(self, task):
        super().add_success(task)
        started = self.running.pop(task.name, None)
        # a group task (no action, run by every no-op) takes no time
        if started is not None and task.actions:
            self.ran[task.name] = time.monotonic() - started
            self._finished(task, self.ran[task.name])
            self.save()

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        self.running.pop(task.name, None)
        self._finished(task, None)

    def _finished(self, task, seconds: float | None):
        if task.name not in self.pending:
            return
        self.pending.discard(task.name)
        self.done.add(task.name)
        if seconds is None:
            # an up-to-date task: only the count moves, as the console reporter's `--` line says
            return
        self.write(f"   [{len(self.done)}/{self.total}] {task.name} {seconds:.1f} s · "
                   f"{clock(time.monotonic() - self.started_at)} so far · ETA {self.eta()}\n")

    def eta(self) -> str:
        """Time left: the recorded durations of the tasks not reached yet, weighted by the
        share of recorded time that actually had to run so far (an incremental build skips
        most), over the jobs."""
        left = [self.known[n] for n in self.pending if n in self.known]
        if not left:
            return "unknown" if self.pending else "0:00"
        seen = [n for n in self.done if n in self.known]
        share = (
            sum(self.known[n] for n in seen if n in self.ran)
            / max(sum(self.known[n] for n in seen), 1e-9)
            if seen
            else 1.0
        )
        running = sum(
            max(self.known.get(n, 0) - (time.monotonic() - t), 0) for n, t in self.running.items()
        )
        return "~" + clock((sum(left) * share + running) / self.jobs)

    def complete_run(self):
        super().complete_run()
        self.save()

    def save(self):
        """Merge this run's durations into the record (after each task: an interrupted
        build keeps them)."""
        if self.ran and os.path.isdir(paths.BUILD):
            try:
                with atomic_path(paths.DURATIONS) as tmp:
                    tmp.write_text(
                        json.dumps(
                            {**load_durations(), **{k: round(v, 2) for k, v in self.ran.items()}},
                            indent=0,
                            sort_keys=True,
                        )
                    )
            except OSError:
                pass   # a read-only build/: the estimate just stays as it was
