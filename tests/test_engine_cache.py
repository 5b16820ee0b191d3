"""The shared artifact cache (toolchain/engine/cache/: __init__, remote, store): keys that follow
inputs, settings and code; a folder cache another checkout restores every heavy step from; nginx
with WebDAV PUT speaking Bazel's HTTP remote-cache layout (tests/nginx_cache.py); restores that
cannot poison a build (folder and server); and a server that is dead, slow or full costing a warning
line, never the build."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nginx_cache
import pytest
from conftest import (
    ONE_CHIP,
    RESTORED,
    TOKEN,
    Project,
    add_qnet,
    assert_same_outputs,
    build,
    cache_lines,
    cacheable,
    checkout,
    doit,
    need_nginx,
    sdk_env,
    sha256,
    tool_logs,
)

from toolchain.engine import cache, files


def test_the_key_follows_inputs_settings_and_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.onnx").write_bytes(b"a")

    def key(**change):
        material = {
            "task": "compile:m/g@C",
            "action": {"function": "toolchain.compilers.ort_qnn.compile:build"},
            "code": "toolchain.compilers.ort_qnn.compile",
            "inputs": ["in.onnx"],
            "settings": [{"o": 3}],
            "outputs": ["o"],
        }
        return cache.key(cache.key_material(**{**material, **change}))
    first = key()
    assert (
        key() == first
        and key(settings=[{"o": 2}]) != first
        and key(code="toolchain.stages.verify") != first
    )
    Path("in.onnx").write_bytes(b"b")
    assert key() != first
    assert {
        "compilers/ort_qnn/compile.py",
        "compilers/ort_qnn/ep.py",
        "qnn/qnnbin.py",
        "engine/run/worker.py",
    } <= set(cache.code_digest("toolchain.compilers.ort_qnn.compile"))


def test_the_store_restores_all_outputs_or_none(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    outputs = ["build/a.bin", "build/a.txt"]
    for i, path in enumerate(outputs):
        Path(path).parent.mkdir(exist_ok=True)
        Path(path).write_bytes(b"x" * (i + 1))
    store = cache.Store(tmp_path / "cache")
    store.save("k", {"task": "t"}, outputs)
    Path(outputs[0]).write_bytes(b"stale")
    assert store.restore("k", outputs) and Path(outputs[0]).read_bytes() == b"x"
    assert not store.restore("k", outputs[:1])   # the entry lists other outputs
    assert not store.entry("k").exists()         # evicted: never offered again
    store.save("k", {"task": "t"}, outputs)
    assert not store.restore("missing", outputs)
    store.blob(sha256(outputs[1])).unlink()
    Path(outputs[0]).write_bytes(b"stale")
    # none replaced
    assert not store.restore("k", outputs) and Path(outputs[0]).read_bytes() == b"stale"
    Path(outputs[0]).write_bytes(b"x")
    store.save("k", {"task": "t"}, outputs)
    store.entry("k").write_text('{"outputs": {"build/a')   # truncated
    assert not store.restore("k", outputs)
    assert capsys.readouterr().err.count("unusable cache entry evicted") == 3
    assert not list(Path("build").glob(".*.tmp"))


def test_a_cache_entry_that_fails_verification_is_evicted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.bin").write_bytes(b"data")
    store = cache.Store(tmp_path / "cache")
    store.save("k", {"task": "t"}, ["out.bin"])
    store.blob(files.sha256("out.bin")).write_bytes(b"poisoned")
    assert store.restore("k", ["out.bin"]) is False
    assert not store.entry("k").exists()   # never offered again


# ---- a folder cache shared by checkouts ----

def test_second_checkout_restores_every_heavy_output_from_the_cache(reference, tmp_path):
    ref, shared = reference
    second = checkout(ref, tmp_path / "second")
    executed, _ = doit(second, cache_dir=shared)
    assert "compile:tiny2/net@SM8750" in executed and "report" in executed
    logs = tool_logs(second)
    restored = cacheable(logs)
    assert (
        len(logs) == 22
        and len(restored) == 10
        and all(RESTORED in text for text in restored.values())
    )
    # code is rebuilt here, and the results of checks (an unsigned cache: parity,
    # verify) computed here
    assert not [rel for rel in logs if rel not in restored and RESTORED in logs[rel]]
    assert sum(rel.endswith(("verify.log", "parity.log")) for rel in set(logs) - set(restored)) == 6
    for rel, text in restored.items():   # a restored log is the original plus the note
        assert text.startswith((ref / "build" / rel).read_text())
    assert_same_outputs(ref, second)


def test_a_corrupted_entry_is_ignored_recomputed_and_replaced(reference, tmp_path):
    ref, shared = reference
    corrupt = tmp_path / "cache"
    shutil.copytree(shared, corrupt)
    store = cache.Store(corrupt)
    entry = next(json.loads(p.read_text()) for p in (corrupt / "entries").glob("*.json")
                 if json.loads(p.read_text())["material"]["task"] == "compile:tiny/net@SM8550")
    binary = entry["outputs"]["build/tiny/ort-qnn/SM8550/net_qnn.bin"]["sha256"]
    data = bytearray(store.blob(binary).read_bytes())
    data[len(data) // 2] ^= 0xFF   # same size, one byte flipped
    store.blob(binary).write_bytes(bytes(data))
    flipped = sha256(store.blob(binary))

    third = checkout(ref, tmp_path / "third")
    _, output = doit(third, "compile:tiny/net@SM8550", cache_dir=corrupt)
    assert "unusable cache entry evicted" in output and f"sha256 {flipped}" in output
    assert RESTORED not in (third / "build/tiny/ort-qnn/SM8550/net.compile.log").read_text()
    assert RESTORED in (third / "build/tiny/net/export.log").read_text()
    assert sha256(third / "build/tiny/ort-qnn/SM8550/net_qnn.bin") == binary
    # the bad blob was replaced by the recomputed bytes
    assert sha256(store.blob(binary)) == binary

    fourth = checkout(ref, tmp_path / "fourth")
    doit(fourth, "compile:tiny/net@SM8550", cache_dir=corrupt)
    assert RESTORED in (fourth / "build/tiny/ort-qnn/SM8550/net.compile.log").read_text()


def test_qairt_tool_steps_are_restored_in_another_checkout(tmp_path, monkeypatch):
    sdk_env(monkeypatch, tmp_path)
    for name in ("a", "b"):
        project = Project(tmp_path / name)
        add_qnet(project)
        rc, executed, text = project.run(f"cache={tmp_path / 'cache'}")
        assert rc == 0 and "context:qnet/net-a@SM8550" in executed, text
    graph = tmp_path / "b/build/qnet/qairt/net-a"
    # code (C++ sources, model libraries): built on each machine
    for stage in ("convert", "modellib"):
        assert RESTORED not in (graph / f"net-a.{stage}.log").read_text()
    # data: restored
    assert RESTORED in (tmp_path / "b/build/qnet/qairt/SM8550/net-a.context.log").read_text()


# ---- the cache on a real server ----

def test_a_fresh_clone_restores_every_heavy_step_from_the_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
    ref = build(tmp_path, "ref").root
    executed, output = doit(ref, f"cache={server.url}")
    assert "compile:tiny/net@SM8750" in executed and not cache_lines(output), output
    entries, blobs = list((server.root / "ac").iterdir()), list((server.root / "cas").iterdir())
    # /ac/<key>, /cas/<sha256>
    # results: not stored
    assert len(entries) == len(cacheable(tool_logs(ref))) >= 5 and len(blobs) > len(entries)
    assert all(sha256(b) == b.name for b in blobs)
    uploaded = server.traffic()["PUT"]
    # each blob once, entries last
    assert uploaded["ok"] == uploaded["requests"] == len(entries) + len(blobs)

    second = checkout(ref, tmp_path / "second")
    executed, output = doit(second, cache_dir=server.url)
    logs = cacheable(tool_logs(second))
    assert logs and all(RESTORED in text for text in logs.values()), [
        k for k, v in logs.items() if RESTORED not in v
    ]
    # 0 compiles
    assert not [rel for rel, text in logs.items() if ".compile.log" in rel and RESTORED not in text]
    assert_same_outputs(ref, second)
    # the token is in the environment only: never in a log, record or message
    for root in (ref, second):
        assert not [
            p
            for p in (root / "build").rglob("*")
            if p.is_file() and TOKEN.encode() in p.read_bytes()
        ]
    assert TOKEN not in output


def test_a_request_without_the_token_is_refused_and_the_build_goes_on(
    server, tmp_path, monkeypatch
):
    monkeypatch.delenv("QNN_CACHE_TOKEN", raising=False)
    root = build(tmp_path, "p", **ONE_CHIP).root
    executed, output = doit(root, f"cache={server.url}")
    assert "compile:tiny/net@SM8750" in executed
    (line,) = cache_lines(output)
    assert "HTTP 401" in line and "the step runs here" in line, output
    assert not list((server.root / "cas").iterdir())


def poison(entry: Path, other_entry: Path, binary: str, other_binary: str) -> None:
    """Point the entry's binary at another valid blob (another chip's binary), as a
    bad writer would."""
    data, other = json.loads(entry.read_text()), json.loads(other_entry.read_text())
    data["outputs"][binary] = other["outputs"][other_binary]
    entry.write_text(json.dumps(data))


@pytest.mark.parametrize("kind", ["folder", "http"])
def test_an_entry_pointing_at_another_valid_blob_is_refused_recomputed_and_written_back(
    kind, request, tmp_path, monkeypatch
):
    if kind == "http":
        server = request.getfixturevalue("server")
        monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
        where, entries = server.url, server.root / "ac"

        def entry_file(key):
            return entries / key
    else:
        where, entries = str(tmp_path / "cache"), tmp_path / "cache" / "entries"

        def entry_file(key):
            return entries / f"{key}.json"
    ref = build(tmp_path, "ref").root
    doit(ref, f"cache={where}")
    keys = {
        json.loads(p.read_text())["material"]["task"]: p.name.removesuffix(".json")
        for p in entries.iterdir()
    }
    good, other = "build/tiny/ort-qnn/SM8750/net_qnn.bin", "build/tiny/ort-qnn/SM8550/net_qnn.bin"
    poison(
        entry_file(keys["compile:tiny/net@SM8750"]),
        entry_file(keys["compile:tiny/net@SM8550"]),
        good,
        other,
    )

    third = checkout(ref, tmp_path / "third")
    executed, output = doit(third, cache_dir=where)   # the build passes: the bad entry is not used
    line = next(ln for ln in cache_lines(output) if keys["compile:tiny/net@SM8750"] in ln)
    assert "unusable cache entry evicted" in line and "soc_type SM8550 != SM8750" in line, line
    assert f"{good} has sha256" in line   # the record names another binary than the one restored
    assert RESTORED not in (third / "build/tiny/ort-qnn/SM8750/net.compile.log").read_text()
    assert RESTORED in (third / "build/tiny/ort-qnn/SM8550/net.compile.log").read_text()
    assert sha256(third / good) == sha256(ref / good) and "verify:tiny@SM8750" in executed
    written = json.loads(entry_file(keys["compile:tiny/net@SM8750"]).read_text())
    assert written["outputs"][good]["sha256"] == sha256(ref / good)   # a correct entry written back

    fourth = checkout(ref, tmp_path / "fourth")
    executed, output = doit(fourth, cache_dir=where)
    assert RESTORED in (fourth / "build/tiny/ort-qnn/SM8750/net.compile.log").read_text()
    assert not cache_lines(output), output
    assert_same_outputs(ref, fourth)


@pytest.mark.parametrize("kind", ["refused", "silent", "full"])
def test_a_dead_silent_or_full_server_costs_one_warning_never_the_build(
    kind, tmp_path, monkeypatch
):
    monkeypatch.setenv("QNN_CACHE_TIMEOUT", "1")
    monkeypatch.delenv("QNN_CACHE_TOKEN", raising=False)
    stop = None
    if kind == "refused":
        # credentials in the URL: never said
        url = f"http://builder:hunter2@127.0.0.1:{nginx_cache.free_port()}/"
    elif kind == "silent":
        silent = nginx_cache.Silent()
        url, stop = silent.url, silent.close
    else:
        need_nginx()
        # 413 for every blob above 1 KiB
        full = nginx_cache.Server(tmp_path / "nginx", max_body="1k")
        url, stop = full.url, full.stop
    root = build(tmp_path, "p", **ONE_CHIP).root
    started = time.monotonic()
    try:
        executed, output = doit(root, f"cache={url}")
    finally:
        if stop:
            stop()
    wall = time.monotonic() - started
    assert "verify:tiny@SM8750" in executed and "manifest:tiny@SM8750" in executed
    lines = cache_lines(output)
    # one line; then the server is left alone for the rest of the build
    assert len(lines) == 1, output
    assert {"refused": "Connection refused", "silent": "timed out", "full": "HTTP 413"}[
        kind
    ] in lines[0], lines
    assert "hunter2" not in output and "builder:" not in output
    assert json.loads((root / "build/.cache-down.json").read_text())["until"] > time.time()
    print(f"{kind}: {wall:.1f} s wall, warning: {lines[0]}")


def test_a_bad_cache_url_is_one_line_at_load(tmp_path):
    root = build(tmp_path, "p", **ONE_CHIP).root
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "doit", "cache=http://:8080/"],
        cwd=root,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "QNN_CACHE"},
    )
    assert (
        done.returncode == 3
        and "command line: cache=http://:8080/: http:// needs a host" in done.stderr
    ), done.stderr
    assert not (root / "build").exists() or not list((root / "build").rglob("*.onnx"))


@pytest.mark.parametrize("url", ["ftp://cache.example.com/c", "s3://bucket/c", "file:///tmp/c"])
def test_a_cache_url_of_another_scheme_is_refused_naming_the_accepted_ones(
    url, tmp_path, monkeypatch
):
    """Before: `ftp://host/c` became a folder `ftp:/host/c` inside the project."""
    from toolchain import options
    from toolchain.engine.options import OptionError
    monkeypatch.chdir(tmp_path)
    scheme = url.split(":")[0]
    with pytest.raises(
        OptionError,
        match=rf"^command line: cache={re.escape(url)}: {scheme}:// is not a scheme the "
        r"cache speaks: a folder \(a path, or a mount such as NFS\), http:// or "
        r"https://$",
    ):
        options.resolve_given({"cache": url}, {})
    assert list(tmp_path.iterdir()) == []


def test_a_bad_signing_key_or_trusted_key_is_one_line_at_load(tmp_path):
    root = build(tmp_path, "p", **ONE_CHIP).root
    (tmp_path / "not-a-key").write_text("hello\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QNN_CACHE")}
    for extra, said in (
        (
            {"QNN_CACHE_SIGN_KEY": str(tmp_path / "not-a-key")},
            f"$QNN_CACHE_SIGN_KEY={tmp_path / 'not-a-key'}: not a secret key written by python -m "
            "toolchain cache-key",
        ),
        (
            {"QNN_CACHE_TRUST": "ci-1:short"},
            "$QNN_CACHE_TRUST=ci-1:short: public key ci-1: not 32 bytes of base64",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "doit", "list"],
            cwd=root,
            capture_output=True,
            text=True,
            env={**env, **extra, "QNN_CACHE": str(tmp_path / "cache")},
        )
        assert done.returncode == 3 and said in done.stderr and "Traceback" not in done.stderr, (
            done.stderr
        )
        assert "hello" not in done.stderr   # a key file's content is never repeated
