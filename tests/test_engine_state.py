"""What the engine trusts (toolchain/engine/: outputs, stamps, checker, files, statedb, buildlock):
outputs are part of the state, so damage is rebuilt, not trusted; content decides, not mtimes; each
input is read once; one build per folder; a killed or interrupted build resumes; environment faults
in words; umask modes; no temp files left."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time

import pytest
from conftest import Project, sha256

from toolchain.engine import cache, files
from toolchain.engine.run import buildlock
from toolchain.engine.state import statedb


def damage(path, keep_mtime: bool = False):
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The tiny model built once; each test works on a copy."""
    p = Project(tmp_path_factory.mktemp("harsh") / "proj")
    p.add_tiny()
    rc, _, text = p.run()
    assert rc == 0, text
    return p


@pytest.fixture
def copy(clean, tmp_path):
    shutil.copytree(clean.root, tmp_path / "proj", symlinks=True, copy_function=shutil.copy2)
    return Project(tmp_path / "proj"), clean.build_state()


@pytest.mark.parametrize("target, task", [
    ("tiny/checkpoint/model.pt", "checkpoint:tiny"),
    ("tiny/net/export.onnx", "export:tiny/net"),
    ("tiny/net/net.onnx", "simplify:tiny/net"),
    ("tiny/ort-qnn/SM8750/net.onnx", "compile:tiny/net@SM8750"),
    ("tiny/ort-qnn/SM8750/net_qnn.bin", "compile:tiny/net@SM8750"),
    ("tiny/ort-qnn/SM8750/verify.json", "verify:tiny@SM8750"),
    ("tiny/ort-qnn/SM8750/manifest.json", "manifest:tiny@SM8750"),
])
def test_a_damaged_output_is_rebuilt_to_the_clean_bytes(copy, target, task):
    project, state = copy
    damage(project.root / "build" / target)
    rc, executed, text = project.run()
    assert rc == 0 and task in executed, text
    assert sha256(project.root / "build" / target) == state[target] or target.endswith(
        ("verify.json",)
    )
    assert project.run()[1] == []   # and then it is trusted again


def test_a_truncated_record_is_rebuilt_not_a_traceback(copy):
    project, state = copy
    record = project.root / "build/tiny/ort-qnn/SM8550/net.compile.json"
    record.write_text(record.read_text()[:40])
    rc, executed, text = project.run()
    assert rc == 0 and "compile:tiny/net@SM8550" in executed and "Traceback" not in text, text
    assert (
        json.loads(record.read_text())["sha256"]
        == json.loads((project.root / "build/tiny/ort-qnn/SM8550/net.compile.json").read_text())[
            "sha256"
        ]
    )


def test_damage_that_kept_size_and_mtime_is_found_by_its_ctime(copy):
    project, state = copy
    onnx_file = project.root / "build/tiny/net/net.onnx"
    damage(onnx_file, keep_mtime=True)
    # size and mtime kept, but the ctime moved: read, found, rebuilt
    rc, executed, text = project.run()
    assert rc == 0 and "simplify:tiny/net" in executed, text
    assert sha256(onnx_file) == state["tiny/net/net.onnx"]
    # the clean bytes: nothing after it
    assert not [t for t in executed if t.startswith("compile:")], executed
    assert project.run()[1] == []


