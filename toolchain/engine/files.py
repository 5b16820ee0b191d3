"""Atomic writes and content hashes: nothing half-written is ever left under a target's name."""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


MODE = 0o666 & ~_umask()   # what open() would give a new file: mkstemp's 0600 is not for outputs


def sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_MEMO: dict[str, tuple] = {}   # path -> (stamp, sha256), this process's hashes


def stamp(st) -> tuple[int, int, int, int]:
    """What says a file is unchanged without reading it: size, mtime, ctime (ns) and inode. ctime is
    what no user can set back (git's index and Bazel's digest cache key on it too): an edit that
    kept the size and mtime (`cp -p`, `rsync -a`, `touch -r`) still moves it."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def sha256_memo(path: str | Path) -> str:
    """sha256 of a file, hashed once per process while its stamp stays (a warm build hashed the same
    113 MB ONNX once per chip); a file whose size, mtime, ctime or inode changed is hashed again."""
    return memoized(_MEMO, path, sha256)


def memoized(memo: dict, path, digest, st=None, fresh: bool = False) -> str:
    """digest(path), kept in `memo` while the file's stamp stays; `fresh` reads it regardless. The
    one memo rule of sha256_memo and the content checker's md5."""
    st = st or os.stat(path)
    key = os.path.abspath(path)
    known = memo.get(key)
    if known and known[0] == stamp(st) and not fresh:
        return known[1]
    value = digest(path)
    memo[key] = (stamp(st), value)
    return value


def remember(path: str | Path, digest: str) -> None:
    """Note a sha256 just verified while writing `path` (a cache restore), so the outputs record
    does not read the file again; keyed by its stamp like every memo entry."""
    _MEMO[os.path.abspath(path)] = (stamp(os.stat(path)), digest)


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp folder beside `path`; each file in it replaces its namesake in `path`
    at the end."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path))
    try:
        yield tmp
        for item in sorted(tmp.iterdir()):
            if item.is_file():
                os.chmod(item, MODE)
            os.replace(item, path / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, data, sort_keys: bool = True) -> None:
    """Write strict JSON (sorted keys unless a record orders its own, trailing newline; NaN and
    Infinity refused) atomically."""
    text = json.dumps(data, indent=2, sort_keys=sort_keys, allow_nan=False) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_json(path: str | Path):
    """Read a JSON file; a damaged one is a ValueError naming it (its task is
    rebuilt: outputs.py)."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path}: not valid JSON ({err}): damaged? `doit` rebuilds it when it changed "
            f"after its task wrote it"
        ) from None


TEMP = (".*.tmp", ".tmp-*")   # what atomic_path / atomic_dir leave behind when killed


def sweep(folder: str | Path) -> list[str]:
    """Remove the temp files and folders killed steps left under `folder`; returns what went. One
    walk of the tree (it runs at every load: a pathlib glob per pattern took 3x as long)."""
    gone = []
    for top, dirs, names in os.walk(folder):
        for name in [n for n in dirs if _temp(n)]:
            dirs.remove(name)
            shutil.rmtree(os.path.join(top, name), ignore_errors=True)
            gone.append(os.path.join(top, name))
        for name in [n for n in names if _temp(n)]:
            Path(top, name).unlink(missing_ok=True)
            gone.append(os.path.join(top, name))
    return gone


def _temp(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in TEMP)
