"""Fast by default: the measured hot spots removed (config string from the header, external data without a
parse, each input hashed once), parallel out of the box with slots sized per stage, progress with an ETA."""
from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest
import worker_steps
from conftest import Project
from onnx import TensorProto, helper, numpy_helper

from toolchain import pipeline
from toolchain.backends.ort_qnn import ep
from toolchain.engine import files, limits, worker, zygote
from toolchain.qnn import qnnbin


def test_the_config_string_is_read_from_the_header_and_found_anywhere(tmp_path):
    config = b"\x00soc_type=69;arch=79;vtcm_size=8388608;relaxed_precision_flag=true;\x00"
    head = tmp_path / "head.bin"
    head.write_bytes(b"\x01" * 30000 + config + os.urandom(3 << 20))
    found = qnnbin.config_fields(str(head))   # (random bytes after it may look like more key=value; pairs)
    assert {k: found[k] for k in ("soc_type", "arch", "vtcm_size", "relaxed_precision_flag")} == {
        "soc_type": 69, "arch": 79, "vtcm_size": 8388608, "relaxed_precision_flag": True}
    late = tmp_path / "late.bin"   # not in the header: the whole file is searched, as before
    late.write_bytes(b"\x01" * (qnnbin.HEAD + 10) + config)
    assert qnnbin.config_fields(str(late))["arch"] == 79
    (tmp_path / "none.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(ValueError, match="no HTP config string"):
        qnnbin.config_fields(str(tmp_path / "none.bin"))


def test_external_data_is_answered_without_a_parse_and_still_right(tmp_path, monkeypatch):
    weights = numpy_helper.from_array(__import__("numpy").ones((64, 64), "float32"), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weights])
    model = helper.make_model(graph)
    onnx.save(model, tmp_path / "inline.onnx")
    onnx.save(model, tmp_path / "external.onnx", save_as_external_data=True, location="external.data",
              size_threshold=0)
    parsed = []
    real_load = onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **k: parsed.append(a[0]) or real_load(*a, **k))
    assert ep._has_external_data(str(tmp_path / "inline.onnx")) is False and parsed == []   # no parse
    assert ep._has_external_data(str(tmp_path / "external.onnx")) is True


def test_an_input_is_hashed_once_until_its_size_or_mtime_changes(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"a" * 100)
    calls = []
    real = files.sha256
    monkeypatch.setattr(files, "sha256", lambda p: calls.append(p) or real(p))
    first = files.sha256_memo(path)
    assert files.sha256_memo(path) == first and len(calls) == 1   # memo
    st = os.stat(path)
    path.write_bytes(b"b" * 100)                                  # same size, new mtime: hashed again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert files.sha256_memo(path) != first and len(calls) == 2
    path.write_bytes(b"b" * 101)                                  # other size: hashed again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert files.sha256_memo(path) == real(path) and len(calls) == 3


def test_slots_follow_the_cores_the_simulators_threads_and_the_memory():
    assert pipeline.default_slots(2, 24) == {"verify": 1, "verify_full": 1, "diagnose": 1, "sherpa": 1, "sherpa_full": 1}
    eight = pipeline.default_slots(8, 24)
    assert eight["verify"] == 4 and "compile" not in eight   # compiles (0.9 GB peak) fit 8 at once in 24 GB
    assert pipeline.default_slots(8, 4)["compile"] == 3      # 4 GB: three 1-GB compiles, not eight
    assert limits.slots_for(1, 0.5, 1, 24) == 0              # serial: nothing to limit


def test_doit_is_parallel_by_default_with_the_cores_it_has(monkeypatch):
    monkeypatch.delenv(limits.JOBS_ENV, raising=False)
    assert limits.jobs() == os.cpu_count()
    monkeypatch.setenv(limits.JOBS_ENV, "3")
    assert limits.jobs() == 3


