"""The shared cache attacked by whoever can write it (toolchain/engine/cache/,
engine/cache/restored.py, docs/scale.md "Trust"): no stage whose outputs are code is ever stored or
restored, whatever entry a writer plants; data restored is checked against what the cache cannot
write (the checkpoint's pin, the array format, the record format); settings and keys name no folder,
so projects at other depths share every cacheable entry. Folder and nginx alike."""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ONE_CHIP,
    RESTORED,
    TOKEN,
    Project,
    add_qnet,
    assert_same_outputs,
    cacheable,
    checkout,
    doit,
    sdk_env,
    sha256,
    sources,
    tool_logs,
)

from toolchain.engine import cache
from toolchain.engine.cache import sign
from toolchain.engine.cache import store as cache_store

# Run in a project folder: every task of its dodo.py with what keys it (settings, action, the key it
# has or would have where its inputs exist), as JSON. A subprocess: the dodo reads its own command
# line and environment.
LIST_TASKS = textwrap.dedent("""
    import json, os, runpy
    from toolchain.engine import cache
    from toolchain.engine.run import external, worker
    found = []
    for obj in runpy.run_path("dodo.py").values():
        create = getattr(obj, "create_doit_tasks", None)
        made = create() if create else []
        for task in [made] if isinstance(made, dict) else made:
            settings = [u.config for u in task.get("uptodate", []) if hasattr(u, "config")]
            action, code = None, None
            for step in task.get("actions") or []:
                if isinstance(step, tuple) and step[0] is external.action:
                    action, code = {"argv": step[1][0], "env": step[1][1]}, external.__name__
                elif isinstance(step, tuple) and step[0] is worker.run:
                    action = {"function": worker.qualified(step[1][0]),
                              "kwargs": worker.to_json(step[1][1])}
                    code = step[1][0].__module__
            name = f"{create.basename}:{task.get('name')}" if task.get("name") else create.basename
            deps, targets = list(task.get("file_dep", [])), list(task.get("targets", []))
            key = None
            if action and all(os.path.exists(p) for p in deps):
                key = cache.key(cache.key_material(name, action, code, deps, settings, targets))
            found.append({"name": name, "targets": targets,
                          "kind": task.get("meta", {}).get(cache.KIND),
                          "settings": settings, "action": action, "key": key})
    print(json.dumps(found, default=repr))
""")


def list_tasks(root: Path) -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", LIST_TASKS], cwd=root, capture_output=True, text=True, check=True
    )
    return {t["name"]: t for t in json.loads(done.stdout.splitlines()[-1])}


def test_every_stage_whose_outputs_run_declares_it(tmp_path, monkeypatch):
    """A target that a later step compiles, links, loads or imports (.c, .cpp, .so, .py, a pickle)
    belongs to a stage declared output_kind = "code"; a new stage that writes one without saying
    so fails here."""
    sdk_env(monkeypatch, tmp_path)
    project = Project(tmp_path / "p")
    project.add_tiny("tiny", **ONE_CHIP)
    add_qnet(project)
    found = list_tasks(project.root)
    code = {
        name
        for name, t in found.items()
        if any(p.endswith(cache_store.CODE_SUFFIXES) for p in t["targets"])
    }
    assert {
        "convert:tiny/net",
        "modellib:tiny/net",
        "convert:qnet/net-a",
        "modellib:qnet/net-a",
    } <= code
    assert [name for name in code if found[name]["kind"] != cache.CODE_KIND] == []
    assert {t["kind"] for t in found.values() if t["targets"]} == {
        cache.DATA,
        cache.RESULT,
        cache.CODE_KIND,
    }
    # the records of checks are results: never restored from an entry no trusted key signed
    assert {found[n]["kind"] for n in ("parity:tiny", "parity:tiny/net", "verify:tiny@SM8750")} == {
        cache.RESULT
    }


