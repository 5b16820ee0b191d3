"""Shared artifact cache: a stage's outputs stored under a key of its inputs' content, its settings
and the tool build id, and restored, every hash checked, instead of recomputed (Olive's pass cache,
Bazel's action cache). Off unless `doit cache=...` or QNN_CACHE=... names a folder (local or shared
mount) or an http(s):// URL of a server speaking Bazel's HTTP remote-cache protocol (bazel-remote,
nginx with WebDAV).

Two kinds of objects, each named by a hash, so checkouts, machines and concurrent CI jobs
can share them:
    entry  {"material", "outputs": {path: {"sha256", "bytes"}}}, written last (after its blobs)
           folder: entries/<key>.json           server: /ac/<key>
    blob   the bytes of one output file
           folder: blobs/<sha256[:2]>/<sha256>  server: /cas/<sha256>
A restore is used only when every blob has its recorded sha256 and the stage's own check of what it
restores holds (task meta "restore_check": a compile's binary read back for its chip and I/O);
otherwise it is dropped, the step recomputed and a correct entry written back. A server that is
slow, down, full or wrong costs a warning line, never the build (remote.py). """
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import re
import urllib.parse
from importlib import metadata
from pathlib import Path

from doit.exceptions import BaseFail
from doit.tools import config_changed

from toolchain.engine import versions
from toolchain.engine.cache import heal, remote
from toolchain.engine.cache.store import (  # noqa: F401  (the API)
    FORMAT,
    MAX_BLOB,
    Settings,
    Store,
    Unreachable,
    say_once,
)
from toolchain.engine.files import sha256, sha256_memo
from toolchain.engine.run import trace

# a task's meta key holding this run's store.Settings (None or no key: no cache)
SETTINGS = "cache"
# A task's meta "output_kind": "code" when a later step compiles, links, loads or imports its
# outputs. Such a task never consults a cache: whoever can write the cache could otherwise run code
# on every machine restoring from it (the stage declares it: stages.Stage.output_kind; the store
# refuses code files whatever a task says). "result" when a later step believes what they say (a
# check's record, a shipped bundle): restored only from an entry signed by a key this build trusts,
# else computed here (sign.py). "data": an artifact a later check reads.
KIND, DATA, RESULT, CODE_KIND = "output_kind", "data", "result", "code"
KINDS = (DATA, RESULT, CODE_KIND)
CODE = Path(__file__).parents[2]   # the toolchain package: a stage's own code is part of its tool


SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def parse_location(text: str) -> Path | str:
    """`cache=` / $QNN_CACHE: a folder (Path) or an http(s):// URL (str); ValueError says
    what is wrong."""
    scheme = SCHEME.match(text)
    if scheme and scheme[1] not in ("http", "https"):
        raise ValueError(
            f"{scheme[1]}:// is not a scheme the cache speaks: a folder (a path, or a mount such "
            "as "
            "NFS), http:// or https://"
        )
    if text.startswith(("http://", "https://")):
        problem = url_problem(text)
        if problem:
            raise ValueError(problem)
        return text
    try:
        where = Path(text).expanduser().absolute()
    except RuntimeError as err:   # ~someone/ with no such user
        raise ValueError(str(err)) from None
    if where.exists() and not where.is_dir():
        raise ValueError(f"{where} is not a folder")
    return where