def test_progress_shows_n_of_n_durations_and_an_eta_from_the_last_build(tmp_path):
    project = Project(tmp_path / "proj")
    project.add_tiny()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", limits.JOBS_ENV)}

    def doit(*args):
        done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    first = doit()
    total = sum(1 for line in first.splitlines() if line.startswith(".  "))
    assert f"   [1/{total}] " in first and f"   [{total}/{total}] report " in first
    assert "ETA unknown" in first and "| tiny | SM8550 |" in first   # first build: no durations yet; table stays
    doit("clean")
    second = doit()
    assert "ETA ~" in second and "ETA unknown" not in second
    quiet = subprocess.run([sys.executable, "-m", "doit", "clean"], cwd=project.root, env={**env, "CI": "true"},
                           capture_output=True, text=True)
    assert quiet.returncode == 0
    ci = subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env={**env, "CI": "true"},
                        capture_output=True, text=True, timeout=600)
    assert ci.returncode == 0 and "ETA" not in ci.stdout and ".  export:tiny/net" in ci.stdout


# ---- steps are forks of a fork server (zygote.py) ----------------------------------------------------------

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
    assert worker.run(worker_steps.clean, {"marker": str(tmp_path / "again")}, str(tmp_path / "again.log"), task) is None
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


def test_doits_md5_of_a_dependency_is_taken_once_per_run_until_it_changes(tmp_path, monkeypatch):
    from toolchain.engine import checker
    path = tmp_path / "libQnnHtp.so"
    path.write_bytes(b"x" * 1000)
    calls = []
    real = checker.get_file_md5
    monkeypatch.setattr(checker, "get_file_md5", lambda p: calls.append(p) or real(p))
    monkeypatch.setattr(checker, "_MEMO", {})
    first = checker.md5(path, os.stat(path))
    assert checker.md5(path, os.stat(path)) == first and len(calls) == 1    # a second task: no re-read
    path.write_bytes(b"y" * 1000)                                           # same size, new mtime
    assert checker.md5(path, os.stat(path)) != first and len(calls) == 2
    st = os.stat(path)
    path.write_bytes(b"z" * 1000)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))                     # size and mtime kept
    assert checker.md5(path, os.stat(path), fresh=True) == real(path)       # rehash=1 reads the bytes


def test_an_edit_that_keeps_size_and_mtime_is_seen_by_its_ctime(tmp_path, monkeypatch):
    """The state says (mtime, size, md5); the stamp memo adds ctime and inode: `cp -p`-style edits rerun the
    task without rehash=1, an untouched file is not read, and a build made before reads each file once."""
    from toolchain.engine import checker, stamps
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checker, "_MEMO", {})
    monkeypatch.setattr(stamps, "_stores", {})
    calls = []
    real = checker.get_file_md5
    monkeypatch.setattr(checker, "get_file_md5", lambda p: calls.append(p) or real(p))
    path = tmp_path / "model.onnx"
    path.write_bytes(b"a" * 100)
    check = checker.MD5Checker()
    state = check.get_state(str(path), None)
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == 1   # not read again
    st = os.stat(path)
    path.write_bytes(b"b" * 100)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))                                    # size and mtime kept
    assert os.stat(path).st_mtime == state[0] and os.stat(path).st_size == state[1]
    assert check.check_modified(str(path), os.stat(path), state)                           # the ctime moved
    state = check.get_state(str(path), state)                                              # the task reran
    assert state[2] == real(str(path)) and not check.check_modified(str(path), os.stat(path), state)
    monkeypatch.setattr(stamps, "_stores", {})   # a state made before the stamps: read once, not rebuilt
    monkeypatch.setattr(checker, "_MEMO", {})
    before = len(calls)
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1
    (tmp_path / "build").mkdir()
    stamps.save()   # what the state DB's close does: the next run trusts the file unread
    monkeypatch.setattr(stamps, "_stores", {})
    monkeypatch.setattr(checker, "_MEMO", {})
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1