def test_no_setting_names_where_the_project_or_the_toolchain_sits(tmp_path):
    """The same models at two depths (the toolchain installed elsewhere): every task's settings are
    equal, and so is what keys a cacheable step (its action), so doit's own check and the cache
    agree across layouts."""
    near, far = Project(tmp_path / "a"), Project(tmp_path / "deep" / "er" / "b")
    for project in (near, far):
        project.add_tiny("tiny", **ONE_CHIP)
    (far.root / "models" / "tiny.pt").write_bytes((near.root / "models" / "tiny.pt").read_bytes())
    (far.root / "models" / "tiny.toml").write_text((near.root / "models" / "tiny.toml").read_text())
    a, b = list_tasks(near.root), list_tasks(far.root)
    assert sorted(a) == sorted(b) and "modellib:tiny/net" in a
    for name in a:
        assert a[name]["settings"] == b[name]["settings"], name
        if a[name]["kind"] in (cache.DATA, cache.RESULT):
            assert a[name]["action"] == b[name]["action"], name
    text = json.dumps([t["settings"] for t in a.values()])
    assert str(near.root) not in text and "../" not in text


@pytest.fixture(params=["folder", "http"])
def shared(request, tmp_path, monkeypatch):
    """(where the cache is, its folder of entries, its folder of blobs, entry file of a key)."""
    if request.param == "http":
        server = request.getfixturevalue("server")
        monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
        return (
            server.url,
            lambda key: server.root / "ac" / key,
            lambda digest: server.root / "cas" / digest,
        )
    root = tmp_path / "cache"
    return str(root), lambda key: root / "entries" / f"{key}.json", \
        lambda digest: root / "blobs" / digest[:2] / digest


def test_projects_at_other_depths_share_every_cacheable_step(shared, tmp_path):
    where = shared[0]
    near, far = Project(tmp_path / "a"), Project(tmp_path / "x" / "y" / "z" / "b")
    near.add_tiny("tiny", **ONE_CHIP)
    for rel in ("models/tiny.pt", "models/tiny.toml", "models/tinynet.py"):
        (far.root / rel).write_bytes((near.root / rel).read_bytes())
    doit(near.root, f"cache={where}")
    doit(far.root, f"cache={where}")
    logs = tool_logs(far.root)
    restored = cacheable(logs)
    assert len(restored) >= 4 and all(RESTORED in text for text in restored.values()), \
        [rel for rel, text in restored.items() if RESTORED not in text]
    assert [rel for rel in logs if rel not in restored] and not [
        rel for rel in logs if rel not in restored and RESTORED in logs[rel]
    ]
    for rel in (
        "tiny/ort-qnn/SM8750/net_qnn.bin",
        "tiny/ort-qnn/SM8750/net.onnx",
        "tiny/net/net.onnx",
    ):
        assert sha256(near.root / "build" / rel) == sha256(far.root / "build" / rel), rel
    # the model library's record holds the command as it ran here (paths by depth): the one
    # output that differs
    assert_same_outputs_but(near.root, far.root, "tiny/ort-qnn/net/net.modellib.json")


def assert_same_outputs_but(a: Path, b: Path, differs: str) -> None:
    assert (a / "build" / differs).read_text() != (b / "build" / differs).read_text()
    (b / "build" / differs).write_bytes((a / "build" / differs).read_bytes())
    assert_same_outputs(a, b)


def plant(shared, key: str, outputs: dict[str, bytes], **extra) -> None:
    """Write an entry and its blobs as a cache writer would: self-consistent, every sha256 right
    (`extra`: more fields of the entry, e.g. signatures)."""
    _, entry_file, blob_file = shared
    files = {}
    for out, data in outputs.items():
        digest = hashlib.sha256(data).hexdigest()
        blob_file(digest).parent.mkdir(parents=True, exist_ok=True)
        blob_file(digest).write_bytes(data)
        files[out] = {"sha256": digest, "bytes": len(data)}
    entry_file(key).parent.mkdir(parents=True, exist_ok=True)
    entry_file(key).write_text(
        json.dumps(
            {
                "format": cache_store.FORMAT,
                "material": {"task": "planted"},
                "outputs": files,
                **extra,
            }
        )
    )


