"""Shared artifact cache: a stage's outputs stored under a key of its inputs' content, its settings and
the tool build id, and restored, every hash checked, instead of recomputed (Olive's pass cache, Bazel's
action cache). Off unless `doit cache=/path` or QNN_CACHE=/path names a folder (local or shared mount).

The folder holds two kinds of files, each written under a temp name and renamed, and each named by a
hash, so checkouts, machines and concurrent CI jobs can share it and copies of it merge without conflict:
    entries/<key>.json              {"material", "outputs": {path: {"sha256", "bytes"}}}, written last
    blobs/<sha256[:2]>/<sha256>     the bytes of one output file
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import doit
from doit.tools import config_changed

from toolchain.engine.files import MODE, remember, sha256, sha256_memo

ENV, VAR = "QNN_CACHE", "cache"
FORMAT = 1   # bump when the key material or the layout changes
PACKAGES = ("torch", "onnx", "onnxruntime", "onnxruntime-qnn", "onnxscript", "onnxsim", "numpy")
CODE = Path(__file__).parents[1]   # the toolchain package: a stage's own code is part of its tool


def location() -> Path | None:
    """The cache folder: `doit cache=/path`, else $QNN_CACHE; None (no cache) when neither is set."""
    where = doit.get_var(VAR) or os.environ.get(ENV)
    return Path(where).expanduser().absolute() if where else None


@functools.cache
def tool_id(code: str) -> dict:
    """Build id of what runs a stage: machine, Python, the pinned packages and the code of the module
    `code` with every toolchain module it imports (so editing report.py keeps compile's entries). The
    QAIRT SDK's build id is in the settings of the stages that use it."""
    return {"machine": platform.machine(), "python": platform.python_version(),
            "packages": {p: _version(p) for p in PACKAGES}, "code": code_digest(code)}


def code_digest(module: str) -> dict:
    """{file: sha256} of a toolchain module and the toolchain modules it imports, at any depth
    (imports inside functions included: they are read from the source, not from sys.modules)."""
    found, todo = {}, [module]
    while todo:
        path = _source(todo.pop())
        if path is None or str(path.relative_to(CODE)) in found:
            continue
        found[str(path.relative_to(CODE))] = sha256(path)
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == CODE.name:
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == CODE.name]
    return dict(sorted(found.items()))


def _source(module: str) -> Path | None:
    """toolchain.stages.verify -> its file (a package's __init__.py); None for a name that is no module."""
    base = CODE.joinpath(*module.split(".")[1:])
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def key_material(task: str, action: dict, code: str, inputs: list[str], settings, outputs: list[str]) -> dict:
    """What a key hashes: what runs (action, code), on which bytes (inputs), how (settings), with what
    (tool_id), writing which files (outputs). Paths are as the task names them: relative."""
    return {"format": FORMAT, "task": task, "action": action, "settings": settings, "tool": tool_id(code),
            "inputs": {p: sha256_memo(p) for p in sorted(inputs)}, "outputs": sorted(outputs)}


def key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def from_task(task, action: dict, code: str) -> dict:
    """key_material() of a doit task: its file_dep, the dict it gives config_changed, its targets.
    Read from the task itself, so the cache and doit's up-to-date check can never disagree."""
    settings = [check.config for check, _, _ in task.uptodate if isinstance(check, config_changed)]
    return key_material(task.name, action, code, list(task.file_dep), settings, list(task.targets))


def run(task, action: dict, code: str, log: str, compute):
    """A doit action result: restore the task's targets from the cache, or compute() and store them.
    `action` is what the stage runs (JSON), `code` the toolchain module that runs it."""
    root = location()
    if root is None:
        return compute()
    material = from_task(task, action, code)
    store, entry = Store(root), key(material)
    if store.restore(entry, list(task.targets)):
        with open(log, "a") as f:
            f.write(f"# restored from cache {root} entry {entry}\n")
        return None
    result = compute()
    if result is None:   # success: TaskFailed / TaskError results are never stored
        store.save(entry, material, list(task.targets))
    return result


class Store:
    """One cache folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / "entries" / f"{key}.json"

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def restore(self, key: str, outputs: list[str]) -> bool:
        """Put the entry's files in place, all or none, each only if its bytes have the recorded sha256."""
        path = self.entry(key)
        if not path.exists():
            return False
        staged = []
        try:
            files = json.loads(path.read_text())["outputs"]
            if sorted(files) != sorted(outputs):
                raise ValueError(f"it lists {sorted(files)}, the task writes {sorted(outputs)}")
            for out, recorded in files.items():
                staged.append((_copy(self.blob(recorded["sha256"]), out, recorded["sha256"]), out))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            for tmp, _ in staged:
                os.unlink(tmp)
            _warn(f"{path}: unusable cache entry evicted, recomputing ({err})")
            path.unlink(missing_ok=True)   # evicted: never offered again
            return False
        for tmp, out in staged:
            os.replace(tmp, out)
            remember(out, files[out]["sha256"])   # verified while copying: not hashed again
        return True

    def save(self, key: str, material: dict, outputs: list[str]) -> None:
        """Store the outputs (a blob that exists but fails its hash is replaced), then the entry with
        its key material (to diff when an expected hit misses)."""
        try:
            files = {}
            for out in outputs:
                digest = sha256_memo(out)   # the outputs record reuses it
                blob = self.blob(digest)
                if not (blob.is_file() and sha256(blob) == digest):
                    _copy(out, blob, digest, replace=True)
                files[out] = {"sha256": digest, "bytes": os.path.getsize(out)}
            _write(self.entry(key), json.dumps({"format": FORMAT, "material": material, "outputs": files},
                                               indent=1, sort_keys=True).encode())
        except (OSError, ValueError) as err:   # a full or read-only cache must not fail the build
            _warn(f"{self.root}: could not store {material['task']} ({err})")


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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _warn(message: str) -> None:
    print(f"cache: {message}", file=sys.stderr, flush=True)
