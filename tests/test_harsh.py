"""The build under harsh use: bad input refused at load in one line naming file and field; failures in the
user's own code named by file and line; damaged outputs rebuilt, not trusted; inputs swapped with their
mtime kept detected; one build per folder; environment faults in words; umask modes; no temp files left."""
from __future__ import annotations

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

from toolchain.engine import buildlock, cache, files, statedb

# ---- refused at load time: one ERROR line naming the file and the field, exit 3, no traceback ----

BAD_SPECS = [
    ({"max_abs = 1e-4": "max_abs = nan"}, "tiny.toml: parity.max_abs: expected a finite number >= 0"),
    ({"max_rel = 0.02": "max_rel = inf"}, "tiny.toml: verify.max_rel: expected a finite number >= 0"),
    ({"max_rel = 0.02": "max_rel = -0.1"}, "tiny.toml: verify.max_rel: expected a finite number >= 0"),
    ({"max_rel = 0.02": "max_rel = true"}, "tiny.toml: verify.max_rel: expected int or float, got True"),
    ({"opset = 17": "opset = 99"}, "tiny.toml: export.opset: 99 is outside the opsets torch exports (7-23)"),
    ({"opset = 17": "opset = 5"}, "tiny.toml: export.opset: 5 is outside"),
    ({"shape = [1, 4, 16]": "shape = [1, 3, 100000, 100000]"},
     "tiny.toml: graphs.net.inputs.x.shape: [1, 3, 100000, 100000] float32 is a tensor of 111.8 GiB"),
    ({"max_rel = 0.02": 'max_rel = 0.02\nclips = ["a"]'}, "tiny.toml: verify.clips: names samples, but the model has no"),
    ({'chips = ["SM8550", "SM8750"]': 'chips = [["SM8550"]]'}, "tiny.toml: chips: expected chip ids (strings)"),
    ({'chips = ["SM8550", "SM8750"]': 'chips = [{ a = 1 }]'}, "tiny.toml: chips: expected chip ids (strings)"),
]


@pytest.mark.parametrize("replace, message", BAD_SPECS, ids=[m.split(": ")[1] + "-" + str(i) for i, (_, m) in
                                                             enumerate(BAD_SPECS)])
def test_a_bad_value_is_one_error_line_naming_file_and_field(project, replace, message):
    project.add_tiny(**replace)
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and "Traceback" not in cli.stderr, cli.stderr
    assert cli.stderr.startswith("ERROR: ") and message in cli.stderr, cli.stderr


def test_a_toml_that_is_not_utf8_names_the_byte_and_line(project):
    spec = project.add_tiny()
    spec.write_bytes(spec.read_bytes().replace(b'name = "Apache-2.0"', b'name = "Apache-2.0 \xff"'))
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and "Traceback" not in cli.stderr
    assert "tiny.toml: not UTF-8 text: byte 0xff at offset" in cli.stderr and "(line 6)" in cli.stderr


def test_editor_and_os_droppings_in_models_are_skipped_and_said(project):
    project.add_tiny()
    models = project.root / "models"
    (models / "._tiny.toml").write_bytes(b"\x00\x05\x16\x07 macOS AppleDouble\xff")
    os.symlink("root@host.1234:1700000000", models / ".#tiny.toml")   # an Emacs lock: a dangling link
    (models / "tiny.toml~").write_text("description = 'a backup'\n")
    cli = project.doit_cli("list")
    assert cli.returncode == 0, cli.stderr
    assert "models/._tiny.toml: skipped" in cli.stderr and "models/.#tiny.toml: skipped" in cli.stderr
    assert "export" in cli.stdout


# ---- failures in the user's own code: their file and line, one line, the traceback in the log ----

def test_a_model_module_that_does_not_import_is_named_by_file_and_line(project):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    code.write_text(code.read_text() + "\n\nraise RuntimeError('no weights here')\n")
    lines = code.read_text().count("\n")
    rc, _, text = project.run("export")
    assert rc == 1 and "Traceback" not in text, text
    assert f"models/tinynet.py:{lines} (in <module>): RuntimeError: no weights here" in text
    assert "full traceback: build/tiny/checkpoint/model.pt.log" in text   # the first step that imports it
    assert "Traceback" in (project.root / "build/tiny/checkpoint/model.pt.log").read_text()


def test_a_syntax_error_in_the_model_module_is_its_file_and_line(project):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    code.write_text("def export(:\n" + code.read_text())
    rc, _, text = project.run("export")
    assert rc == 1 and "models/tinynet.py:1: SyntaxError" in text and "Traceback" not in text, text


def test_a_module_without_export_or_writing_nothing_says_so(project):
    project.add_tiny()
    code = project.root / "models/tinynet.py"
    original = code.read_text()
    code.write_text(original.replace("def export(", "def export_renamed("))
    rc, _, text = project.run("export")
    assert rc == 1 and "models/tinynet.py: no export(checkpoint, graph, out, settings) function" in text, text
    code.write_text(original + "\n\ndef export(checkpoint, graph, out, settings):\n    open(out, 'wb').close()\n")
    rc, _, text = project.run("export")
    assert rc == 1 and "export() of graph 'net' wrote nothing to `out`" in text, text


