"""One build per folder: a `doit` that runs or cleans tasks holds build/.build.lock (an flock,
released by the kernel when the process dies, so a killed build never leaves a stale lock). A second
one exits at once naming the holder; `doit list`/`info` never wait."""
from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time

from doit.exceptions import InvalidDodoFile

from toolchain.engine import paths

# doit commands that build nothing
READ_ONLY = {"list", "info", "help", "dumpdb", "strace", "tabcompletion", "reset-dep"}
# path -> fd, for this process's life (the tests run doit in-process repeatedly)
_HELD: dict[str, int] = {}


def command(argv: list[str]) -> str:
    """The doit command an argv runs (`run` when none is named)."""
    words = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
    return (
        words[0]
        if words and words[0] in READ_ONLY | {"run", "clean", "forget", "ignore", "auto"}
        else "run"
    )


def hold(argv: list[str]) -> bool:
    """Take the build lock for a command that writes build/ (or say who has it and stop);
    True when held."""
    if command(argv) in READ_ONLY:
        return False
    path = os.path.abspath(paths.BUILD_LOCK)
    if path in _HELD:
        return True
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise InvalidDodoFile(
            f"{paths.BUILD_LOCK}: cannot create the build lock ({err.strerror}): make "
            f"{paths.BUILD} writable, then run again"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise InvalidDodoFile(f"{paths.BUILD}: another doit is building in this folder ({holder}); "
                              f"wait for it to finish (or stop it), then run again") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
    _HELD[path] = fd
    return True


def release() -> None:
    """Let go of every lock this process holds (a process that runs doit more than once, as
    the tests do)."""
    while _HELD:
        os.close(_HELD.popitem()[1])


def on_interrupt() -> None:
    """Ctrl-C or SIGTERM during a build: say what is kept and stop, instead of doit's traceback.
    Every finished task is already committed (statedb.py) and temp files are swept next time, so
    nothing is lost but the steps that were running (their child processes get the same signal)."""
    if threading.current_thread() is not threading.main_thread():
        return   # signal handlers belong to the main thread

    def stop(signum, frame):
        name = signal.Signals(signum).name
        print(
            f"\n{name}: stopped; finished tasks are kept, the running ones will rerun: `doit` "
            "resumes.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
