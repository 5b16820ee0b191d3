"""The remote cache client (toolchain/engine/cache/remote.py) against what a server may do to it:
answer with a redirect (never followed: the credentials stay with the configured server; one
warning, the build goes on), serve a blob longer or shorter than its entry records or an entry
larger than any entry (refused, nothing left on disk), and a read-only client (cache_upload=0,
$QNN_CACHE_UPLOAD=0) that restores but never PUTs or DELETEs. The servers are real and on loopback
only: nginx (tests/nginx_cache.py) on 127.0.0.1 and a recording HTTP server on 127.0.0.2."""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import nginx_cache
import pytest
from conftest import (
    ONE_CHIP,
    RESTORED,
    TOKEN,
    build,
    cache_lines,
    checkout,
    doit,
    need_nginx,
    tool_logs,
)

from toolchain.engine.cache import store as cache_store
from toolchain.engine.cache.remote import HttpStore

BIG = 64 << 20   # a blob far longer than its entry says


@pytest.fixture
def recorder():
    """The host a redirect points to: records every request, headers included."""
    started = nginx_cache.Recorder()
    yield started
    started.stop()


@pytest.fixture
def redirecting(tmp_path, recorder):
    """nginx answering every request with 302 to the same path on the recorder."""
    need_nginx()
    started = nginx_cache.Server(tmp_path / "nginx-redirect", redirect_to=recorder.url.rstrip("/"))
    yield started
    started.stop()


def host(url: str) -> str:
    return url.split("//", 1)[1].rstrip("/")


# ---- redirects: never followed

def test_a_redirecting_server_gets_no_credentials_out_and_the_build_goes_on(
    redirecting, recorder, tmp_path, monkeypatch
):
    monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
    root = build(tmp_path, "p", **ONE_CHIP).root
    executed, output = doit(root, f"cache={redirecting.url}")   # asserts exit code 0
    assert "compile:tiny/net@SM8750" in executed and "verify:tiny@SM8750" in executed
    # not one request reached the redirect's target, token or not
    assert recorder.seen == [], recorder.seen
    asked = redirecting.requests()
    # the server did redirect
    assert asked and all(status == 302 for _, _, status, _, _ in asked), asked
    (line,) = cache_lines(output)
    assert "redirected (HTTP 302)" in line and "not followed" in line, line
    assert host(redirecting.url) in line and f"to {host(recorder.url)}," in line, line
    assert TOKEN not in output
    assert json.loads((root / "build/.cache-down.json").read_text())[
        "url"
    ] == redirecting.url.rstrip("/")


def test_a_redirect_is_unreachable_for_the_store_itself(
    redirecting, recorder, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)   # no build/ here: no down marker, every call asks the server
    store = HttpStore(redirecting.url, cache_store.Settings(token=TOKEN))
    target = re.escape(host(recorder.url))
    with pytest.raises(
        cache_store.Unreachable, match=rf"GET /ac/k: redirected \(HTTP 302\) to {target}, not fol"
    ):
        store.read_entry("k")
    with pytest.raises(cache_store.Unreachable, match=r"HEAD /cas/0+: redirected \(HTTP 302\)"):
        store.has_blob("0" * 64)
    assert recorder.seen == []
    assert [(m, p, s) for m, p, s, _, _ in redirecting.requests(at_least=2)] == [
        ("GET", "/ac/k", 302),
        ("HEAD", "/cas/" + "0" * 64, 302),
    ]


# ---- a read-only client

