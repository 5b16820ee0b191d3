"""Scale (issue 7): `doit -n 2` vs serial, the shared artifact cache, the CI matrix run as separate
checkouts, per-stage limits, and build/report.html in headless Chromium.

Builds run as `python -m doit` in separate processes, each project carrying a copy of toolchain/ (as a
real checkout does; `python -m` puts the checkout first on sys.path): the cache key holds the stage
code's digest, so the copy also shields these tests from edits made to the repo while they run."""
from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from conftest import ROOT, Project, sha256
from toolchain.engine import cache, limits, matrix
from toolchain.stages import compare, report_html

TIMES = ("seconds", "compile_seconds", "seconds_per_call")   # the only fields that may differ between builds
RESTORED = "# restored from cache"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def sources(project: Project) -> Project:
    shutil.copytree(ROOT / "toolchain", project.root / "toolchain", ignore=shutil.ignore_patterns("__pycache__"))
    return project


def checkout(src: Path, dst: Path) -> Path:
    """Another checkout of the same sources: dodo.py, models/, toolchain/, no build/."""
    dst.mkdir(parents=True)
    shutil.copy(src / "dodo.py", dst / "dodo.py")
    for name in ("models", "toolchain"):
        shutil.copytree(src / name, dst / name)
    return dst


def doit(root: Path, *args: str, cache_dir: Path | None = None) -> tuple[list[str], str]:
    """`python -m doit` in root (cache from $QNN_CACHE if given); (executed tasks, output); must pass."""
    env = {k: v for k, v in os.environ.items() if k not in (cache.ENV, limits.ENV)}
    if cache_dir:
        env[cache.ENV] = str(cache_dir)
    done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line[3:] for line in done.stdout.splitlines() if line.startswith(".  ")], done.stdout + done.stderr


def tool_logs(root: Path) -> dict[str, str]:
    """{path under build/: text} of every log of a heavy step (worker or external tool: '# exit N after')."""
    build = root / "build"
    return {str(p.relative_to(build)): p.read_text() for p in sorted(build.rglob("*.log"))
            if "\n# exit " in p.read_text()}