def test_a_corrupted_binary_is_rebuilt_before_it_is_verified(project):
    project.add_tiny("tiny")
    rc, _, text = project.run("compile:tiny/net@SM8750")
    assert rc == 0, text
    binary = project.root / "build/tiny/ort-qnn/SM8750/net_qnn.bin"
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF   # weight bytes: the runtime would load it and answer wrongly
    binary.write_bytes(bytes(data))
    clean = json.loads((project.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())[
        "sha256"
    ]
    rc, executed, text = project.run("verify:tiny@SM8750")
    # a target that changed: its task reruns
    assert rc == 0 and "compile:tiny/net@SM8750" in executed, text
    assert hashlib.sha256(binary.read_bytes()).hexdigest() == clean     # the same bytes as compiled


# ---- content decides: inputs swapped with their mtime kept ----

def test_an_input_changed_with_its_mtime_kept_is_seen(copy):
    project, _ = copy
    code = project.root / "models/tinynet.py"
    st = os.stat(code)
    code.write_text(code.read_text() + "\n# a longer file, same mtime (cp -p, rsync -a, tar x)\n")
    os.utime(code, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, executed, text = project.run("export")
    assert rc == 0 and "export:tiny/net" in executed, text
    # same size and mtime: the ctime the edit moved says "read it" (no rehash=1 needed)
    text_now = code.read_text()
    st = os.stat(code)
    code.write_text(text_now.replace("a longer file", "a LONGER file"))
    os.utime(code, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(code).st_size == st.st_size and os.stat(code).st_mtime_ns == st.st_mtime_ns
    rc, executed, _ = project.run("export")
    assert rc == 0 and "export:tiny/net" in executed
    assert "export:tiny/net" not in project.run("export")[1]   # then trusted again


def test_an_input_is_hashed_once_until_its_size_or_mtime_changes(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"a" * 100)
    calls = []
    real = files.sha256
    monkeypatch.setattr(files, "sha256", lambda p: calls.append(p) or real(p))
    first = files.sha256_memo(path)
    assert files.sha256_memo(path) == first and len(calls) == 1   # memo
    st = os.stat(path)
    # same size, new mtime: hashed again
    path.write_bytes(b"b" * 100)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert files.sha256_memo(path) != first and len(calls) == 2
    path.write_bytes(b"b" * 101)                                  # other size: hashed again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert files.sha256_memo(path) == real(path) and len(calls) == 3


def test_doits_md5_of_a_dependency_is_taken_once_per_run_until_it_changes(tmp_path, monkeypatch):
    from toolchain.engine.state import checker
    path = tmp_path / "libQnnHtp.so"
    path.write_bytes(b"x" * 1000)
    calls = []
    real = checker.get_file_md5
    monkeypatch.setattr(checker, "get_file_md5", lambda p: calls.append(p) or real(p))
    monkeypatch.setattr(checker, "_MEMO", {})
    first = checker.md5(path, os.stat(path))
    # a second task: no re-read
    assert checker.md5(path, os.stat(path)) == first and len(calls) == 1
    path.write_bytes(b"y" * 1000)                                           # same size, new mtime
    assert checker.md5(path, os.stat(path)) != first and len(calls) == 2
    st = os.stat(path)
    path.write_bytes(b"z" * 1000)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))                     # size and mtime kept
    # rehash=1 reads the bytes
    assert checker.md5(path, os.stat(path), fresh=True) == real(path)


def test_an_edit_that_keeps_size_and_mtime_is_seen_by_its_ctime(tmp_path, monkeypatch):
    """The state says (mtime, size, md5); the stamp memo adds ctime and inode: `cp -p`-style edits
    rerun the task without rehash=1, an untouched file is not read, and a build made before reads
    each file once."""
    from toolchain.engine.state import checker, stamps
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
    # not read again
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == 1
    st = os.stat(path)
    path.write_bytes(b"b" * 100)
    # size and mtime kept
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime == state[0] and os.stat(path).st_size == state[1]
    # the ctime moved
    assert check.check_modified(str(path), os.stat(path), state)
    # the task reran
    state = check.get_state(str(path), state)
    assert state[2] == real(str(path)) and not check.check_modified(str(path), os.stat(path), state)
    # a state made before the stamps: read once, not rebuilt
    monkeypatch.setattr(stamps, "_stores", {})
    monkeypatch.setattr(checker, "_MEMO", {})
    before = len(calls)
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1
    (tmp_path / "build").mkdir()
    stamps.save()   # what the state DB's close does: the next run trusts the file unread
    monkeypatch.setattr(stamps, "_stores", {})
    monkeypatch.setattr(checker, "_MEMO", {})
    assert not check.check_modified(str(path), os.stat(path), state) and len(calls) == before + 1


def test_the_compiler_is_asked_its_version_again_only_when_its_file_changed(tmp_path, monkeypatch):
    """modellib's settings name the C compiler by `cc --version`: asked once, then recalled by the
    binary's stamp from build/.stamps.json in later runs; a new compiler file (an upgrade: new
    inode, ctime) is asked again."""
    from toolchain.compilers.ort_qnn import modellib
    from toolchain.engine.state import stamps
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build").mkdir()
    monkeypatch.setattr(stamps, "_stores", {})
    asked = tmp_path / "asked"
    cc = tmp_path / "cc"

    def install(version: str) -> None:
        fresh = tmp_path / "cc.new"
        fresh.write_text(f"#!/bin/sh\necho x >> {asked}\necho '{version}'\n")
        fresh.chmod(0o755)
        os.replace(fresh, cc)

    # a later doit: the in-process cache is gone, the stamps file is read again
    def new_run() -> str:
        stamps.save()
        monkeypatch.setattr(stamps, "_stores", {})
        modellib.compiler_identity.cache_clear()
        return modellib.compiler_identity(str(cc))

    install("cc (Test) 1.0")
    assert new_run() == "cc (Test) 1.0" and new_run() == "cc (Test) 1.0"
    assert asked.read_text().count("x") == 1
    install("cc (Test) 2.0")
    assert new_run() == "cc (Test) 2.0" and asked.read_text().count("x") == 2
    modellib.compiler_identity.cache_clear()


# ---- one build per folder, interrupted builds ----

def test_a_second_doit_in_the_same_folder_stops_naming_the_first(copy):
    project, _ = copy
    cwd = os.getcwd()
    os.chdir(project.root)
    try:
        assert buildlock.hold(["doit"])
        cli = project.doit_cli("export")
        assert (
            cli.returncode == 3 and "another doit is building in this folder (pid " in cli.stderr
        ), cli.stderr
        assert project.doit_cli("list").returncode == 0   # reading never waits
    finally:
        buildlock.release()
        os.chdir(cwd)
    assert project.doit_cli().returncode == 0   # the lock died with its holder


def test_killed_build_resumes_and_never_trusts_half_written_files(project):
    project.add_tiny("tiny")
    proc = subprocess.Popen(
        [sys.executable, "-m", "doit"],
        cwd=project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marker = project.root / "build/tiny/ort-qnn/SM8550/net.compile.json"
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker.exists(), "the build ended before it could be killed"
    rc, executed, text = project.run()
    assert rc == 0, text
    # Finished tasks were committed to the state DB at once, so they do not run again.
    assert not {"checkpoint:tiny", "export:tiny/net", "simplify:tiny/net"} & set(executed)
    assert "report" in executed
    rc, executed, _ = project.run()
    assert rc == 0 and executed == []


def test_ctrl_c_is_one_line_and_the_build_resumes(project):
    project.add_tiny()
    proc = subprocess.Popen(
        [sys.executable, "-m", "doit"],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (project.root / "build/tiny/net").exists() and time.monotonic() < deadline:
        time.sleep(0.1)   # export has started: checkpoint is finished and committed
    os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "SIGINT: stopped; finished tasks are kept" in err
    cli = project.doit_cli()
    assert cli.returncode == 0 and "1 up to date, 0 failed" in cli.stdout, cli.stdout + cli.stderr


def test_temp_files_of_killed_steps_are_swept(copy):
    project, _ = copy
    left = [
        project.root / "build/tiny/net/.export.log.abc123.tmp",
        project.root / "build/tiny/.tmp-xyz/a",
    ]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    assert project.run()[0] == 0
    assert not any(p.exists() for p in left) and not (project.root / "build/tiny/.tmp-xyz").exists()


# ---- environment faults in words, modes ----

@pytest.mark.parametrize("error, words", [
    ("attempt to write a readonly database",
     "read-only; make it writable (chmod u+w) and run again. The state DB is intact"),
    ("database or disk is full", "the disk is full"),
    ("database is locked", "locked by another process"),
])
def test_a_state_db_fault_says_what_to_do(tmp_path, error, words):
    message = statedb.explain(str(tmp_path / ".doit.db"), sqlite3.OperationalError(error))
    assert words in message and "remove it" not in message


def test_outputs_and_cache_blobs_get_the_umasks_mode(tmp_path, monkeypatch):
    files.write_json(tmp_path / "a.json", {"x": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == files.MODE
    # readable by others under the usual 022 umask, unlike mkstemp's 0600
    assert files.MODE & 0o044
    (tmp_path / "out.bin").write_bytes(b"data")
    monkeypatch.chdir(tmp_path)
    store = cache.Store(tmp_path / "cache")
    store.save("k", {"task": "t"}, ["out.bin"])
    blob = store.blob(files.sha256("out.bin"))
    assert stat.S_IMODE(os.stat(blob).st_mode) == files.MODE


def test_strict_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        files.write_json(tmp_path / "x.json", {"max_abs": float("nan")})


def test_a_tasks_settings_come_from_its_step_arguments_without_defaults():
    """engine/state/settings.py: the named arguments plus extras, a value equal to its declared
    default left out (so a setting added with a default changes no older task's settings), a key the
    step lacks skipped."""
    from toolchain.engine.state.settings import task_settings
    kwargs = {"out": "x.bin", "chip": {"name": "SM8750"}, "precision": "fp16"}
    assert task_settings(kwargs, ("chip", "precision", "family"), tool={"v": 1}) == {
        "chip": {"name": "SM8750"}, "precision": "fp16", "tool": {"v": 1}}
    assert task_settings(kwargs, ("chip",), {"route": "ep"}, route="ep") == {
        "chip": {"name": "SM8750"}
    }
    assert task_settings(kwargs, ("chip",), {"route": "ep"}, route="saver")["route"] == "saver"
    assert task_settings({"rewrite": ()}, ("rewrite",), {"rewrite": ()}) == {}
