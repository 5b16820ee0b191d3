"""Steps are forks of a fork server (toolchain/engine/{worker,zygote}.py): a step that crashes or leaks does not touch
the next, a dead server is replaced, the worker mode is checked at load, and fresh-process steps give the bytes
the forks give."""
from __future__ import annotations

import os

import worker_steps
from conftest import Project, assert_same_outputs, checkout, doit, tool_logs

from toolchain.engine import worker, zygote


def _step_task(tmp_path, mode="fork"):
    class Task:   # what worker.run reads of a doit task
        name, file_dep, targets, meta = "test:step", [], [], {"workers": mode}
    return Task()


def test_a_step_that_crashes_or_leaks_does_not_touch_the_next(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(worker_steps.__file__))   # where the steps find `worker_steps`
    task = _step_task(tmp_path)
    crashed = worker.run(worker_steps.segfault, {}, str(tmp_path / "crash.log"), task)
    assert "was killed by SIGSEGV (Segmentation fault" in str(crashed) and "crash.log" in str(crashed)
    assert worker.run(worker_steps.leak, {"megabytes": 200}, str(tmp_path / "leak.log"), task) is None
    assert worker.run(worker_steps.clean, {"marker": str(tmp_path / "clean")}, str(tmp_path / "clean.log"),
                      task) is None, (tmp_path / "clean.log").read_text()
    pid, preloaded, drawn = (tmp_path / "clean").read_text().split()
    assert preloaded == "True" and int(pid) != os.getpid()   # a fork that found onnx already imported
    assert worker.run(worker_steps.clean, {"marker": str(tmp_path / "again")}, str(tmp_path / "again.log"),
                      task) is None
    assert (tmp_path / "again").read_text().split()[2] != drawn   # each fork draws its own random numbers
    servers = {line for name in ("crash", "leak", "clean")
               for line in (tmp_path / f"{name}.log").read_text().splitlines() if "fork server, pid" in line}
    assert len(servers) == 1   # one server ran all three: the crash did not take it down
    server_pid = int(servers.pop().rsplit(" ", 1)[1])
    assert any(s.process.pid == server_pid and s.alive() for s in zygote._SERVERS.values())


def test_a_fresh_process_step_says_how_it_was_killed(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(worker_steps.__file__))
    crashed = worker.run(worker_steps.segfault, {}, str(tmp_path / "crash.log"), _step_task(tmp_path, "fresh"))
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