def untimed(path: Path):
    """A JSON record without its timings."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMES}
        return [strip(v) for v in value] if isinstance(value, list) else value
    return strip(json.loads(path.read_text()))


def assert_same_outputs(a: Path, b: Path) -> None:
    """Same files under build/; byte-identical but for logs (times), the reports (times) and JSON
    records, which must be identical once their timings are removed."""
    def files(root):
        return {str(p.relative_to(root / "build")) for p in (root / "build").rglob("*")
                if p.is_file() and not p.relative_to(root / "build").parts[0].startswith(".")}   # engine books
    assert files(a) == files(b)
    for rel in sorted(files(a)):
        if rel.endswith(".log") or rel in ("report.md", "report.html"):
            continue
        if rel.endswith(".json") and sha256(a / "build" / rel) != sha256(b / "build" / rel):
            assert untimed(a / "build" / rel) == untimed(b / "build" / rel), rel
            continue
        assert sha256(a / "build" / rel) == sha256(b / "build" / rel), rel


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """2 models x 2 chips built serially from scratch, filling a cache: (project root, cache folder)."""
    base = tmp_path_factory.mktemp("scale")
    project = sources(Project(base / "ref"))
    project.add_tiny("tiny")
    project.add_tiny("tiny2", seed=1)
    doit(project.root, f"cache={base / 'cache'}")   # the cache as a doit variable
    return project.root, base / "cache"


def test_parallel_build_is_byte_identical_to_serial_and_keeps_the_state(reference, tmp_path):
    # The chip-independent work comes from the serial build's cache (hash-checked), so the test's time
    # goes to the fan-out: 4 compiles and 4 simulator runs 2-wide (threads: DOIT_CONFIG par_type).
    ref, shared = reference
    partial = tmp_path / "cache"
    shutil.copytree(shared / "blobs", partial / "blobs")
    (partial / "entries").mkdir()
    for entry in (shared / "entries").glob("*.json"):
        if "@" not in json.loads(entry.read_text())["material"]["task"]:
            shutil.copy(entry, partial / "entries")
    par = checkout(ref, tmp_path / "par")
    executed, _ = doit(par, "-n", "2", cache_dir=partial)
    assert len(executed) == len(set(executed)) == 27
    computed = sorted(rel for rel, text in tool_logs(par).items() if RESTORED not in text)
    assert len(computed) == 8 and all("/ort-qnn/" in rel for rel in computed)
    assert_same_outputs(ref, par)
    with sqlite3.connect(par / "build/.doit.db") as db:
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    assert doit(par, "-n", "2")[0] == []   # every task's state was committed


def test_fresh_process_steps_give_the_same_bytes_as_forks_of_the_server(reference, tmp_path):
    # The reference ran every heavy step as a fork of the fork server (the default; the parallel test above
    # too); here each step is a new interpreter, from scratch and without the cache.
    ref, _ = reference
    fresh = checkout(ref, tmp_path / "fresh")
    executed, _ = doit(fresh, "workers=fresh")
    assert len(executed) == 27
    forked, started = tool_logs(ref), tool_logs(fresh)
    assert forked.keys() == started.keys() and len(forked) >= 12
    steps = {rel: text for rel, text in forked.items() if not rel.endswith(".modellib.log")}   # cc: an external tool
    assert all("# a fork of the fork server" in text for text in steps.values())
    assert not any("fork server" in text for text in started.values())
    assert_same_outputs(ref, fresh)


def test_second_checkout_restores_every_heavy_output_from_the_cache(reference, tmp_path):
    ref, shared = reference
    second = checkout(ref, tmp_path / "second")
    executed, _ = doit(second, cache_dir=shared)
    assert "compile:tiny2/net@SM8750" in executed and "report" in executed
    logs = tool_logs(second)
    assert len(logs) == 20 and all(RESTORED in text for text in logs.values())
    for rel, text in logs.items():   # a restored log is the original plus the note
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
    assert sha256(store.blob(binary)) == binary   # the bad blob was replaced by the recomputed bytes

    fourth = checkout(ref, tmp_path / "fourth")
    doit(fourth, "compile:tiny/net@SM8550", cache_dir=corrupt)
    assert RESTORED in (fourth / "build/tiny/ort-qnn/SM8550/net.compile.log").read_text()


def test_the_store_restores_all_outputs_or_none(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    outputs = ["build/a.bin", "build/a.json"]
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
    assert not store.restore("k", outputs) and Path(outputs[0]).read_bytes() == b"stale"   # none replaced
    Path(outputs[0]).write_bytes(b"x")
    store.save("k", {"task": "t"}, outputs)
    store.entry("k").write_text('{"outputs": {"build/a')   # truncated
    assert not store.restore("k", outputs)
    assert capsys.readouterr().err.count("unusable cache entry evicted") == 3
    assert not list(Path("build").glob(".*.tmp"))


def test_qairt_tool_steps_are_restored_in_another_checkout(tmp_path, monkeypatch):
    from test_qairt import add_qnet, sdk_env   # the stand-in SDK (tests/sdk_standin.py)
    sdk_env(monkeypatch, tmp_path)
    for name in ("a", "b"):
        project = Project(tmp_path / name)
        add_qnet(project)
        rc, executed, text = project.run(f"cache={tmp_path / 'cache'}")
        assert rc == 0 and "context:qnet/net-a@SM8550" in executed, text
    graph = tmp_path / "b/build/qnet/qairt/net-a"
    for stage in ("convert", "modellib"):   # external.action: the converter and lib generator ran once
        assert RESTORED in (graph / f"net-a.{stage}.log").read_text()


def plan(root: Path, *args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "toolchain.engine.matrix", *args], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)["include"]


def test_the_matrix_splits_chip_independent_and_chip_work(reference):
    ref, _ = reference
    models, chips = plan(ref, "--phase", "models"), plan(ref, "--phase", "chips", "--max-jobs", "3")
    assert [j["units"] for j in models] == ["tiny", "tiny2"]
    assert models[0]["tasks"].split() == ["checkpoint:tiny", "export:tiny/net", "simplify:tiny/net",
                                          "inspect:tiny/net", "parity:tiny", "convert:tiny/net", "modellib:tiny/net"]
    assert [j["units"] for j in chips] == ["tiny2@SM8550 tiny2@SM8750", "tiny@SM8550 tiny@SM8750"]
    assert chips[1]["tasks"].split() == ["compile:tiny/net@SM8550", "verify:tiny@SM8550", "manifest:tiny@SM8550",
                                         "compile:tiny/net@SM8750", "verify:tiny@SM8750", "manifest:tiny@SM8750"]


def test_the_matrix_jobs_on_separate_checkouts_run_each_heavy_stage_once(reference, tmp_path):
    ref, _ = reference
    solo = checkout(ref, tmp_path / "solo")   # one model x 2 chips keeps the test short
    (solo / "models/tiny2.toml").unlink()
    shared, roots = tmp_path / "cache", []   # an empty cache: the jobs do all the work between them

    def job(name, tasks):
        root = checkout(solo, tmp_path / name)
        roots.append(root)
        return doit(root, *tasks.split(), cache_dir=shared)

    phases = [plan(solo, "--phase", "models"), plan(solo, "--phase", "chips")]
    assert [len(jobs) for jobs in phases] == [1, 2]
    for phase, jobs in enumerate(phases):   # a phase's jobs at once, as CI runs them
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(job, [f"{phase}-{i}" for i in range(len(jobs))], [j["tasks"] for j in jobs]))
    job("report", "")   # the final job: plain `doit`, everything heavy restored

    computed = {}
    for root in roots:
        for rel, text in tool_logs(root).items():
            computed[rel] = computed.get(rel, 0) + (RESTORED not in text)
    assert len(computed) == 10 and set(computed.values()) == {1}, computed
    assert all(RESTORED in text for text in tool_logs(roots[-1]).values())
    assert (roots[-1] / "build/report.md").read_text().count("| tiny | SM") == 2


def test_matrix_grouping_stays_under_the_job_limit():
    groups = {f"m{i:02d}@C{c}": [f"compile:m{i:02d}/g@C{c}"] for i in range(30) for c in range(10)}
    for limit in (256, 100, 7, 1):
        entries = matrix.jobs(groups, limit)
        assert len(entries) <= limit
        assert sorted(u for e in entries for u in e["units"].split()) == sorted(groups)
    assert len(matrix.jobs(groups, 256)) == 150   # 300 units, 2 per job


def test_a_stage_limit_caps_concurrent_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(limits.ENV, "compile:1,verify:2")
    configured = limits.configured({"compile": 3}, ("compile", "verify", "export"))
    assert configured == {"compile": 1, "verify": 2}   # the environment over the stage's default
    for stage, slots in (("compile", 1), ("verify", 2), ("export", 4)):
        def inside(step, stage=stage):
            with limits.slot(stage, configured.get(stage, 0)):
                step()
        assert _peak([inside] * 4) == slots, stage


def _peak(runners) -> int:
    """Run each runner(step) in its own thread at once; the most steps that were inside at one time."""
    running, peak, lock = [0], [0], threading.Lock()

    def step():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
    threads = [threading.Thread(target=run, args=(step,)) for run in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return peak[0]


def test_every_simulator_stage_holds_a_slot_of_one_pool(project, monkeypatch):
    """Default verify, full verify, diagnose and the sherpa gates: never two simulators at once on 2 cores."""
    from toolchain import pipeline, project as project_mod
    sims = {s.name for s in pipeline.STAGES if s.pool == pipeline.SIMULATOR}
    assert sims == {"verify", "verify_full", "diagnose", "sherpa", "sherpa_full"}
    project.add_tiny()
    monkeypatch.chdir(project.root)
    variables = {"slots": pipeline.default_slots(jobs=2, memory=24), "workers": "fork", "rehash": False}
    made = pipeline.task_creators(project_mod.load("models"), variables)
    tasks = [t for stage in ("verify", "verify_full", "diagnose") for t in made[f"task_{stage}"]()
             if "@SM8750" in t["name"]]
    assert {t["meta"]["pool"] for t in tasks} == {"simulator"} and {t["meta"]["slots"] for t in tasks} == {1}
    class Task:   # what limits.call reads of a doit task: its name and meta
        def __init__(self, name, meta):
            self.name, self.meta = name, meta
    runners = [lambda step, t=t: limits.call(Task(t["name"], t["meta"]), step) for t in tasks]
    assert len(runners) == 3 and _peak(runners) == 1   # three stages, one simulator at a time


@pytest.mark.parametrize("variables, message", [
    (["limits=compile=2"], "limits=: 'compile=2' is not <stage>:<slots>"),
    (["limits=compil:2"], "no stage 'compil'; did you mean 'compile'?"),
    (["limit=compile:2"], "unknown variable limit=compile:2"),
    (["extra=yes"], "extra=yes: expected 1"),
])
def test_a_bad_command_line_variable_is_one_error_line_before_anything_runs(tmp_path, variables, message):
    project = Project(tmp_path / "proj")
    project.add_tiny()
    done = subprocess.run(["doit", "list", *variables], cwd=project.root, capture_output=True, text=True)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("ERROR: ") and message in done.stderr, done.stderr


def test_the_key_follows_inputs_settings_and_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.onnx").write_bytes(b"a")

    def key(**change):
        material = {"task": "compile:m/g@C", "action": {"function": "toolchain.backends.ort_qnn.compile:build"},
                    "code": "toolchain.backends.ort_qnn.compile", "inputs": ["in.onnx"], "settings": [{"o": 3}], "outputs": ["o"]}
        return cache.key(cache.key_material(**{**material, **change}))
    first = key()
    assert key() == first and key(settings=[{"o": 2}]) != first and key(code="toolchain.stages.verify") != first
    Path("in.onnx").write_bytes(b"b")
    assert key() != first
    assert {"backends/ort_qnn/compile.py", "backends/ort_qnn/ep.py", "qnn/qnnbin.py", "engine/worker.py"} <= set(
        cache.code_digest("toolchain.backends.ort_qnn.compile"))


def render(page: Path, folder: Path, size: str = "1400,900") -> tuple[Path, str]:
    """A page in headless Chromium: (its screenshot, its DOM)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={folder / 'profile'}"]
    shot = folder / "report.png"
    subprocess.run([CHROMIUM, *flags, f"--window-size={size}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return shot, dom


def drawn(dom: str, figure: str, kind: str, name: str) -> tuple[str, str]:
    """(its state class, its markup) of one row ("check" or "cost") of the figure with that id."""
    inside = dom.split(f'<figure id="{figure}">', 1)[1].split("</figure>", 1)[0]
    found = re.search(rf'<g class="{kind}( \w+)?" data-name="{re.escape(name)}">(.*?)</g>', inside)
    assert found, f"{figure}: no {kind} row {name!r}"
    return (found.group(1) or "").strip(), found.group(2)


def built_manifests(ref: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((ref / "build").glob("*/*/*/manifest.json"))]
    assert len(found) == 4
    return found


def colour_pixels(shot: Path, colour: str) -> int:
    rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return sum(n for n, c in Image.open(shot).convert("RGB").getcolors(1 << 24) if c == rgb)


@pytest.mark.skipif(not CHROMIUM, reason="no chromium binary on PATH (Debian: apt-get install chromium): "
                                         "build/report.html cannot be rendered here")
def test_the_html_report_renders_in_headless_chromium(reference, tmp_path):
    ref, _ = reference
    page = ref / "build/report.html"
    text = page.read_text()
    assert "<svg" in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")   # nothing fetched
    shot, dom = render(page, tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    assert dom.count("<rect") == 16 and dom.count("<tr>") == 5   # 4 checks + 4 graphs x 3 costs; 4 rows
    assert dom.count('<g class="check within"') == 4 and 'class="check over"' not in dom
    for m in built_manifests(ref):
        chip, y = m["chip"]["name"], m["verify"]["default"]["tensors"]["net"]["outputs"]["y"]
        state, markup = drawn(dom, f"checks-{m['model']}", "check", f"{chip} net/y")
        margin = compare.excess(y["at_worst_call"], y["check"])
        assert state == "within" and re.search(f'<rect [^>]*fill="{report_html.WITHIN}"', markup)
        assert f">{margin:.2g} of limit, within</text>" in markup
        _, costs = drawn(dom, f"cost-{chip}", "cost", f"{m['model']}/net")   # the records' numbers, as written
        assert re.findall(r'<text class="value"[^>]*>([^<]*)</text>', costs) == [
            f"{m['binaries']['net']['compile_seconds']:.1f} s",
            f"{m['verify']['default']['tensors']['net']['seconds_per_call']:.3g} s",
            f"{m['binaries']['net']['bytes'] / 1e6:.2f} MB"]
    assert colour_pixels(shot, report_html.WITHIN) > 4 * 200   # 4 green bars at least a few px wide, 12 high


@pytest.mark.skipif(not CHROMIUM, reason="no chromium binary on PATH (Debian: apt-get install chromium): "
                                         "build/report.html cannot be rendered here")
def test_the_html_report_draws_a_check_over_its_limit_red(reference, tmp_path):
    # The build's manifests, one of them with its output 3x over its bound (as a failed verify records it)
    ref, _ = reference
    copies = []
    for i, m in enumerate(built_manifests(ref)):
        if (m["model"], m["chip"]["name"]) == ("tiny", "SM8750"):
            y = m["verify"]["default"]["tensors"]["net"]["outputs"]["y"]
            at = y["at_worst_call"]
            at["max_abs"] = 3 * (y["check"].get("max_abs", 0.0) + y["check"].get("max_rel", 0.0) * at["range"])
            y["passed"], m["verify"]["default"]["status"] = False, "failed"
        copies.append(tmp_path / f"{i}.json")
        copies[-1].write_text(json.dumps(m))
    page = tmp_path / "report.html"
    report_html.write([str(c) for c in copies], str(page))
    (tmp_path / "over").mkdir()
    shot, dom = render(page, tmp_path / "over")
    state, markup = drawn(dom, "checks-tiny", "check", "SM8750 net/y")
    assert state == "over" and re.search(f'<rect [^>]*fill="{report_html.OVER}"', markup)
    assert ">3 of limit, over</text>" in markup
    assert drawn(dom, "checks-tiny", "check", "SM8550 net/y")[0] == "within"
    assert dom.count('<g class="check within"') == 3 and dom.count('<g class="check over"') == 1
    assert dom.count('<span class="bad">failed</span>') == 1
    (tmp_path / "passing").mkdir()
    passing, _ = render(ref / "build/report.html", tmp_path / "passing")   # the same page, every check within
    bar = (report_html.ROW - 6) * report_html.margin_x(3.0)   # px of the red bar
    assert colour_pixels(shot, report_html.OVER) - colour_pixels(passing, report_html.OVER) > 0.9 * bar
    assert colour_pixels(passing, report_html.WITHIN) > colour_pixels(shot, report_html.WITHIN) > 0
