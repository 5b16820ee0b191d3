"""Run one heavy step in its own process: a crash or leak cannot take doit down, and each
compile gets a fresh process (the QNN EP numbers tensors per process: docs/scale.md)."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback

from doit.exceptions import TaskError, TaskFailed

from toolchain.engine import cache
from toolchain.engine.files import atomic_path
from toolchain.engine.run import limits, zygote
from toolchain.errors import StageFailed  # the worker's importers of old took it from here

FAILED = "STAGE-FAILED: "
EXIT_FAILED = 3
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # toolchain/
FUNCTION = "__function__"


def run(function, kwargs: dict, log: str, task):
    """Call module-level `function(**kwargs)` in a child process, output to `log`; a
    doit action result.
    doit fills in `task` (a parameter it knows by name): its file_dep, config_changed settings and
    targets key the artifact cache (cache/), its stage picks the concurrency limit (limits.py), its
    meta the worker mode (a fork of the fork server, or a fresh interpreter: zygote.py)."""
    name, plain = qualified(function), to_json(kwargs)
    action = {"function": name, "kwargs": plain}
    meta = task.meta or {}
    # a task may name another interpreter (and its whole environment) for its step, e.g. a
    # toolchain release installed in its own venv: the step then runs there, never in a fork of
    # this process's server
    interpreter = (meta["python"], meta.get("python_env")) if meta.get("python") else None
    fresh = meta.get("workers") == "fresh"
    return cache.run(task, action, function.__module__, log,
                     lambda: limits.call(task, _call, name, plain, log, fresh, interpreter,
                                         tuple(meta.get("preload", ()))))


def in_process(function, *args, **kwargs):
    """Call a light step in doit's own process; a StageFailed it raises becomes the same one-line
    failure a worker's does (one failure style, whichever process runs the step)."""
    try:
        return function(*args, **kwargs)
    except StageFailed as err:
        return TaskFailed(str(err))


def qualified(function) -> str:
    """'package.module:function', how the child process finds a module-level function again."""
    if "." in function.__qualname__ or function.__module__ == "__main__":
        raise TypeError(f"{function!r}: a worker runs module-level functions only")
    return f"{function.__module__}:{function.__qualname__}"


def to_json(value):
    """`value` as plain JSON data; a function inside it (e.g. a backend's simulator factory) becomes
    {"__function__": "module:name"}, which from_json() turns back into the function in the child."""
    if callable(value):
        return {FUNCTION: qualified(value)}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def from_json(text: str):
    return json.loads(
        text, object_hook=lambda d: _function(d[FUNCTION]) if set(d) == {FUNCTION} else d
    )


def _function(name: str):
    module_name, _, attr = name.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _call(
    function: str,
    kwargs: dict,
    log: str,
    fresh: bool = False,
    interpreter: tuple | None = None,
    preload: tuple = (),
):
    started = time.monotonic()
    python, own_env = interpreter or (sys.executable, None)
    env = {**(own_env or os.environ), "PYTHONUNBUFFERED": "1"}
    with atomic_path(log) as tmp:
        # append: a forked step writes to the same file through its own handle
        with open(tmp, "a") as out:
            out.write(f"# {function} {json.dumps(kwargs, sort_keys=True)}\n")
            if interpreter:
                out.write(f"# in {python}\n")
        rc = _fresh(function, kwargs, tmp, env, python) if fresh or interpreter else \
            _forked(function, kwargs, tmp, env, preload)
        with open(tmp, "a") as out:
            out.write(f"# exit {rc} after {time.monotonic() - started:.1f} s\n")
        text = tmp.read_text(errors="replace")
    if rc == 0:
        return None
    lines = text.splitlines()
    failed = [line[len(FAILED):] for line in lines if line.startswith(FAILED)]
    if rc == EXIT_FAILED and failed:
        return TaskFailed(
            failed[-1] + ("" if "Error:" not in failed[-1] else f"\n  full traceback: {log}")
        )
    tail = "\n".join(lines[-25:])
    return TaskError(f"{function} {ended(rc)}; log {log}, last lines:\n{tail}")


