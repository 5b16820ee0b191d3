"""Steps are forks of a fork server (engine/run/{worker,zygote}.py): a step that crashes or leaks
does not touch the next, a dead server is replaced, the worker mode is checked at load, and
fresh-process steps give the bytes the forks give."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import worker_steps
from conftest import ONE_CHIP, Project, assert_same_outputs, checkout, doit, tool_logs

from toolchain.engine.run import worker, zygote


def _step_task(tmp_path, mode="fork"):
    class Task:   # what worker.run reads of a doit task
        name, file_dep, targets, meta = "test:step", [], [], {"workers": mode}
    return Task()


def test_a_step_that_crashes_or_leaks_does_not_touch_the_next(tmp_path, monkeypatch):
    # where the steps find `worker_steps`
    monkeypatch.chdir(os.path.dirname(worker_steps.__file__))
    task = _step_task(tmp_path)
    crashed = worker.run(worker_steps.segfault, {}, str(tmp_path / "crash.log"), task)
    assert "was killed by SIGSEGV (Segmentation fault" in str(crashed) and "crash.log" in str(
        crashed
    )
    assert (
        worker.run(worker_steps.leak, {"megabytes": 200}, str(tmp_path / "leak.log"), task) is None
    )
    assert (
        worker.run(
            worker_steps.clean,
            {"marker": str(tmp_path / "clean")},
            str(tmp_path / "clean.log"),
            task,
        )
        is None
    ), (tmp_path / "clean.log").read_text()
    pid, preloaded, drawn = (tmp_path / "clean").read_text().split()
    # a fork that found onnx already imported
    assert preloaded == "True" and int(pid) != os.getpid()
    assert (
        worker.run(
            worker_steps.clean,
            {"marker": str(tmp_path / "again")},
            str(tmp_path / "again.log"),
            task,
        )
        is None
    )
    # each fork draws its own random numbers
    assert (tmp_path / "again").read_text().split()[2] != drawn
    servers = {
        line
        for name in ("crash", "leak", "clean")
        for line in (tmp_path / f"{name}.log").read_text().splitlines()
        if "fork server, pid" in line
    }
    assert len(servers) == 1   # one server ran all three: the crash did not take it down
    server_pid = int(servers.pop().rsplit(" ", 1)[1])
    assert any(s.process.pid == server_pid and s.alive() for s in zygote._SERVERS.values())


def test_a_fresh_process_step_says_how_it_was_killed(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(worker_steps.__file__))
    crashed = worker.run(
        worker_steps.segfault, {}, str(tmp_path / "crash.log"), _step_task(tmp_path, "fresh")
    )
    assert "was killed by SIGSEGV (Segmentation fault" in str(crashed)
    assert "fork server" not in (tmp_path / "crash.log").read_text()


def test_a_dead_fork_server_is_replaced_and_the_step_still_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(worker_steps.__file__))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = zygote.server(env)
    first.process.kill()
    first.process.wait()
    assert worker.run(worker_steps.clean, {"marker": str(tmp_path / "m")}, str(tmp_path / "m.log"),
                      _step_task(tmp_path)) is None
    assert zygote.server(env).process.pid != first.process.pid


def test_the_worker_mode_is_checked_at_load(tmp_path):
    project = Project(tmp_path)
    project.add_tiny()
    rc, _, _ = project.run("list", "workers=spawn")
    assert rc == 3
    done = project.doit_cli("list", "workers=spawn")
    assert "workers=spawn: expected fork or fresh" in done.stdout + done.stderr


def test_fresh_process_steps_give_the_same_bytes_as_forks_of_the_server(reference, tmp_path):
    # The reference ran every heavy step as a fork of the fork server (the default; the parallel
    # test above too); here each step is a new interpreter, from scratch and without the cache.
    ref, _ = reference
    fresh = checkout(ref, tmp_path / "fresh")
    executed, _ = doit(fresh, "workers=fresh")
    assert len(executed) == 29
    forked, started = tool_logs(ref), tool_logs(fresh)
    assert forked.keys() == started.keys() and len(forked) >= 12
    # cc: an external tool
    steps = {rel: text for rel, text in forked.items() if not rel.endswith(".modellib.log")}
    assert all("# a fork of the fork server" in text for text in steps.values())
    assert not any("fork server" in text for text in started.values())
    assert_same_outputs(ref, fresh)


def _workers_in(folder: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every process of toolchain.engine.run.worker whose working
    folder is `folder` (the fork server, its waiters and steps, a fresh step): this test's
    own, not a parallel test's."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "toolchain.engine.run.worker" in line and Path(os.readlink(proc / "cwd")) == folder:
                found.append((int(proc.name), line.strip()))
        except OSError:
            continue   # gone meanwhile, or not ours to read
    return found


@pytest.mark.parametrize("workers, kill", [("fork", "doit"), ("fork", "group"), ("fresh", "doit")])
def test_a_killed_build_leaves_no_worker_behind(project, workers, kill):
    """SIGTERM to doit (or to its process group) mid-verify: the fork server, its waiters and the
    running step (or the fresh step) end with it; none is left reparented to pid 1."""
    project.add_tiny(**ONE_CHIP)
    # a verify of seconds
    project.edit("models/tinynet.py", "for _ in range(3)]}", "for _ in range(2000)]}")
    root = project.root.resolve()
    said = root / "doit.out"   # the console reporter names each task as it starts
    with open(said, "w") as out:
        build = subprocess.Popen(
            [sys.executable, "-m", "doit", f"workers={workers}"],
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "QNN_JOBS": "1", "CI": "1", "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + 600
    while not (".  verify:tiny@SM8750" in said.read_text()
               # server, waiter, step
               and len(_workers_in(root)) >= (3 if workers == "fork" else 1)):
        assert build.poll() is None and time.monotonic() < deadline, (
            "the build ended before verify ran"
        )
        time.sleep(0.01)
    running = _workers_in(root)
    (os.killpg if kill == "group" else os.kill)(build.pid, signal.SIGTERM)
    assert build.wait(timeout=60) != 0
    # a SIGTERM ends a step at once; the verify left alone would run for seconds
    deadline = time.monotonic() + 2
    while _workers_in(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_in(root) == [], (
        f"survived: {_workers_in(root)} (running when killed: {running})"
    )


def test_loading_the_tasks_reads_each_packages_metadata_once(project, monkeypatch):
    """Every task's settings name tool versions: read once per process (engine/versions.py), not per
    task (a no-op `doit` of the shipped project made 444 reads, a third of its time)."""
    import importlib.metadata as metadata

    from toolchain import options, pipeline
    from toolchain import project as projects
    from toolchain.engine import versions
    project.add_tiny("one")
    project.add_tiny("two", seed=1)
    reads = []
    real = metadata.distribution
    monkeypatch.setattr(metadata, "distribution", lambda name: reads.append(name) or real(name))
    versions.version.cache_clear()
    versions.folder.cache_clear()
    monkeypatch.chdir(project.root)
    loaded = projects.load("models", options.resolve_given({}, {}))
    for create in pipeline.task_creators(loaded).values():
        list(create())
    # each distribution's version once (and one folder, the wheel's libraries), whatever the
    # number of tasks
    assert reads and len(reads) <= len(set(reads)) + 1 and len(set(reads)) <= 8, sorted(reads)


# what the steps run, imported inside them
HEAVY = ("numpy", "onnx", "onnxruntime", "torch", "onnxsim")


def test_loading_the_tasks_imports_no_heavy_package(project):
    """A no-op `doit` loads the dodo and creates every task in doit's own process: none of the
    packages the steps run may be imported then (numpy alone was 0.12 s of a no-op;
    bench/noop.py times it)."""
    project.add_tiny("one")
    code = (
        "import sys; from doit.doit_cmd import DoitMain; rc = DoitMain().run(['list', '--all', "
        "'-q']); "
        f"print('heavy:', sorted(set(sys.modules) & {set(HEAVY)!r})); sys.exit(rc)"
    )
    # this checkout's toolchain, whatever is installed
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=project.root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "export:one" in done.stdout   # the tasks were created
    assert done.stdout.splitlines()[-1] == "heavy: []"