def test_a_read_only_client_restores_but_never_writes_or_evicts(server, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
    ref = build(tmp_path, "ref", **ONE_CHIP).root
    doit(ref, f"cache={server.url}")
    entries = {
        json.loads(p.read_text())["material"]["task"]: p for p in (server.root / "ac").iterdir()
    }
    # its key depends on the checkpoint only: the same in every checkout
    bad = entries["export:tiny/net"]
    # a broken entry: a writing client would DELETE it and PUT a new one
    bad.write_bytes(b'{"outputs": {"build/')
    before = len(server.requests())

    second = checkout(ref, tmp_path / "second")
    executed, output = doit(second, f"cache={server.url}", "cache_upload=0")
    logs = tool_logs(second)
    assert RESTORED in logs["tiny/checkpoint/model.pt.log"]   # it restores
    # the broken one: run
    assert RESTORED not in logs["tiny/net/export.log"] and "export:tiny/net" in executed
    assert [
        ln for ln in cache_lines(output) if "unusable cache entry ignored" in ln and bad.name in ln
    ], output
    assert bad.read_bytes() == b'{"outputs": {"build/'   # neither evicted nor rewritten
    after = server.requests()[before:]
    assert after and {m for m, *_ in after} <= {"GET", "HEAD"}, sorted({m for m, *_ in after})


def test_a_read_only_client_puts_nothing_on_an_empty_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
    monkeypatch.setenv("QNN_CACHE_UPLOAD", "0")
    root = build(tmp_path, "p", **ONE_CHIP).root
    executed, output = doit(root, f"cache={server.url}")
    assert "compile:tiny/net@SM8750" in executed and not cache_lines(output), output
    methods = [m for m, *_ in server.requests()]
    assert "GET" in methods and "PUT" not in methods and "DELETE" not in methods, sorted(
        set(methods)
    )
    assert not list((server.root / "ac").iterdir()) and not list((server.root / "cas").iterdir())


# ---- answers too large for what the entry records

def entry(server, key: str, size: int, digest: str) -> None:
    (server.root / "ac" / key).write_text(json.dumps(
        {"format": cache_store.FORMAT, "material": {"task": "t"},
         "outputs": {"build/x.bin": {"sha256": digest, "bytes": size}}}))


def sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def leftovers() -> list[str]:
    return sorted(str(p) for p in Path("build").rglob("*") if p.name != ".cache-down.json") \
        if Path("build").exists() else []


def test_a_blob_longer_than_its_entry_is_refused_before_its_body(
    server, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    digest = hashlib.sha256(bytes(10)).hexdigest()
    entry(server, "k", 10, digest)
    # nginx announces 64 MiB for a blob the entry says is 10 bytes
    sparse(server.root / "cas" / digest, BIG)
    assert (
        HttpStore(server.url, cache_store.Settings(token=TOKEN)).restore("k", ["build/x.bin"])
        is False
    )
    assert leftovers() == []   # no output, no temp file
    err = capsys.readouterr().err
    assert (
        f"blob {digest}: the server sends {BIG} bytes, larger than the 10 bytes" in err
        and "cut off" in err
    ), err
    # nginx logs a request when it ends: the GET the client hung up on may come after the DELETE
    # that followed it
    deadline = time.monotonic() + 10
    while ("GET", f"/cas/{digest}") not in [
        (m, p) for m, p, *_ in server.requests()
    ] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("GET", f"/cas/{digest}") in [(m, p) for m, p, *_ in server.requests()], (
        server.requests()
    )


def test_a_blob_with_no_length_is_cut_off_at_its_recorded_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # no Content-Length: the body ends when it is closed
    endless = nginx_cache.Recorder(size=BIG, length=False)
    try:
        digest = hashlib.sha256(bytes(10)).hexdigest()
        with pytest.raises(ValueError, match="larger than the 10 bytes its entry records: cut off"):
            HttpStore(endless.url).fetch_blob(digest, "build/x.bin", 10)
        assert leftovers() == []
        assert endless.done.wait(10)
        # the client hung up instead of draining the body
        assert endless.sent < BIG // 2, endless.sent
    finally:
        endless.stop()


def test_a_blob_shorter_than_its_entry_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    short = nginx_cache.Recorder(size=5, length=False)
    try:
        with pytest.raises(ValueError, match="has 5 bytes, its entry records 10"):
            HttpStore(short.url).fetch_blob(hashlib.sha256(bytes(5)).hexdigest(), "build/x.bin", 10)
        assert leftovers() == []
    finally:
        short.stop()


def test_an_entry_recording_more_than_max_blob_is_refused_before_any_fetch(
    server, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    data = bytes(2000)
    digest = hashlib.sha256(data).hexdigest()
    entry(server, "k", len(data), digest)
    (server.root / "cas" / digest).write_bytes(data)   # a valid blob: only its size is refused
    store = HttpStore(server.url, cache_store.Settings(token=TOKEN, max_blob=1000))
    assert store.restore("k", ["build/x.bin"]) is False
    assert "the entry records 2000 bytes, over the 1000 allowed" in capsys.readouterr().err
    assert not Path("build/x.bin").exists()
    # the blob was never asked for
    assert [p for _, p, *_ in server.requests() if p.startswith("/cas/")] == []


def test_an_entry_larger_than_max_entry_is_refused(server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sparse(server.root / "ac" / "k", cache_store.MAX_ENTRY + (1 << 20))  # 17 MiB
    assert (
        HttpStore(server.url, cache_store.Settings(token=TOKEN)).restore("k", ["build/x.bin"])
        is False
    )
    assert f"entry k is over {cache_store.MAX_ENTRY} bytes" in capsys.readouterr().err
    assert leftovers() == []
