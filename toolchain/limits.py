"""Per-stage concurrency limits under `doit -n N` (Ninja's pools): a memory-heavy stage runs in one of a
few slots, so N-wide builds never hold N large compiles in memory at once. The slots are file locks
under build/.locks: they hold across doit's threads, its processes and two doit runs in one checkout."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time

import doit

from toolchain import paths

# Memory-heavy: the compilers hold the whole graph several times over (QNN graph preparation).
DEFAULTS = {"compile": 1, "context": 1}
ENV, VAR = "QNN_LIMITS", "limits"
POLL = 0.05   # seconds between attempts while every slot is taken


def parse(text: str, where: str) -> dict[str, int]:
    """'compile:2,verify:1' -> {'compile': 2, 'verify': 1}; 0 means no limit."""
    found = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        stage, _, count = item.partition(":")
        if not stage or not count.isdigit():
            raise ValueError(f"{where}: {item!r} is not <stage>:<slots> (example: compile:2,verify:1)")
        found[stage] = int(count)
    return found


def configured() -> dict[str, int]:
    """DEFAULTS, overridden by $QNN_LIMITS, overridden by `doit limits=...`."""
    return {**DEFAULTS, **parse(os.environ.get(ENV, ""), f"${ENV}"),
            **parse(doit.get_var(VAR) or "", f"{VAR}=")}


@contextlib.contextmanager
def slot(stage: str):
    """Hold one of the stage's slots for the block (at once when the stage has no limit)."""
    slots = configured().get(stage, 0)
    if not slots:
        yield
        return
    folder = f"{paths.BUILD}/.locks"
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
    """function(*args) inside a slot of the task's stage (the part of its name before ':')."""
    with slot(task.name.split(":")[0]):
        return function(*args)
