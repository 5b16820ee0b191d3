"""A fork server for the worker's steps: each doit process starts one server that imports the heavy
Python stack once (torch, onnx, onnxruntime, onnxsim: ~5 s a step before), and every step is a fresh
fork of it.

Why a fork keeps what a fresh process gave (docs/scale.md, "Steps are forks"):
- the server only imports; it never builds a model, opens a session or compiles, so each
step starts from
  the same pristine state a fresh interpreter reaches after the same imports (one
  compile per process);
- a step is a child of a child: the server forks a waiter per request, the waiter forks the step and
  reports how it ended, so a step that segfaults, leaks or patches a module dies alone and the next
  step is forked from the untouched server;
- the step runs in the caller's folder with its stdout and stderr on the step's own log;
- the server is keyed by the caller's environment (a changed variable starts a new server: libraries
  read some at import) and ends when its doit process does (its stdin closes).
`doit workers=fresh` (or QNN_WORKERS=fresh) runs every step in a new interpreter
instead, as before."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import IO

# `python -m toolchain.engine.run.worker --serve ADDRESS` starts a server (worker.py knows the step)
SERVE = "--serve"
MODES = ("fork", "fresh")
STOP = b"stop\n"   # what doit writes to a server's stdin before closing it at a clean end
PR_SET_PDEATHSIG = 1   # prctl(2): a signal for this process when the thread that started it ends


class Server:
    """The parent's handle on one fork server."""

    def __init__(self, env: dict, preload: tuple = ()):
        # Linux abstract socket: no file
        self.address = f"fork-server-{os.getpid()}-{os.urandom(6).hex()}"
        # its own process group, which its waiters and steps join: when doit is gone, it ends
        # them all (serve())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolchain.engine.run.worker", SERVE, self.address, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,
        )
        stdin, out = self.process.stdin, self.process.stdout   # both pipes, as asked for just above
        assert stdin is not None and out is not None
        self.stdin: IO[bytes] = stdin
        line = out.readline()
        if line.strip() != b"ready":
            self.stop()
            raise OSError(f"fork server did not start (said {line[:200]!r})")

    def call(self, function: str, kwargs: str, log: str) -> int:
        """Run one step; its exit code as subprocess gives it (negative: killed by that signal)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect("\0" + self.address)
            request = {
                "function": function,
                "kwargs": kwargs,
                "log": os.path.abspath(log),
                "cwd": os.getcwd(),
            }
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = conn.makefile("rb").readline()
        if not reply:
            raise OSError("the fork server's waiter ended without an answer")
        return json.loads(reply)["rc"]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.stdin.write(STOP)   # a clean stop: steps it started finish on their own
            self.stdin.close()       # (EOF without it: doit is gone, and the server ends its steps)
        self.process.wait()


_SERVERS: dict[tuple[int, str], Server] = {}
_LOCK = threading.Lock()


def _key(env: dict, preload: tuple = ()) -> tuple[int, str]:
    """(this process, its environment and preloads): a forked doit process or a changed variable
    gets its own."""
    return os.getpid(), hashlib.sha256(
        json.dumps([env, list(preload)], sort_keys=True).encode()
    ).hexdigest()


def server(env: dict, preload: tuple = ()) -> Server:
    """This process's server for `env` (doit's threads share it; a forked doit process starts its
    own), having imported the `preload` packages before its first fork (the pipeline names what the
    heavy steps import)."""
    key = _key(env, preload)
    with _LOCK:
        if not _SERVERS:
            atexit.register(stop_all)   # doit ends: its servers end with it (and are waited for)
        for old in [k for k in _SERVERS if k != key and k[0] == key[0]]:
            # the environment changed: the old server's imports may not hold
            _SERVERS.pop(old).stop()
        found = _SERVERS.get(key)
        if found is None or not found.alive():
            found = _SERVERS[key] = Server(env, preload)
        return found


def stop_all() -> None:
    """Stop this process's servers (registered at exit; a forked child leaves
    its parent's alone)."""
    with _LOCK:
        mine = [k for k in _SERVERS if k[0] == os.getpid()]
        servers = [_SERVERS.pop(k) for k in mine]
    for found in servers:
        found.stop()


def forget(env: dict, preload: tuple = ()) -> None:
    """Drop a server that failed (the step falls back to a fresh process; the next one starts
    a new server)."""
    with _LOCK:
        found = _SERVERS.pop(_key(env, preload), None)
    if found is not None:
        found.stop()


def die_with_parent() -> None:
    """A fresh step (`workers=fresh`): SIGTERM when the doit thread that started it, which waits for
    it, ends, as it does when doit is killed (Linux prctl; elsewhere nothing). Then it checks it was
    not orphaned already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:
        os._exit(128 + signal.SIGTERM)


# ---- the server process
# --------------------------------------------------------------------------------

def serve(address: str, step, preload=()) -> None:
    """Import the stack, then fork a waiter per request until stdin closes; `step([function,
    kwargs])` is the worker's main, run in each step's fork. Stdin closing without a STOP first
    means the doit that started it is gone (killed): then every waiter and step it forked (its
    process group) gets SIGTERM with it."""
    # Ctrl-C stops doit and the steps; the server ends on EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # waiters are reaped by the kernel
    for name in preload:   # absent ones skipped
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(64)
    os.write(1, b"ready\n")
    stopped = False
    while True:
        ready, _, _ = select.select([listener.fileno(), 0], [], [])
        if 0 in ready:
            said = os.read(0, 4096)
            stopped = stopped or STOP.strip() in said
            if not said and stopped:
                return   # doit ended its build
            if not said:
                # doit was killed: no step outlives it (this server neither)
                os.killpg(0, signal.SIGTERM)
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _wait_for_step(conn, step)   # never returns
            conn.close()


def _wait_for_step(conn: socket.socket, step) -> None:
    """The waiter: fork the step, wait for it, answer how it ended."""
    rc = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request = json.loads(conn.makefile("rb").readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            _step(request, step)   # never returns
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        conn.sendall(json.dumps({"rc": rc}).encode() + b"\n")
    finally:
        os._exit(0)


def _step(request: dict, step) -> None:
    """The step: what `python -m toolchain.engine.run.worker` does, in a fork, in
    the caller's folder."""
    rc = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]   # as `python -m` started there would have it
        fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.argv = [sys.argv[0], request["function"], request["kwargs"]]   # as the fresh worker's
        # fresh entropy, as a new interpreter has: forks must not share unseeded randomness
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        rc = step([request["function"], request["kwargs"]])
    except SystemExit as done:
        rc = done.code if isinstance(done.code, int) else 1
    except KeyboardInterrupt:
        rc = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()   # as a fresh interpreter's exit would
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)