def url_problem(url: str) -> str | None:
    """What is wrong with a cache URL (said at load, like a bad TOML field),
    credentials never repeated."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port   # raises on a port that is not a number
    except ValueError as err:
        return f"not a URL ({err})"
    if not parts.hostname:
        return f"{parts.scheme}:// needs a host, e.g. {parts.scheme}://cache.example.com:8080/"
    if parts.query or parts.fragment:
        return "no ?query or #fragment: the entries live under <url>/ac/ and <url>/cas/"
    return None


def open_store(settings: Settings) -> Store:
    """The store at settings.where: a folder, or a remote-cache server."""
    if settings.where is None:
        raise ValueError("no cache: settings.where is None")
    if isinstance(settings.where, str):
        return remote.HttpStore(settings.where, settings)
    return Store(settings.where, settings)


@functools.cache
def tool_id(code: str) -> dict:
    """Build id of what runs a stage: machine, Python, the installed version of every package this
    project requires (its own metadata: the engine names none) and the code of the module `code`
    with every module of the package it imports (so editing the report stage keeps compile's
    entries). A tool outside Python (an SDK) is in the settings of the stages that use it."""
    return {"machine": platform.machine(), "python": platform.python_version(),
            "packages": {p: _version(p) for p in requirements()}, "code": code_digest(code)}


@functools.cache
def requirements() -> tuple[str, ...]:
    """The packages the distribution holding this code requires (extras left out),
    from its metadata."""
    # only now: it is slow to import (a no-op `doit`)
    from packaging.requirements import Requirement
    found = []
    for dist in metadata.packages_distributions().get(CODE.name, []):
        for line in metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                found.append(requirement.name)
    return tuple(sorted(set(found)))


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
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] == CODE.name
            ):
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == CODE.name]
    return dict(sorted(found.items()))


def _source(module: str) -> Path | None:
    """toolchain.stages.verify -> its file (a package's __init__.py); None for a name that
    is no module."""
    base = CODE.joinpath(*module.split(".")[1:])
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def key_material(
    task: str, action: dict, code: str, inputs: list[str], settings, outputs: list[str]
) -> dict:
    """What a key hashes: what runs (action, code), on which bytes (inputs), how (settings), with
    what (tool_id), writing which files (outputs). Paths are as the task names them (relative to the
    project), but an input outside the project is named by where it sits in the toolchain, or else
    by its file name: its content is in the key anyway, and two machines that install the toolchain
    or Python elsewhere share entries."""
    return {
        "format": FORMAT,
        "task": task,
        "action": action,
        "settings": settings,
        "tool": tool_id(code),
        "inputs": sorted([portable(p), sha256_memo(p)] for p in inputs),
        "outputs": sorted(outputs),
    }


def portable(path: str) -> str:
    """A task's path as a key names it: itself inside the project, `<toolchain>/…` inside
    the toolchain package, `<outside>/<file name>` anywhere else (site-packages, an SDK,
    a system library)."""
    if not os.path.isabs(path) and not path.startswith(".."):
        return path
    where = Path(os.path.abspath(path))
    if where.is_relative_to(CODE):
        return f"<{CODE.name}>/{where.relative_to(CODE).as_posix()}"
    return f"<outside>/{where.name}"


def key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def from_task(task, action: dict, code: str) -> dict:
    """key_material() of a doit task: its file_dep, the dict it gives config_changed, its targets.
    Read from the task itself, so the cache and doit's up-to-date check can never disagree."""
    settings = [check.config for check, _, _ in task.uptodate if isinstance(check, config_changed)]
    return key_material(task.name, action, code, list(task.file_dep), settings, list(task.targets))


def run(task, action: dict, code: str, log: str, compute, check=None):
    """A doit action result: restore the task's targets from the cache, or compute() and store them.
    `action` is what the stage runs (JSON), `code` the toolchain module that runs it, `check` the
    runner's own check of restored files (beside the stage's: restore_check). A result (a check's
    record, what a later step believes) is restored only from an entry signed by a trusted key;
    unsigned, it is computed here."""
    meta = task.meta or {}
    settings, kind = meta.get(SETTINGS), meta.get(KIND)
    if settings is None or settings.where is None or kind == CODE_KIND:
        return _here(
            task, compute, lambda name: None, settings is not None and settings.where is not None
        )
    material = from_task(task, action, code)
    store, entry = open_store(settings), key(material)
    store.refused = heal.bad()
    restorable = kind != RESULT or bool(settings.trust)
    if not restorable:
        say_once(
            "results",
            f"{store.name}: no cache_trust (an unsigned cache): the results of checks (parity, "
            "verify and the like) are computed here; artifacts are restored from it and checked by "
            "them",
        )
    checks = [c for c in (restore_check(task), check) if c]
    if restorable and store.restore(
        entry,
        list(task.targets),
        (lambda staged: [p for c in checks for p in c(staged)]) if checks else None,
    ):
        heal.record(task, entry, store.digest, store.name)
        with open(log, "a") as f:
            f.write(f"# restored from cache {store.name} entry {entry}\n")
        trace.note(task.name, restored=True)
        return None
    result = _here(task, compute, lambda name: store if name == store.name else None, True)
    # success (TaskFailed / TaskError results are never stored); a result only signed: unsigned,
    # none restores it
    if result is None and (restorable or settings.sign_key):
        store.save(entry, material, list(task.targets))
    return result


def _here(task, compute, store_named, cached: bool):
    """compute() here; a failure heals what a cache gave upstream (heal.py), a success is
    this tree's provenance."""
    # an exception here is the engine's own (an interrupt heals nothing): doit reports it
    result = compute()
    if isinstance(result, BaseFail):
        heal.failed(task, store_named)
    elif cached or os.path.exists(heal.PROVENANCE):
        heal.record(task)
    return result


def restore_check(task):
    """The stage's own check of restored outputs, given in its meta as (function, kwargs):
    called with {target: the restored file, not yet in place}, it returns the problems found
    (none: use them)."""
    given = (task.meta or {}).get("restore_check")
    if not given:
        return None
    check, kwargs = given
    return lambda staged: check(staged, **kwargs)


def _version(package: str) -> str | None:
    try:
        return versions.version(package)
    except versions.NotInstalled:
        return None
