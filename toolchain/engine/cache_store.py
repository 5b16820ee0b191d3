"""Where the artifact cache keeps entries and blobs, and the rules every store follows (cache.py has the keys):
a restore is all or nothing, each blob checked against its sha256 and the stage's own restore check; a save
writes the blobs first and the entry last; a store that fails says so in one line and never fails the build.
This module is the folder; cache_http.py the server."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from toolchain.engine.files import MODE, remember, sha256, sha256_memo

FORMAT = 1   # bump when the key material or the layout changes


class Store:
    """One cache folder. A subclass (cache_http.HttpStore) changes where entries and blobs live, not the rules."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.name = str(self.root)

    def entry(self, key: str) -> Path:
        return self.root / "entries" / f"{key}.json"

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    # ---- where things live: the folder's own
    def read_entry(self, key: str) -> bytes | None:
        path = self.entry(key)
        return path.read_bytes() if path.exists() else None

    def write_entry(self, key: str, data: bytes) -> None:
        _write(self.entry(key), data)

    def drop_entry(self, key: str) -> None:
        self.entry(key).unlink(missing_ok=True)

    def fetch_blob(self, digest: str, out: str) -> str:
        return _copy(self.blob(digest), out, digest)

    def has_blob(self, digest: str) -> bool:
        blob = self.blob(digest)
        return blob.is_file() and sha256(blob) == digest

    def put_blob(self, digest: str, src: str) -> None:
        _copy(src, self.blob(digest), digest, replace=True)

    # ---- the rules, the same for every store
    def restore(self, key: str, outputs: list[str], check=None) -> bool:
        """Put the entry's files in place, all or none, each only if its bytes have the recorded sha256 and
        `check` (the stage's own, on the staged files) finds nothing; else drop the entry (never offered
        again) and return False."""
        try:
            data = self.read_entry(key)
        except Unreachable as err:
            _say(err, after="; the step runs here")
            return False
        if data is None:
            return False
        staged = []
        try:
            files = json.loads(data)["outputs"]
            if sorted(files) != sorted(outputs):
                raise ValueError(f"it lists {sorted(files)}, the task writes {sorted(outputs)}")
            for out, recorded in files.items():
                staged.append((self.fetch_blob(recorded["sha256"], out), out))
            problems = check({out: tmp for tmp, out in staged}) if check else []
            if problems:
                raise ValueError("its outputs are not what this task makes: " + "; ".join(problems))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, Unreachable) as err:
            for tmp, _ in staged:
                os.unlink(tmp)
            if isinstance(err, Unreachable):
                _say(err, after="; the step runs here")
                return False
            _warn(f"{self.name} entry {key}: unusable cache entry evicted, recomputing ({err})")
            self.drop_entry(key)
            return False
        for tmp, out in staged:
            os.replace(tmp, out)
            remember(out, files[out]["sha256"])   # verified while copying: not hashed again
        return True

    def save(self, key: str, material: dict, outputs: list[str]) -> None:
        """Store the outputs (a blob that exists but fails its hash is replaced), then the entry with
        its key material (to diff when an expected hit misses): a reader never sees an entry whose blobs
        are not all there."""
        try:
            files = {}
            for out in outputs:
                digest = sha256_memo(out)   # the outputs record reuses it
                if not self.has_blob(digest):
                    self.put_blob(digest, out)
                files[out] = {"sha256": digest, "bytes": os.path.getsize(out)}
            self.write_entry(key, json.dumps({"format": FORMAT, "material": material, "outputs": files},
                                             indent=1, sort_keys=True).encode())
        except Unreachable as err:   # a dead or full server must not fail the build
            _say(err, f"could not store {material['task']}: ")
        except (OSError, ValueError) as err:   # nor a full or read-only folder
            _warn(f"{self.name}: could not store {material['task']} ({err})")


class Unreachable(Exception):
    """The store did not answer (or answered with an error): the step runs locally, the build goes on."""


def _say(err: Unreachable, what: str = "", after: str = "") -> None:
    """One warning line for a server that failed; nothing for one skipped since (cache_http.Skipped)."""
    if type(err).__name__ != "Skipped":
        _warn(what + str(err) + after)


def _copy(src: str | Path, dst: str | Path, digest: str, replace: bool = False) -> str:
    """Copy src to a temp file beside dst, checking the bytes' sha256; rename it onto dst if `replace`,
    else return the temp name (the caller renames it)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        hasher = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                hasher.update(block)
                out.write(block)
        if hasher.hexdigest() != digest:
            raise ValueError(f"{src} has sha256 {hasher.hexdigest()}, recorded {digest}")
        os.chmod(tmp, MODE)   # the umask's mode: a shared cache is read by other users
        if replace:
            os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, MODE)
    os.replace(tmp, path)


def _warn(message: str) -> None:
    print(f"cache: {message}", file=sys.stderr, flush=True)
