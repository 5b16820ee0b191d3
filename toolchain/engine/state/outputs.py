"""Outputs are part of the state (Bazel's rule): after a task succeeds its targets' size, mtime and
sha256 are recorded; on every `doit` a target whose size differs, or whose mtime or ctime
(stamps.py) differs and bytes too, makes its task stale, so a damaged checkpoint copy, ONNX, binary
or record is rebuilt rather than trusted, even when the damage kept its size and mtime. `doit
rehash=1` (or QNN_REHASH=1) compares every target's bytes, for damage that kept size and mtime."""
from __future__ import annotations

import os
import sqlite3
import stat
import threading

from doit.exceptions import TaskFailed

from toolchain.engine import files, paths
from toolchain.engine.state import failures, stamps, statedb

_LOCAL = threading.local()   # one connection per thread: doit -n N runs actions in threads


def _db() -> sqlite3.Connection:
    """This thread's connection to the build's record (per folder: a process may build several)."""
    where = os.path.abspath(paths.OUTPUTS_DB)
    conns = _LOCAL.__dict__.setdefault("conns", {})
    if where not in conns:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        conn = sqlite3.connect(where, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS outputs (task TEXT, path TEXT, size INTEGER, mtime_ns "
            "INTEGER, "
            "sha256 TEXT, PRIMARY KEY (task, path))"
        )
        conns[where] = conn
    return conns[where]


def _stat(path: str):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def record(task):
    """A doit action, last of every task with targets: remember what it wrote."""
    rows = []
    for path in task.targets:
        st = _stat(path)
        if st and os.path.isfile(path):
            sha = files.sha256_memo(path)   # once per build (cache, restore)
            rows.append((task.name, path, st[0], st[1], sha))
            stamps.learn("sha256", path, os.stat(path), sha)
    try:
        db = _db()
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM outputs WHERE task = ?", (task.name,))
        db.executemany("INSERT INTO outputs VALUES (?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
    # full disk, read-only build/: say so; the next run records it again
    except sqlite3.Error as err:
        return TaskFailed(statedb.explain(paths.OUTPUTS_DB, err))


def intact(task, values, rehash: bool = False) -> bool:
    """A doit uptodate check: False when a target is not what the task wrote. Size differs: changed.
    mtime differs (or `rehash`): its bytes are compared with the recorded sha256, as doit's own
    checker does for inputs, so a touch rebuilds nothing. A task built before outputs were recorded
    gets its record now."""
    try:
        db = _db()
        known = {
            p: (size, mtime, sha)
            for p, size, mtime, sha in db.execute(
                "SELECT path, size, mtime_ns, sha256 FROM outputs WHERE task = ?", (task.name,)
            )
        }
    except sqlite3.Error:   # a read-only build/ that never had a record: `doit list` still answers
        return True
    updates = []
    for path in task.targets:
        try:
            st = os.stat(path)   # one stat a target (os.path.isfile first was a second)
        except OSError:
            continue   # doit itself reruns a task whose target is missing
        if not stat.S_ISREG(st.st_mode):
            continue   # a folder target is not recorded
        size, mtime = st.st_size, st.st_mtime_ns
        if path not in known:
            sha = files.sha256(path)
            updates.append((task.name, path, size, mtime, sha))
            stamps.learn("sha256", path, st, sha)
            continue
        was_size, was_mtime, sha = known[path]
        if size != was_size:
            return _changed(
                task.name, path, f"changed since {task.name} wrote it (size {was_size} -> {size})"
            )
        # a new ctime: read it
        if mtime != was_mtime or rehash or not stamps.seen("sha256", path, st, sha):
            if files.sha256(path) != sha:
                return _changed(task.name, path, f"bytes changed since {task.name} wrote it")
            stamps.learn("sha256", path, st, sha)
            if mtime != was_mtime:
                # touched, same bytes: remember the mtime
                updates.append((task.name, path, size, mtime, sha))
    if updates:
        try:
            db.executemany("INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?, ?)", updates)
        # a read-only build/ (`doit list` still answers): recorded by a later run
        except sqlite3.Error:
            pass
    return True


def _changed(task_name: str, path: str, how: str) -> bool:
    """Say why a task runs again: its target changed, or it failed last time and wrote what it had
    (a failed check's record), which is no damage (read only here, on a mismatch: a no-op never
    opens the failure record)."""
    if task_name in failures.load():
        print(
            f"{task_name} failed in an earlier build ({path} holds what it wrote then): running it "
            "again"
        )
    else:
        print(f"{path}: {how}: rebuilding it")
    return False


def rewritten(task_name: str, path: str) -> None:
    """`path`, a target of `task_name`, was rewritten by the build itself after the task (the
    report's section of the last build's trace): record its new bytes, so the next run does not take
    it for damage."""
    st = os.stat(path)
    sha = files.sha256(path)
    _db().execute(
        "UPDATE outputs SET size = ?, mtime_ns = ?, sha256 = ? WHERE task = ? AND path = ?",
        (st.st_size, st.st_mtime_ns, sha, task_name, path),
    )
    stamps.learn("sha256", path, st, sha)


def forget(task_names) -> None:
    """Drop the records of cleaned tasks."""
    _db().executemany("DELETE FROM outputs WHERE task = ?", [(t,) for t in task_names])
