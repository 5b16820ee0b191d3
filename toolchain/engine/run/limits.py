"""Per-stage concurrency limits under `doit -n N` (Ninja's pools): a memory-heavy stage runs in one
of a few slots, so N-wide builds never hold N large compiles in memory at once. The slots are file
locks under build/.locks: they hold across doit's threads, its processes and two doit runs in one
checkout. The counts are resolved once at load (pipeline.slots, from toolchain/options.py's `limits`
and `jobs`) and reach each task as task.meta["slots"]."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time

from toolchain.engine import paths
from toolchain.engine.run import trace

POLL = 0.05   # seconds between attempts while every slot is taken


def memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def slots_for(threads: int, peak_gb: float, jobs: int, memory: float) -> int:
    """A stage's slots: as many steps as fit the cores by their own threads (two 2-thread simulators
    on two cores only fight) and three quarters of the memory by their measured peak; 0 (no limit)
    when that is all the jobs anyway."""
    slots = max(1, min(jobs // max(threads, 1), int(memory * 0.75 // peak_gb)))
    return 0 if slots >= jobs else slots


def parse(text: str, stages) -> dict[str, int]:
    """'compile:2,verify:1' -> {'compile': 2, 'verify': 1}; 0 means no limit. ValueError says
    what is wrong."""
    found = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        stage, _, count = item.partition(":")
        if not stage or not count.isdigit():
            raise ValueError(f"{item!r} is not <stage>:<slots> (example: compile:2,verify:1)")
        if stage not in stages:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(stage, stages, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"stages: {', '.join(stages)}"
            raise ValueError(f"{item!r}: no stage {stage!r}; {hint}")
        found[stage] = int(count)
    return found


@contextlib.contextmanager
def slot(stage: str, slots: int):
    """Hold one of the stage's `slots` for the block (at once when 0: no limit)."""
    if not slots:
        yield
        return
    folder = paths.LOCKS
    os.makedirs(folder, exist_ok=True)
    while True:
        for i in range(slots):
            fd = os.open(f"{folder}/{stage}.{i}", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)   # releases the lock
            return
        time.sleep(POLL)


def call(task, function, *args):
    """function(*args) inside a slot of the task's pool (stages may share one: meta["pool"]), else
    of its stage (the part of its name before ':')."""
    meta = task.meta or {}
    asked = time.monotonic()
    with slot(meta.get("pool") or task.name.split(":")[0], meta.get("slots", 0)):
        # it waited: the trace shows the wait as a slice of its own
        if time.monotonic() - asked > POLL / 2:
            trace.note(task.name, slot_wait=(asked, time.monotonic()))
        return function(*args)
