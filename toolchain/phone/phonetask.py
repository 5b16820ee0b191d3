"""Plumbing of the phone tasks: an action run in doit's process with its output kept in a log, and
checked command-line numbers."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from doit.exceptions import TaskFailed

from toolchain.errors import StageFailed


def run_logged(function, kwargs: dict, log: str):
    """Run a phone step here, output to the console and `log`. Not through worker.run: its
    artifact cache must never replay a measurement. StageFailed (adb, accuracy, setup) becomes one
    line, no traceback."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
        try:
            function(**kwargs)
        except StageFailed as err:
            print(f"FAILED: {err}")
            return TaskFailed(str(err))
    return None


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()
