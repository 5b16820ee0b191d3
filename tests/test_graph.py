"""Incremental behaviour of the real dodo.py on two small real models (through the real pipeline)."""
import json
import os
import signal
import subprocess
import sys
import time

from toolchain.backends.ort_qnn import ep as ort_qnn

CHAIN = ["checkpoint:{m}", "export:{m}/net", "simplify:{m}/net", "inspect:{m}/net", "parity:{m}",
         "compile:{m}/net@SM8550", "compile:{m}/net@SM8750", "verify:{m}@SM8550", "verify:{m}@SM8750",
         "manifest:{m}@SM8550", "manifest:{m}@SM8750"]


def chain(model):
    return [t.format(m=model) for t in CHAIN]


def test_first_build_runs_every_stage_and_records_manifests(built):
    manifest = json.loads((built.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["chip"]["soc_model"] == 69 and manifest["htp_arch"] == "v79"
    assert manifest["binaries"]["net"]["config"]["soc_type"] == "SM8750"
    assert manifest["binaries"]["net"]["config"]["relaxed_precision_flag"] is True
    assert manifest["sdk"]["build_id"].startswith("v2.")
    assert manifest["license"]["name"] == "Apache-2.0"
    binary = built.root / manifest["binaries"]["net"]["file"]
    assert manifest["binaries"]["net"]["sha256"] == __import__("hashlib").sha256(binary.read_bytes()).hexdigest()
    assert manifest["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.02
    assert manifest["parity"]["tensors"]["net"]["max_abs"] < 1e-4
    assert "| tiny2 | SM8550 |" in (built.root / "build/report.md").read_text()


def test_second_run_executes_nothing(built):
    rc, executed, _ = built.run()
    assert rc == 0 and executed == []


def test_touch_without_change_rebuilds_nothing(built):
    for rel in ("models/tiny.toml", "models/tinynet.py", "models/tiny.pt", "build/tiny/net/net.onnx"):
        os.utime(built.root / rel, (time.time() + 5, time.time() + 5))
    rc, executed, _ = built.run()
    assert rc == 0 and executed == []


def test_editing_one_models_toml_rebuilds_only_that_model(built):
    built.edit("models/tiny.toml", "max_rel = 0.02", "max_rel = 0.03")
    rc, executed, _ = built.run()
    assert rc == 0
    assert sorted(executed) == sorted(["verify:tiny@SM8550", "verify:tiny@SM8750", "manifest:tiny@SM8550",
                                       "manifest:tiny@SM8750", "report"])


def test_changing_a_compile_setting_rebuilds_compile_and_after(built):
    built.edit("models/tiny.toml", "[verify]", "[compile]\noptimization = 2\n\n[verify]")
    rc, executed, _ = built.run()
    assert rc == 0
    assert sorted(executed) == sorted(["compile:tiny/net@SM8550", "compile:tiny/net@SM8750",
                                       "verify:tiny@SM8550", "verify:tiny@SM8750",
                                       "manifest:tiny@SM8550", "manifest:tiny@SM8750", "report"])
    cfg = json.loads((built.root / "build/tiny/ort-qnn/SM8550/net.compile.json").read_text())["config"]
    assert cfg["OpO"] == 2


def test_adding_a_chip_builds_only_that_chip(built):
    built.edit("models/tiny2.toml", 'chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8750", "SM8850"]')
    rc, executed, _ = built.run()
    assert rc == 0
    assert sorted(executed) == ["compile:tiny2/net@SM8850", "manifest:tiny2@SM8850", "report",
                                "verify:tiny2@SM8850"]


def test_same_bytes_from_a_rebuilt_stage_stop_the_rebuild(built):
    # A comment in the export code reruns what reads that code; the ONNX comes out byte-identical,
    # so simplify, inspect and compile (which read only the ONNX) do not run.
    before = built.build_state()["tiny/net/export.onnx"]
    built.edit("models/tinynet.py", '"""A small real model', '"""(edited) A small real model')
    rc, executed, _ = built.run()
    assert rc == 0
    assert built.build_state()["tiny/net/export.onnx"] == before
    assert "export:tiny/net" in executed and "checkpoint:tiny" in executed
    assert not [t for t in executed if t.split(":")[0] in ("simplify", "inspect", "compile")]


def test_a_new_tool_version_rebuilds_exactly_the_stages_it_affects(built, monkeypatch):
    real = ort_qnn.version()
    monkeypatch.setattr(ort_qnn, "version", lambda: {**real, "onnxruntime-qnn": "9.9.9"})
    rc, executed, _ = built.run()
    assert rc == 0
    stages = {t.split(":")[0] for t in executed}
    assert stages == {"convert", "compile", "verify", "manifest", "report"}   # the recording keeps its bytes: no modellib
    assert len([t for t in executed if t.startswith("compile:")]) == 5   # every binary of both models


def test_one_chip_can_be_cleaned_and_rebuilt_alone(built):
    before = built.build_state()
    rc, _, _ = built.run("clean", "*@SM8750")
    assert rc == 0
    after_clean = built.build_state()
    assert not [f for f in after_clean if "/SM8750/" in f]
    assert {f: h for f, h in before.items() if "/SM8750/" not in f} == after_clean
    rc, executed, _ = built.run("chip:SM8750")
    assert rc == 0
    # convert (chip-independent) reruns only because the test before put the tool version back
    executed = [t for t in executed if not t.startswith("convert:")]
    assert sorted(executed) == sorted(["compile:tiny/net@SM8750", "compile:tiny2/net@SM8750",
                                       "verify:tiny@SM8750", "verify:tiny2@SM8750",
                                       "manifest:tiny@SM8750", "manifest:tiny2@SM8750"])


def test_a_misspelt_chip_group_fails(built):
    rc, executed, _ = built.run("chip:SM8751")
    assert rc == 3 and executed == []


def test_killed_build_resumes_and_never_trusts_half_written_files(project):
    project.add_tiny("tiny")
    proc = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
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