def test_a_command_that_is_not_installed_or_writes_no_onnx_is_one_line(project):
    project.add_tiny(**{'[graphs.net]\n': '[graphs.net]\nsource = { command = ["no-such-exporter", "{out}"] }\n',
                        "max_abs = 1e-4": 'reference = "none"'})
    rc, _, text = project.run("export")
    assert rc == 1 and "export command 'no-such-exporter' cannot start (No such file or directory)" in text, text
    project.edit("models/tiny.toml", '["no-such-exporter", "{out}"]', '["sh", "-c", "echo not onnx > {out}"]')
    rc, _, text = project.run("export")
    assert rc == 1 and "wrote not an ONNX model" in text and "Traceback" not in text, text


# ---- outputs are part of the state: damage is rebuilt, not trusted ----

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
    assert sha256(project.root / "build" / target) == state[target] or target.endswith(("verify.json",))
    assert project.run()[1] == []   # and then it is trusted again


def test_a_truncated_record_is_rebuilt_not_a_traceback(copy):
    project, state = copy
    record = project.root / "build/tiny/ort-qnn/SM8550/net.compile.json"
    record.write_text(record.read_text()[:40])
    rc, executed, text = project.run()
    assert rc == 0 and "compile:tiny/net@SM8550" in executed and "Traceback" not in text, text
    assert json.loads(record.read_text())["sha256"] == json.loads((project.root / "build/tiny/ort-qnn/SM8550/"
                                                                    "net.compile.json").read_text())["sha256"]


def test_damage_that_kept_size_and_mtime_is_found_by_its_ctime(copy):
    project, state = copy
    onnx_file = project.root / "build/tiny/net/net.onnx"
    damage(onnx_file, keep_mtime=True)
    rc, executed, text = project.run()   # size and mtime kept, but the ctime moved: read, found, rebuilt
    assert rc == 0 and "simplify:tiny/net" in executed, text
    assert sha256(onnx_file) == state["tiny/net/net.onnx"]
    assert not [t for t in executed if t.startswith("compile:")], executed   # the clean bytes: nothing after it
    assert project.run()[1] == []


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


# ---- one build per folder ----

def test_a_second_doit_in_the_same_folder_stops_naming_the_first(copy):
    project, _ = copy
    cwd = os.getcwd()
    os.chdir(project.root)
    try:
        assert buildlock.hold(["doit"])
        cli = project.doit_cli("export")
        assert cli.returncode == 3 and "another doit is building in this folder (pid " in cli.stderr, cli.stderr
        assert project.doit_cli("list").returncode == 0   # reading never waits
    finally:
        buildlock.release()
        os.chdir(cwd)
    assert project.doit_cli().returncode == 0   # the lock died with its holder


# ---- environment faults in words, modes, temp files ----

@pytest.mark.parametrize("error, words", [
    ("attempt to write a readonly database", "read-only; make it writable (chmod u+w) and run again. The state DB is intact"),
    ("database or disk is full", "the disk is full"),
    ("database is locked", "locked by another process"),
])
def test_a_state_db_fault_says_what_to_do(tmp_path, error, words):
    message = statedb.explain(str(tmp_path / ".doit.db"), sqlite3.OperationalError(error))
    assert words in message and "remove it" not in message


def test_outputs_and_cache_blobs_get_the_umasks_mode(tmp_path, monkeypatch):
    files.write_json(tmp_path / "a.json", {"x": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == files.MODE
    assert files.MODE & 0o044   # readable by others under the usual 022 umask, unlike mkstemp's 0600
    (tmp_path / "out.bin").write_bytes(b"data")
    monkeypatch.chdir(tmp_path)
    store = cache.Store(tmp_path / "cache")
    store.save("k", {"task": "t"}, ["out.bin"])
    blob = store.blob(files.sha256("out.bin"))
    assert stat.S_IMODE(os.stat(blob).st_mode) == files.MODE


def test_a_cache_entry_that_fails_verification_is_evicted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.bin").write_bytes(b"data")
    store = cache.Store(tmp_path / "cache")
    store.save("k", {"task": "t"}, ["out.bin"])
    store.blob(files.sha256("out.bin")).write_bytes(b"poisoned")
    assert store.restore("k", ["out.bin"]) is False
    assert not store.entry("k").exists()   # never offered again


def test_strict_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        files.write_json(tmp_path / "x.json", {"max_abs": float("nan")})


def test_temp_files_of_killed_steps_are_swept(copy):
    project, _ = copy
    left = [project.root / "build/tiny/net/.export.log.abc123.tmp", project.root / "build/tiny/.tmp-xyz/a"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    assert project.run()[0] == 0
    assert not any(p.exists() for p in left) and not (project.root / "build/tiny/.tmp-xyz").exists()


def test_ctrl_c_is_one_line_and_the_build_resumes(project):
    project.add_tiny()
    proc = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (project.root / "build/tiny/net").exists() and time.monotonic() < deadline:
        time.sleep(0.1)   # export has started: checkpoint is finished and committed
    os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "SIGINT: stopped; finished tasks are kept" in err
    cli = project.doit_cli()
    assert cli.returncode == 0 and "-- checkpoint:tiny" in cli.stdout, cli.stdout + cli.stderr


def test_tensor_names_with_a_slash_or_space_make_plain_calibration_file_names():
    from toolchain.engine import paths
    assert paths.calibration_raw_name(3, "encoder/x 0") == "0003-encoder_x_0.raw"
    assert paths.calibration_raw_name(0, "input_ids") == "0000-input_ids.raw"   # unchanged for plain names