class Payload:
    """Unpickling it writes the marker file: what a hostile pickle does."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def evil_library(tmp_path: Path, marker: Path) -> bytes:
    """A shared library whose ELF constructor writes the marker when it is loaded."""
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void "
        "pwn(void) "
        f'{{ close(open("{marker}", O_CREAT | O_WRONLY, 0644)); }}\n'
    )
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"), str(source)], check=True
    )
    return (tmp_path / "evil.so").read_bytes()


def test_a_cache_writer_cannot_run_code_on_a_restoring_machine(shared, tmp_path):
    """Self-consistent poisoned entries at the keys the steps have (or would have, were they
    cached): a model library with an ELF constructor, a graph source with a constructor function, a
    checkpoint copy that is a hostile pickle. No marker is written, the build ends green with the
    reference's outputs, the code is rebuilt here."""
    where = shared[0]
    ref = sources(Project(tmp_path / "ref"))
    ref.add_tiny("tiny", **ONE_CHIP)
    doit(ref.root, f"cache={where}")
    found = list_tasks(ref.root)
    markers = {name: tmp_path / f"ran-{name}" for name in ("so", "c", "pickle")}
    build = ref.root / "build"

    def outputs(task: str, **replace: bytes) -> dict[str, bytes]:
        return {
            p: replace.get(Path(p).suffix[1:], (ref.root / p).read_bytes())
            for p in found[task]["targets"]
        }

    source_c = next(p for p in found["convert:tiny/net"]["targets"] if p.endswith(".c"))
    hostile_c = (ref.root / source_c).read_bytes() + (
        f'\n#include <fcntl.h>\n__attribute__((constructor)) static void pwn(void) '
        f'{{ open("{markers["c"]}", O_CREAT | O_WRONLY, 0644); }}\n').encode()
    plant(
        shared,
        found["modellib:tiny/net"]["key"],
        outputs("modellib:tiny/net", so=evil_library(tmp_path, markers["so"])),
    )
    plant(shared, found["convert:tiny/net"]["key"], outputs("convert:tiny/net", c=hostile_c))
    plant(
        shared,
        found["checkpoint:tiny"]["key"],
        outputs("checkpoint:tiny", pt=pickle.dumps(Payload(markers["pickle"]))),
    )
    assert build.is_dir()

    second = checkout(ref.root, tmp_path / "second")
    executed, output = doit(second, cache_dir=where)   # doit() asserts the build passed
    assert [m.name for m in markers.values() if m.exists()] == []
    assert {
        "convert:tiny/net",
        "modellib:tiny/net",
        "checkpoint:tiny",
        "verify:tiny@SM8750",
    } <= set(executed)
    for log in ("tiny/ort-qnn/net/net.convert.log", "tiny/ort-qnn/net/net.modellib.log",
                "tiny/checkpoint/model.pt.log"):
        assert RESTORED not in (second / "build" / log).read_text(), log
    line = next(ln for ln in output.splitlines() if found["checkpoint:tiny"]["key"] in ln)
    assert "is a copy of the pinned checkpoint but has sha256" in line, line
    # the rest still comes from the cache
    assert RESTORED in (second / "build/tiny/net/export.log").read_text()
    assert_same_outputs(ref.root, second)


def store_of(shared):
    """The shared cache as a client of it opens it (a folder, or the server with its token)."""
    where = shared[0] if shared[0].startswith("http") else Path(shared[0])
    return cache.open_store(cache.Settings(where=where, token=TOKEN))


