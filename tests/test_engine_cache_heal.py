"""A cache that heals (toolchain/engine/cache/heal.py): a failed step's suspects are the restored
entries upstream of what it read, through steps that ran here; each is evicted and listed, its files
removed, in one line; a failure with nothing restored upstream touches nothing; a listed entry is
never restored again, a new one is."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from toolchain.engine import cache
from toolchain.engine.cache import heal


def step(name, reads, writes):
    return SimpleNamespace(name=name, file_dep=reads, targets=writes)


def test_a_failed_check_evicts_the_restored_entries_upstream_and_nothing_else(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    Path("build").mkdir()
    for name in ("a.bin", "b.onnx", "c.bin", "d.json"):
        Path("build", name).write_bytes(name.encode())
    store = cache.Store(tmp_path / "cache")
    store.save("key-a", {"task": "compile"}, ["build/a.bin"])
    assert store.restore("key-a", ["build/a.bin"])
    heal.record(
        step("compile", ["build/lib.so"], ["build/a.bin"]), "key-a", store.digest, store.name
    )
    # ran here, on the restored file
    heal.record(step("wrap", ["build/a.bin"], ["build/b.onnx"]))
    # ran here, nothing restored
    heal.record(step("other", ["models/x.onnx"], ["build/c.bin"]))
    heal.failed(step("check", ["build/b.onnx", "build/c.bin"], ["build/d.json"]),
                lambda name: store if name == store.name else None)
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cache: ")]
    assert line.startswith(
        "cache: check failed on files restored from the cache: compile (entry key-a) evicted"
    )
    assert (
        not Path("build/a.bin").exists()
        and Path("build/b.onnx").exists()
        and Path("build/c.bin").exists()
    )
    assert not store.entry("key-a").exists() and json.loads(Path(heal.BAD).read_text()) == [
        store.digest
    ]
    assert "compile" not in json.loads(Path(heal.PROVENANCE).read_text())

    heal.failed(
        step("check", ["build/b.onnx", "build/c.bin"], ["build/d.json"]), lambda name: store
    )
    # nothing restored upstream now: a failure of its own, nothing touched
    assert capsys.readouterr().err == ""
    assert Path("build/b.onnx").exists() and Path("build/c.bin").exists()


def test_a_listed_entry_is_never_restored_and_a_new_one_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("out.bin").write_bytes(b"poisoned")
    # a read-only client cannot evict
    store = cache.Store(tmp_path / "cache", cache.Settings(upload=False))
    cache.Store(tmp_path / "cache").save("k", {"task": "t"}, ["out.bin"])
    assert store.restore("k", ["out.bin"])
    store.refused = frozenset({store.digest})
    assert not store.restore("k", ["out.bin"]) and store.entry("k").exists()
    Path("out.bin").write_bytes(b"correct")
    # written again by whoever uploads
    cache.Store(tmp_path / "cache").save("k", {"task": "t"}, ["out.bin"])
    assert store.restore("k", ["out.bin"]) and Path("out.bin").read_bytes() == b"correct"


def test_a_build_folder_that_cannot_be_written_costs_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("build").write_text("not a folder\n")   # every write under build/ fails
    heal.record(step("compile", ["in.onnx"], ["out.bin"]))
    heal.record(step("verify", ["out.bin"], ["v.json"]))
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith(f"cache: could not write {heal.PROVENANCE} (") and "is not healed" in line
    )
