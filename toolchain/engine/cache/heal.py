"""A cache that heals: which cache entry made each file of this build tree, and what happens when a
check fails on files a cache gave (Make's .DELETE_ON_ERROR, applied to what a cache restored).

Every step the cache runner sees is written to PROVENANCE: its inputs, its targets, and the entry it
was restored from (none when it ran here). When a step fails, the entries upstream of it that gave a
file it read, directly or through steps that ran here on them, are suspects: each is evicted (a
client that uploads) and listed in BAD (any client: never restored in this tree again), and its
restored files are removed, so the next `doit` recomputes those steps here; one line says so. An
entry is listed by the sha256 of its bytes: a correct entry written later under the same key is
restored again. A check that fails for a reason of its own costs one local recompute, no more: after
it, nothing upstream came from a cache."""
from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from toolchain.engine import paths
from toolchain.engine.cache.store import say_once, warn, write_atomic

# {task: {"inputs", "targets", "entry", "digest", "store"}}
PROVENANCE = f"{paths.BUILD}/.cache-provenance.json"
# [sha256 of an entry's bytes]: failed a check here, never restored again
BAD = f"{paths.BUILD}/.cache-bad.json"
_LOCK = threading.Lock()   # doit's threads of one build share these files


def _read(path: str, empty):
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return empty
    return found if isinstance(found, type(empty)) else empty


def bad() -> frozenset[str]:
    """The entries (sha256 of their bytes) that failed a check in this tree."""
    return frozenset(d for d in _read(BAD, []) if isinstance(d, str))


def record(
    task, entry: str | None = None, digest: str | None = None, store: str | None = None
) -> None:
    """`task` wrote its targets: restored from `entry` (its bytes' sha256 `digest`, of the cache
    `store`) or, with no entry, computed here."""
    with _LOCK:
        known = _read(PROVENANCE, {})
        known[task.name] = {
            "inputs": sorted(task.file_dep),
            "targets": sorted(task.targets),
            "entry": entry,
            "digest": digest,
            "store": store,
        }
        try:
            write_atomic(Path(PROVENANCE), json.dumps(known, indent=0, sort_keys=True).encode())
        except OSError as err:  # a full or read-only build/: the step's own result stands
            say_once(
                "provenance",
                f"could not write {PROVENANCE} ({err.strerror or err}): an entry that fails a "
                "check in this build is not healed",
            )


def suspects(task) -> dict[str, dict]:
    """{task: its record} of the restored steps whose files `task` read, directly or through
    steps run here."""
    known = _read(PROVENANCE, {})
    made_by = {target: name for name, rec in known.items() if isinstance(rec, dict)
               for target in rec.get("targets", [])}
    found, seen, todo = {}, set(), list(task.file_dep)
    while todo:
        name = made_by.get(todo.pop())
        if name is None or name in seen:
            continue
        seen.add(name)
        rec = known[name]
        if rec.get("entry"):
            found[name] = rec
        todo += rec.get("inputs", [])
    return found


def failed(task, open_store) -> None:
    """`task` failed: evict and list the entries that gave what it read, remove their files, say it
    in one line. `open_store(name)` is the store of that name this run reaches (None: another
    cache, or none)."""
    with _LOCK:
        found = suspects(task)
        if not found:
            return
        known, listed, evicted = _read(PROVENANCE, {}), set(_read(BAD, [])), False
        for name, rec in found.items():
            listed.add(rec["digest"])
            store = open_store(rec.get("store"))
            if store is not None and store.upload:
                store.drop_entry(rec["entry"])
                evicted = True
            for target in rec["targets"]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
            known.pop(name, None)
        try:
            write_atomic(Path(BAD), json.dumps(sorted(listed), indent=0).encode())
            write_atomic(Path(PROVENANCE), json.dumps(known, indent=0, sort_keys=True).encode())
        # the files are removed and the entries evicted: the next doit recomputes anyway
        except OSError as err:
            say_once("provenance", f"could not write {BAD} ({err.strerror or err})")
    names = ", ".join(f"{name} (entry {rec['entry'][:12]})" for name, rec in sorted(found.items()))
    what = "evicted" if evicted else "never restored here again"
    warn(
        f"{task.name} failed on files restored from the cache: {names} {what}, their files "
        "removed; "
        f"the next doit recomputes {'it' if len(found) == 1 else 'them'} here"
    )