def test_an_array_file_that_would_unpickle_is_never_restored(shared, tmp_path, monkeypatch):
    """An .npz whose array holds Python objects (np.load(allow_pickle=True) would run the marker's
    writer): the store refuses it before it is in place, and nothing here loads arrays with pickle
    (tests/architecture.py)."""
    marker = tmp_path / "ran"
    monkeypatch.chdir(tmp_path)
    hostile, plain = tmp_path / "hostile.npz", tmp_path / "plain.npz"
    np.savez(hostile, feeds=np.array([Payload(marker)], dtype=object))
    np.savez(plain, feeds=np.zeros(4, np.float32))
    store = store_of(shared)
    plant(shared, "hostile", {"build/feeds.npz": hostile.read_bytes()})
    plant(shared, "plain", {"build/feeds.npz": plain.read_bytes()})
    assert (
        not store.restore("hostile", ["build/feeds.npz"]) and not Path("build/feeds.npz").exists()
    )
    assert store.restore("plain", ["build/feeds.npz"]) and sha256("build/feeds.npz") == sha256(
        plain
    )
    assert not marker.exists()
    assert not list(Path("build").glob(".*.tmp"))


def test_a_record_that_is_not_one_is_refused(shared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = store_of(shared)
    for key, data in (
        ("list", b"[1, 2]"),
        ("cut", b'{"binary": "x'),
        ("object", b'{"binary": "x"}'),
    ):
        plant(shared, key, {"build/x.compile.json": data})
    assert not store.restore("list", ["build/x.compile.json"])
    assert not store.restore("cut", ["build/x.compile.json"])
    assert store.restore("object", ["build/x.compile.json"])


def test_the_store_never_stores_or_restores_code(shared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = store_of(shared)
    Path("build").mkdir()
    Path("build/libnet.so").write_bytes(b"\x7fELF")
    store.save("mine", {"task": "t"}, ["build/libnet.so"])
    assert store.read_entry("mine") is None   # nothing stored
    plant(shared, "planted", {"build/libnet.so": b"\x7fELF planted"})
    assert not store.restore("planted", ["build/libnet.so"])
    assert Path("build/libnet.so").read_bytes() == b"\x7fELF"


def test_a_tool_runs_record_must_name_the_outputs_restored_with_it(tmp_path):
    """An external tool's step (QAIRT context) restored: its record must have a run's shape and the
    sha256 of every output beside it, so an entry cannot pair a record with another binary."""
    from toolchain.engine.run import external

    binary, other, record = (
        tmp_path / "net.bin",
        tmp_path / "other.bin",
        tmp_path / "net.context.json",
    )
    binary.write_bytes(b"the binary")
    other.write_bytes(b"another binary")
    run = {"argv": ["tool"], "env": {}, "seconds": 1.0, "outputs": {"b/net.bin": sha256(binary)}}
    record.write_text(json.dumps(run))
    staged = {"b/net.bin": str(binary), "b/net.context.json": str(record)}
    assert external.restored(staged, "b/net.context.json", ["b/net.bin"]) == []
    (problem,) = external.restored(
        {**staged, "b/net.bin": str(other)}, "b/net.context.json", ["b/net.bin"]
    )
    assert f"b/net.bin has sha256 {sha256(other)}, its record says {sha256(binary)}" == problem
    record.write_text(json.dumps({"outputs": {"b/net.bin": sha256(binary)}}))
    assert external.restored(staged, "b/net.context.json", ["b/net.bin"]) == [
        "b/net.context.json is not a tool run's record (argv, env, outputs)"]


# ---- results a cache writer cannot forge, and a poisoned entry that heals ----

COMPILE, VERIFY, BINARY = (
    "compile:tiny/net@SM8750",
    "verify:tiny@SM8750",
    "build/tiny/ort-qnn/SM8750/net_qnn.bin",
)


def two_models(tmp_path: Path, where: str) -> Path:
    """tiny and tiny2 (same chip and I/O, other weights) built into the shared cache."""
    ref = sources(Project(tmp_path / "ref"))
    ref.add_tiny("tiny", **ONE_CHIP)
    ref.add_tiny("tiny2", seed=1, **ONE_CHIP)
    doit(ref.root, f"cache={where}")
    return ref.root


def others(ref: Path, path: str) -> bytes:
    """tiny2's file in place of tiny's `path`; a record or log edited to name tiny's paths (what a
    restore check reads back then holds)."""
    data = (ref / path.replace("build/tiny/", "build/tiny2/", 1)).read_bytes()
    return data.replace(b"tiny2/", b"tiny/") if path.endswith((".json", ".log")) else data


def forge(shared, ref: Path, tmp_path: Path, sign_with: str | None = None) -> str:
    """The attack: tiny's compile entry planted with tiny2's outputs, and the verify entry a reader
    looks up next (re-keyed from what its inputs then are) holding the reference's passed record.
    The planted compile entry carries the genuine entry's signatures; both are signed with
    `sign_with` (a key of the attacker's) if given. Returns the sha256 of the poisoned binary."""
    _, entry_file, _ = shared
    found = list_tasks(ref)
    genuine = json.loads(entry_file(found[COMPILE]["key"]).read_text())
    poisoned = {p: others(ref, p) for p in found[COMPILE]["targets"]}
    plant(shared, found[COMPILE]["key"], poisoned, **({"signatures": genuine["signatures"]}
                                                      if "signatures" in genuine else {}))
    attacker = checkout(ref, tmp_path / "attacker")
    shutil.copytree(ref / "build", attacker / "build")
    for path, data in poisoned.items():
        (attacker / path).write_bytes(data)
    verify = list_tasks(attacker)[VERIFY]
    assert verify["key"] != found[VERIFY]["key"]   # the binary is an input of verify's key
    passed = {p: (ref / p).read_bytes() for p in verify["targets"]}
    plant(shared, verify["key"], passed)
    if sign_with:
        for key in (found[COMPILE]["key"], verify["key"]):
            record = json.loads(entry_file(key).read_text())
            record["signatures"] = [sign.sign(key, record, sign_with)]
            entry_file(key).write_text(json.dumps(record))
    return hashlib.sha256(poisoned[BINARY]).hexdigest()


def test_a_forged_verify_entry_never_passes_a_wrong_binary_and_the_poison_heals(shared, tmp_path):
    """An unsigned cache: the reader restores the poisoned binary (it is tiny2's: right chip,
    right I/O), but verify runs here and fails; the entry is evicted and the binary removed in
    one line; the next doit compiles here, passes and writes the correct entry back, which the
    next checkout restores."""
    where, entry_file, _ = shared
    ref = two_models(tmp_path, where)
    poisoned = forge(shared, ref, tmp_path)
    reader = checkout(ref, tmp_path / "reader")
    executed, output = doit(reader, cache_dir=where, passes=False)
    assert VERIFY in executed and COMPILE in executed   # restored, then removed again (below)
    assert RESTORED not in (reader / "build/tiny/ort-qnn/SM8750/verify.log").read_text()
    assert output.count("no cache_trust (an unsigned cache)") == 1
    heal = [
        line for line in output.splitlines() if "failed on files restored from the cache" in line
    ]
    assert len(heal) == 1 and f"{COMPILE} (entry " in heal[0] and "evicted" in heal[0], output
    key = list_tasks(ref)[COMPILE]["key"]
    assert not (reader / BINARY).exists() and not entry_file(key).exists()
    assert not (reader / "build/tiny/ort-qnn/SM8750/manifest.json").exists()

    executed, output = doit(reader, cache_dir=where)  # healed: no step by hand
    assert (
        COMPILE in executed
        and RESTORED not in (reader / "build/tiny/ort-qnn/SM8750/net.compile.log").read_text()
    )
    assert sha256(reader / BINARY) == sha256(ref / BINARY) != poisoned
    assert json.loads(entry_file(key).read_text())["outputs"][BINARY]["sha256"] == sha256(
        ref / BINARY
    )
    third = checkout(ref, tmp_path / "third")
    doit(third, COMPILE, cache_dir=where)
    assert RESTORED in (third / "build/tiny/ort-qnn/SM8750/net.compile.log").read_text()
    assert sha256(third / BINARY) == sha256(ref / BINARY)


def test_a_signed_cache_restores_only_what_a_trusted_key_signed(shared, tmp_path, monkeypatch):
    """CI signs (cache_sign_key), the reader trusts its public key only (cache_trust): the forged
    entries, one with the genuine entry's signatures copied, both signed again by a key of the
    attacker's, are never restored; the build passes with the binary made here, and every other
    step, results of checks included, comes signed from the cache."""
    where, _, _ = shared
    ci, _ = sign.keygen("ci-1", tmp_path / "keys")
    attacker, _ = sign.keygen("ci-1", tmp_path / "attacker-keys")   # the same name, another key
    monkeypatch.setenv("QNN_CACHE_SIGN_KEY", str(ci))
    ref = two_models(tmp_path, where)
    forge(shared, ref, tmp_path, sign_with=str(attacker))
    forged_verify = list_tasks(tmp_path / "attacker")[VERIFY]["key"]
    genuine_verify = list_tasks(ref)[VERIFY]["key"]
    monkeypatch.delenv("QNN_CACHE_SIGN_KEY")
    monkeypatch.setenv("QNN_CACHE_TRUST", (tmp_path / "keys/ci-1.pub").read_text().strip())
    reader = checkout(ref, tmp_path / "reader")
    executed, output = doit(reader, cache_dir=where)
    assert {COMPILE, VERIFY} <= set(executed)
    assert RESTORED not in (reader / "build/tiny/ort-qnn/SM8750/net.compile.log").read_text()
    # The forged verify entry is never restored. The compile made here is the reference's binary,
    # and its record holds its duration in ms: when that equals the reference's, verify's inputs are
    # the reference's and CI's own signed entry restores (a rare coincidence that made this flaky).
    verified = (reader / "build/tiny/ort-qnn/SM8750/verify.log").read_text()
    assert forged_verify not in verified
    assert RESTORED not in verified or f"entry {genuine_verify}" in verified, verified[-300:]
    for log in ("tiny2/ort-qnn/SM8750/verify.log", "tiny2/parity.log", "tiny/net/export.log"):
        assert RESTORED in (reader / "build" / log).read_text(), log
    assert sha256(reader / BINARY) == sha256(ref / BINARY)
    assert (
        output.count("not signed by a key of cache_trust") == 1 and "no cache_trust" not in output
    )
    # a trusting reader without a key stores nothing
    assert output.count("holds no key to sign its own") == 1


def test_an_exported_onnx_of_other_weights_fails_parity_here_and_heals(tmp_path):
    """tiny's export entry planted with tiny2's ONNX (same I/O, other weights; its log edited to
    match): simplify runs here on it, parity (a result: never restored unsigned) fails against
    tiny's own checkpoint, the export entry is evicted through the step that ran here, and the next
    doit exports here and passes."""
    where = str(tmp_path / "cache")
    shared = (where, lambda key: Path(where) / "entries" / f"{key}.json",
              lambda digest: Path(where) / "blobs" / digest[:2] / digest)
    ref = two_models(tmp_path, where)
    export = list_tasks(ref)["export:tiny/net"]
    plant(shared, export["key"], {p: others(ref, p) for p in export["targets"]})
    reader = checkout(ref, tmp_path / "reader")
    executed, output = doit(reader, cache_dir=where, passes=False)
    # parity gates it
    assert "simplify:tiny/net" in executed and "compile:tiny/net@SM8750" not in executed
    (line,) = [ln for ln in output.splitlines() if "failed on files restored from the cache" in ln]
    assert line.startswith("cache: parity:tiny/net failed") and "export:tiny/net (entry " in line, (
        line
    )
    assert (
        not [p for p in export["targets"] if (reader / p).exists()]
        and not shared[1](export["key"]).exists()
    )
    doit(reader, cache_dir=where)
    assert RESTORED not in (reader / "build/tiny/net/export.log").read_text()
    assert sha256(reader / "build/tiny/ort-qnn/SM8750/net_qnn.bin") == sha256(
        ref / "build/tiny/ort-qnn/SM8750/net_qnn.bin"
    )