def _fresh(function: str, kwargs: dict, log, env: dict, python: str = sys.executable) -> int:
    with open(log, "a") as out:
        return subprocess.call(
            [python, "-m", "toolchain.engine.run.worker", function, json.dumps(kwargs)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _forked(function: str, kwargs: dict, log, env: dict, preload: tuple = ()) -> int:
    try:
        server = zygote.server(env, preload)
        with open(log, "a") as out:
            out.write(f"# a fork of the fork server, pid {server.process.pid}\n")
        return server.call(function, json.dumps(kwargs), str(log))
    # the server is gone (killed, out of memory): this step runs fresh, the next gets a new one
    except OSError as err:
        zygote.forget(env, preload)
        with open(log, "a") as out:
            out.write(f"# fork server unavailable ({err}); running this step in a fresh process\n")
        return _fresh(function, kwargs, log, env)


def ended(rc: int) -> str:
    """'exited with 1', or for a step killed by a signal its name, meaning and likely cause: 'was
    killed by SIGSEGV (Segmentation fault: a crash in native code (...))' (a bare 'exited with
    -11' said nothing)."""
    if rc >= 0:
        return f"exited with {rc}"
    try:
        sig = signal.Signals(-rc)
    except ValueError:
        return f"was killed by signal {-rc}"
    return f"was killed by {sig.name} ({signal.strsignal(sig)}{SIGNAL_HINTS.get(sig.name, '')})"


SIGNAL_HINTS = {
    "SIGSEGV": ": a crash in native code (a library, or two libraries that clash in one process, "
               "e.g. "
    "libsndfile/soundfile after the accelerator's libraries: read WAVs with "
    "toolchain.modelkit.read_wav)",
    "SIGBUS": ": a file it had mapped changed or vanished, or the disk is full",
    "SIGKILL": ": stopped from outside, most often by the kernel's out-of-memory killer (see "
               "`dmesg`)",
    "SIGABRT": ": the process aborted itself, usually a failed assertion in a native library",
    "SIGFPE": ": an arithmetic fault in native code",
    "SIGILL": ": an instruction this CPU does not have (a library built for another CPU)",
}


def main(argv: list[str]) -> int:
    # the fork server (zygote.py): each step it forks runs main() below
    if argv[0] == zygote.SERVE:
        zygote.serve(argv[1], main, argv[2:])
        return 0
    func, kwargs = _function(argv[0]), from_json(argv[1])
    try:
        func(**kwargs)
    except StageFailed as err:
        sys.stdout.flush()
        print(f"{FAILED}{err}", flush=True)
        return EXIT_FAILED
    # the user's own code (a model module, a command) or ours: frames in the log
    except Exception as err:
        user = where_in_user_code(err)
        if user is None:
            raise
        traceback.print_exc(file=sys.stdout)
        print(f"{FAILED}{user}: {type(err).__name__}: {err}{missing_package(err)}", flush=True)
        return EXIT_FAILED
    return 0


def missing_package(err: BaseException) -> str:
    """What to do about a package the user's code imports and this environment lacks (the load-time
    check sees top-level imports only: this is one inside a function): the same fix the spec's
    `requires` check gives."""
    if not isinstance(err, ModuleNotFoundError) or not err.name or err.name.startswith("."):
        return ""
    package = err.name.split(".")[0]
    # the package is there, a module of it is not
    if package != err.name and package in sys.modules:
        return ""
    return (f"; {package} is not installed: pip install '{package}', and add it to the spec: "
            f"requires = [\"{package}\"] (checked at load)")


def where_in_user_code(err: BaseException) -> str | None:
    """'models/m.py:12 (in export)' for the innermost frame of an error raised in code outside
    this package and outside installed packages (the user's model module), or its syntax error's
    file and line."""
    if isinstance(err, SyntaxError) and err.filename and not _ours(err.filename):
        return f"{os.path.relpath(err.filename)}:{err.lineno}"
    user = [f for f in traceback.extract_tb(err.__traceback__) if not _ours(f.filename)]
    return (
        f"{os.path.relpath(user[-1].filename)}:{user[-1].lineno} (in {user[-1].name})"
        if user
        else None
    )


def _ours(filename: str) -> bool:
    """Frames of this package, of Python itself or of an installed package: not the user's code."""
    path = os.path.abspath(filename)
    return (
        path.startswith(_PACKAGE)
        or path.startswith(sys.prefix)
        or path.startswith(sys.base_prefix)
        or "site-packages" in path
        or filename.startswith("<")
    )


def load_module(path: str):
    """Import a model's own code (models/<module>.py) by path."""
    import importlib.util

    name = "model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_").replace(
        ".", "_"
    )
    cached = sys.modules.get(name)
    # another folder's (or a file since removed, e.g. init's temp folder): load this one
    if cached is not None and cached.__file__ and os.path.exists(cached.__file__) and \
            os.path.samefile(cached.__file__, path):
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file to import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    if sys.argv[1:2] != [zygote.SERVE]:
        zygote.die_with_parent()   # a fresh step ends with the doit that waits for it
    # Run the imported module's main, so StageFailed raised by stages is the class caught there.
    from toolchain.engine.run.worker import main as imported_main
    sys.exit(imported_main(sys.argv[1:]))
