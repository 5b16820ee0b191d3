"""What a file's bytes were last seen to be, by its stamp (files.stamp: size, mtime, ctime, inode),
kept across runs in build/.stamps.json: the memo that lets the content checks (checker.py for
inputs, outputs.py for targets) trust an unchanged file without reading it. An edit that kept size
and mtime moved the ctime, so it is read again; a file with no stamp yet (a build made before) is
read once to learn it. Written when
doit closes its state DB (statedb.py), one file per build folder."""
from __future__ import annotations

import atexit
import json
import os

from toolchain.engine import files, paths

FILE = f"{paths.BUILD}/.stamps.json"
# a build's stamps file -> {"known": {"<kind>:<path as the task names it>": [...]}, "changed"};
# one per project folder (the working directory of the doit run), so a path relative to it
# names one file
_stores: dict[str, dict] = {}


def seen(kind: str, path, st, digest: str) -> bool:
    """The file's stamp is the one it had when `digest` (of `kind`: md5, sha256) was
    taken from it."""
    return _store()["known"].get(f"{kind}:{path}") == [*files.stamp(st), digest]


def recall(kind: str, path, st) -> str | None:
    """What was learned (of `kind`) about the file while it had the stamp it has now; None if
    it changed since."""
    entry = _store()["known"].get(f"{kind}:{path}")
    return entry[-1] if entry and entry[:-1] == list(files.stamp(st)) else None


def learn(kind: str, path, st, digest: str) -> None:
    store, entry, where = _store(), [*files.stamp(st), digest], f"{kind}:{path}"
    if store["known"].get(where) != entry:
        store["known"][where], store["changed"] = entry, True


def _store() -> dict:
    cwd = os.getcwd()
    store = _stores.get(cwd)
    if store is None:
        try:
            with open(os.path.join(cwd, FILE)) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}   # none yet (or damaged): every file is read once more, nothing rebuilds
        store = _stores[cwd] = {"known": known, "changed": False}
        if len(_stores) == 1:
            atexit.register(save, os.getpid())
    return store


def save(owner: int | None = None) -> None:
    """Write each changed build's stamps (a temp file renamed: a kill keeps the previous ones); a
    forked child that inherited the exit hook writes nothing."""
    if owner is not None and os.getpid() != owner:
        return
    for cwd, store in _stores.items():
        where = os.path.join(cwd, FILE)
        if not store["changed"] or not os.path.isdir(os.path.dirname(where)):
            continue
        tmp = f"{where}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(store["known"], f, separators=(",", ":"))
            os.replace(tmp, where)
            store["changed"] = False
        # a read-only or full folder: the next run reads the files again, nothing breaks
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
