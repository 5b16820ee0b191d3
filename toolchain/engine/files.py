"""Atomic writes and content hashes: nothing half-written is ever left under a target's name."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp folder beside `path`; each file in it replaces its namesake in `path` at the end."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path))
    try:
        yield tmp
        for item in sorted(tmp.iterdir()):
            os.replace(item, path / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, data) -> None:
    """Write JSON (sorted keys, trailing newline) atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path):
    """Read a JSON file."""
    return json.loads(Path(path).read_text())
