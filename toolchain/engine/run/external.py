"""Run an external tool as a doit action: its own log kept, a failure is one message ending in
the log's tail."""
from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from doit.exceptions import TaskFailed

from toolchain.engine import cache
from toolchain.engine.files import sha256, write_json
from toolchain.engine.run import limits
from toolchain.engine.run.worker import ended

# prepended to the caller's value, as envsetup.sh does
PATH_LISTS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")
TAIL = 20


def environ(overrides: dict) -> dict:
    """os.environ with `overrides` applied."""
    merged = dict(os.environ)
    for key, value in overrides.items():
        old = merged.get(key)
        merged[key] = f"{value}{os.pathsep}{old}" if key in PATH_LISTS and old else value
    return merged


def run(argv: list[str], env: dict, log: str, outputs: list[str], record: str | None = None):
    """Run `argv` with stdout+stderr to `log`; fail if it exits non-zero or leaves an output
    unwritten. Old outputs go first and a failed run's outputs go after: nothing downstream can use
    a stale file."""
    _remove(outputs + ([record] if record else []))
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    for path in outputs:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w") as out:  # not atomic: the log of a failed run is what the user reads
        out.write(
            f"$ {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.join(argv)}\n"
        )
        out.flush()
        try:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, env=environ(env))
        except OSError as err:
            out.write(f"cannot start {argv[0]}: {err}\n")
            rc = 127
        seconds = time.monotonic() - started
        out.write(f"# exit {rc} after {seconds:.1f} s\n")
    missing = [p for p in outputs if not os.path.isfile(p)]
    if rc or missing:
        _remove(outputs)
        what = ended(rc) if rc else f"exited 0 but wrote no {', '.join(missing)}"
        return TaskFailed(f"{tool_name(argv)} {what}; log {log}, last lines:\n{tail(log)}")
    if record:
        write_json(record, {"argv": argv, "env": env, "seconds": round(seconds, 3),
                            "outputs": {p: sha256(p) for p in outputs}})
    return None


def action(argv: list[str], env: dict, log: str, outputs: list[str], record: str | None, task):
    """run() as a doit action: doit fills in `task`; cached and limited per stage
    as worker.run is."""
    return cache.run(
        task,
        {"argv": argv, "env": env},
        __name__,
        log,
        lambda: limits.call(task, run, argv, env, log, outputs, record),
        functools.partial(restored, record=record, outputs=outputs) if record else None,
    )


def restored(staged: dict, record: str, outputs: list[str]) -> list[str]:
    """Why files restored from a cache (`staged`: target -> the restored file) are not one run
    of the tool: the run's record must have its shape and name the sha256 of each output
    restored with it."""
    with open(staged[record], "rb") as f:
        ran = json.loads(f.read())
    if not (isinstance(ran.get("argv"), list) and isinstance(ran.get("env"), dict)
            and isinstance(ran.get("outputs"), dict)):
        return [f"{record} is not a tool run's record (argv, env, outputs)"]
    return [f"{out} has sha256 {sha256(staged[out])}, its record says {ran['outputs'].get(out)}"
            for out in outputs if sha256(staged[out]) != ran["outputs"].get(out)]


def tool_name(argv: list[str]) -> str:
    """The tool an argv runs (the script, when a Python runs it)."""
    first = os.path.basename(argv[0])
    return os.path.basename(argv[1]) if first.startswith("python") and len(argv) > 1 else first


def tail(log: str, lines: int = TAIL) -> str:
    """The last lines of a log."""
    return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])


def _remove(paths):
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)
