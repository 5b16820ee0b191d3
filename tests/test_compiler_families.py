"""QAIRT families of the embedded toolchain (toolchain/compilers/ort_qnn/families.py,
toolchain/qnn/compat.py): the family table against the installed wheel, the runtime -> family choice
and its errors, per-family task names, paths and settings, and, with a real second family installed
from the registry (QAIRT 2.50, onnxruntime-qnn 2.6.0), the load rule itself."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import numpy as np
import pytest
from conftest import ROOT

from toolchain import options
from toolchain import project as project_mod
from toolchain.compilers.ort_qnn import families, familyrun, qairt_env
from toolchain.deploy import chip_index
from toolchain.errors import StageFailed
from toolchain.qnn import compat

OLDER = "2.50"   # the second family the load-rule tests install (one venv, ~30 s and ~530 MB)


def test_the_default_family_is_the_installed_and_pinned_wheel():
    import onnxruntime_qnn.build_and_package_info as info
    own = families.default()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert (
        f"onnxruntime-qnn=={own.onnxruntime_qnn}" in pins
        and f"onnxruntime=={own.onnxruntime}" in pins
    )
    assert (
        metadata.version("onnxruntime-qnn") == own.onnxruntime_qnn
        and info.qnn_version == own.version
    )
    code = "import json; from toolchain.qnn import qnnbin; print(json.dumps(qnnbin.htp_build_id()))"
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert found["buildId"] == own.build_id
    assert list(families.table()) == ["2.47", "2.48", "2.49", "2.50", "2.51"]
    assert all(compat.family(f.build_id) == f.name for f in families.table().values())


def test_the_runtime_picks_the_newest_family_at_or_below_it():
    assert families.for_runtime("2.49.40.260810104044", "x").name == "2.49"
    assert families.for_runtime("2.49", "x").name == "2.49"
    # a newer runtime loads every older binary
    assert families.for_runtime("2.52.0", "x").name == "2.51"
    with pytest.raises(ValueError) as err:
        families.for_runtime(compat.SHERPA_APPS, "m.toml: compile.runtime_qairt")
    text = str(err.value)
    assert text.startswith("m.toml: compile.runtime_qairt: 2.40.0.251030:")
    assert "ship QNN runtime libraries of QAIRT >= 2.47" in text and 'compiler = "qairt"' in text
    assert compat.loads("2.51.0", "v2.49.40.1") and not compat.loads(
        "2.49.40", "v2.51.0.260929181845"
    )
    # their 2.40 apps refuse it
    assert "sherpa_onnx_apps" in compat.requirement("v2.51.0.260929181845")


@pytest.mark.parametrize(
    "compile_keys, message",
    [
        (
            'runtime_qairt = "2.40.0.251030"',
            "compile.runtime_qairt: 2.40.0.251030: a QNN runtime of QAIRT 2.40.0.251030 refuses",
        ),
        (
            'runtime_qairt = "2.49"\nqairt = ["2.50"]',
            "compile.runtime_qairt / compile.qairt: give one",
        ),
        ('qairt = ["2.49", "two"]', "compile.qairt: 'two' is not a QAIRT version"),
        ("qairt = []", "compile.qairt: expected a list of QAIRT versions"),
    ],
)
def test_family_fields_are_checked_at_load(project, capsys, compile_keys, message):
    project.add_tiny(**{"[parity]": f"[compile]\n{compile_keys}\n\n[parity]"})
    rc, _, _ = project.run("list")
    err = capsys.readouterr().err
    assert rc == 3 and "tiny.toml: compile." in err and message in err, err


def test_a_bad_command_line_family_is_one_line(project, capsys):
    project.add_tiny()
    rc, _, _ = project.run("list", "qairt=2.40")
    err = capsys.readouterr().err
    assert (
        rc == 3 and "command line: qairt=2.40: 2.40: a QNN runtime of QAIRT 2.40 refuses" in err
    ), err


def _tasks(root, **load):
    from toolchain import pipeline
    here = os.getcwd()
    os.chdir(root)
    try:
        loaded = project_mod.load("models", options.resolve_given(load, {}))
        return loaded, {
            s.name: list(s.tasks(loaded))
            if not isinstance(s.tasks(loaded), dict)
            else [s.tasks(loaded)]
            for s in pipeline.STAGES
        }
    finally:
        os.chdir(here)


def _settings(task) -> dict:
    """The config_changed dict a task was given (its first uptodate entry that is one)."""
    for check in task.get("uptodate", []):
        if hasattr(check, "config"):
            return check.config
    return {}


def test_another_family_gets_its_own_tasks_paths_and_settings_and_the_default_keeps_its_own(
    project, monkeypatch
):
    project.add_tiny()
    _, plain = _tasks(project.root)
    project.edit(
        "models/tiny.toml", "[parity]", '[compile]\nqairt = ["2.49.40", "2.51"]\n\n[parity]'
    )
    loaded, both = _tasks(project.root)
    assert loaded.models[0].qairt == ("2.49", "")   # "": the build's own family
    default = {t["name"]: t for t in plain["compile"]}
    family = {t["name"]: t for t in both["compile"]}
    assert set(family) == set(default) | {f"{n}+qairt2.49" for n in default}
    for name, task in default.items():  # the default family's tasks are exactly as before
        assert family[name]["targets"] == task["targets"] and _settings(family[name]) == _settings(
            task
        )
        assert "python" not in family[name].get("meta", {})
    other = family["tiny/net@SM8750+qairt2.49"]
    assert all(p.startswith("build/tiny/ort-qnn-qairt2.49/SM8750/") for p in other["targets"])
    assert other["meta"]["python"] == "build/qairt/2.49/venv/bin/python"
    assert _settings(other)["tool"] == {
        "onnxruntime": "1.32.0",
        "onnxruntime-qnn": "2.5.0",
        "qairt": "2.49.40",
    }
    assert (
        _settings(other)["chip"]["qairt"] == "2.49"
        and "build/qairt/2.49/env.json" in other["file_dep"]
    )
    assert [t["name"] for t in both["qairt_env"]] == ["2.49"] and not plain["qairt_env"]
    assert {t["name"] for t in both["convert"]} == {"tiny/net", "tiny/net+qairt2.49"}
    assert {t["name"] for t in both["verify"]} == {
        "tiny@SM8550",
        "tiny@SM8750",
        "tiny@SM8550+qairt2.49",
        "tiny@SM8750+qairt2.49",
    }
    # whom each task is for is its owner, carried in its meta: the chip alias holds both families'
    from toolchain import pipeline
    monkeypatch.chdir(project.root)
    creators = pipeline.task_creators(loaded)
    compiled = {t["name"]: t for t in creators["task_compile"]()}
    assert compiled["tiny/net@SM8750+qairt2.49"]["meta"]["owner"] == {
        "model": "tiny", "graph": "net", "chip": "SM8750", "family": "2.49"
    }
    assert compiled["tiny/net@SM8750"]["meta"]["owner"] == {
        "model": "tiny", "graph": "net", "chip": "SM8750"
    }
    chip = next(a for a in creators["task_chip"]() if a["name"] == "SM8750")
    assert (
        "compile:tiny/net@SM8750+qairt2.49" in chip["task_dep"]
        and "compile:tiny/net@SM8750" in chip["task_dep"]
    )


def test_the_command_line_overrides_the_spec_for_one_run(project):
    project.add_tiny(**{"[parity]": '[compile]\nruntime_qairt = "2.49.40"\n\n[parity]'})
    assert _tasks(project.root)[0].models[0].qairt == ("2.49",)
    assert _tasks(project.root, qairt="2.51")[0].models[0].qairt == ()
    assert _tasks(project.root, qairt="all")[0].models[0].qairt == (
        "2.47",
        "2.48",
        "2.49",
        "2.50",
        "",
    )


def test_an_unreachable_registry_is_one_line(tmp_path, monkeypatch):
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                       "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StageFailed) as err:
        qairt_env.make_env(OLDER, str(tmp_path / "env"), str(tmp_path / "env" / "env.json"))
    text = str(err.value)
    assert (
        text.startswith(f"QAIRT {OLDER}: pip could not install onnxruntime-qnn==2.6.0")
        and "registry" in text
    )
    assert "\n" not in text and not (tmp_path / "env" / "env.json").exists()


def test_ctypes_before_the_first_session_is_made_safe(tmp_path):
    """The pitfall: libQnnHtp.so dlopened before onnxruntime is in the process crashes the first EP
    session. The raw load shows it with the pinned wheel; the build's own loader (qnnbin) makes the
    same order safe."""
    import onnx
    from onnx import helper
    model = tmp_path / "add.onnx"
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    session = (
        f"import onnxruntime as ort, onnxruntime_qnn as oq\n"
        f"ort.register_execution_provider_library(oq.EP_NAME, oq.get_library_path())\n"
        f"so = ort.SessionOptions(); so.log_severity_level = 3\n"
        "so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "
        "oq.EP_NAME], "
        f"{{'backend_path': oq.get_qnn_htp_path(), 'soc_model': '69', 'htp_arch': '79'}})\n"
        f"ort.InferenceSession({str(model)!r}, sess_options=so); print('session made')\n"
    )
    raw = "import ctypes, onnxruntime_qnn as oq; ctypes.CDLL(oq.get_qnn_htp_path())\n"
    ours = "from toolchain.qnn import qnnbin; print(qnnbin.htp_build_id()['buildId'])\n"
    crashed = subprocess.run(
        [sys.executable, "-c", raw + session], capture_output=True, text=True, cwd=ROOT
    )
    safe = subprocess.run(
        [sys.executable, "-c", ours + session], capture_output=True, text=True, cwd=ROOT
    )
    assert crashed.returncode == -11, (
        "the pitfall no longer reproduces: qnnbin's onnxruntime-first load can go"
    )
    assert safe.returncode == 0 and "session made" in safe.stdout, safe.stderr[-2000:]


# ---- a second family, for real
# -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A tiny model built for QAIRT 2.50 and the default 2.51, side by side, on SM8750 (the family's
    venv made by the build's own qairt_env task, from the package registry)."""
    from conftest import Project
    p = Project(tmp_path_factory.mktemp("families") / "proj")
    p.add_tiny(**{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]',
                  "[parity]": f'[compile]\nqairt = ["{OLDER}", "2.51"]\n\n[parity]'})
    rc, executed, text = p.run("manifest", "oracle", "chip_index", "report")
    assert rc == 0, text
    return p, executed


def test_both_families_build_and_verify_side_by_side_each_recording_its_own(two):
    p, executed = two
    assert f"qairt_env:{OLDER}" in executed and f"verify:tiny@SM8750+qairt{OLDER}" in executed
    env = json.loads((p.root / f"build/qairt/{OLDER}/env.json").read_text())
    assert env["probe"]["htp"]["buildId"] == families.table()[OLDER].build_id
    assert (
        "site-packages" in env["probe"]["library"]
        and f"qairt/{OLDER}/venv" in env["probe"]["library"]
    )
    for folder, family in ((f"ort-qnn-qairt{OLDER}", OLDER), ("ort-qnn", "2.51")):
        manifest = json.loads((p.root / f"build/tiny/{folder}/SM8750/manifest.json").read_text())
        assert next(iter(manifest)) == "qnn_runtime"   # what a deployer needs comes first
        assert manifest["qnn_runtime"]["qairt_family"] == family
        assert manifest["qnn_runtime"]["build_id"] == families.table()[family].build_id
        assert manifest["runtime_libraries"]["qairt"] == families.table()[family].version
        oracle = json.loads((p.root / f"build/tiny/{folder}/SM8750/net.oracle.json").read_text())
        # the route == that family's EP
        assert oracle["status"] == "identical" and oracle["wrapper_identical"]
    log = (p.root / f"build/tiny/ort-qnn-qairt{OLDER}/SM8750/net.compile.log").read_text()
    # its own interpreter, not the fork server
    assert f"# in build/qairt/{OLDER}/venv/bin/python" in log


def test_the_report_compares_the_families_of_one_model_and_chip(two):
    p, _ = two
    text = (p.root / "build/report.md").read_text()
    section = text.split("## QAIRT families", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| tiny | SM8750 |")]
    assert [r.split(" | ")[2] for r in rows] == [OLDER, "2.51"], section
    assert "QAIRT families" in (p.root / "build/report.html").read_text()


def test_a_family_worse_than_the_best_is_flagged():
    from toolchain.stages.report import families as table

    def manifest(family, max_rel, per_call, size):
        return {"model": "m", "chip": {"name": "SM8750"}, "qnn_runtime": {"qairt_family": family},
                "sdk": {"build_id": f"v{family}.0.1"},
                "binaries": {"g": {"bytes": size, "compile_seconds": 1.0}},
                "verify": {"default": {"checks": {"max_rel": 0.05, "min_cosine": 0.99},
                                       "tensors": {"g": {"max_rel": max_rel, "cosine": 0.999,
                                                         "seconds_per_call": per_call}}}}}
    rows = table.rows([manifest("2.49", 0.09, 3.0, 100), manifest("2.51", 0.01, 1.0, 100),
                       manifest("2.50", 0.02, 1.2, 120)])
    flags = {r[2]: r[-1] for r in rows}
    assert flags["2.51"] == "ok"
    assert (
        "tensor error +0.08 over the best" in flags["2.49"]
        and "simulator 3.0x the best" in flags["2.49"]
    )
    # 0.01 worse and 1.2x slower: within the bounds
    assert flags["2.50"] == "binaries 1.20x the best"
    assert table.rows([manifest("2.51", 0.01, 1.0, 100)]) == []   # one family: nothing to compare


def test_the_load_rule_newer_runtime_loads_older_binary_older_refuses_newer(two):
    p, _ = two
    older = families.table()[OLDER]
    old_ctx = str(p.root / f"build/tiny/ort-qnn-qairt{OLDER}/SM8750/net.onnx")
    new_ctx = str(p.root / "build/tiny/ort-qnn/SM8750/net.onnx")
    options = {"soc_model": "69", "htp_arch": "79", "vtcm_mb": "8"}
    here = os.getcwd()
    os.chdir(p.root)
    try:
        feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 16)).astype(np.float32)}
        own = familyrun.simulator(new_ctx, options, sys.executable, dict(os.environ))(feeds)
        newer_runs_older = familyrun.simulator(old_ctx, options, sys.executable, dict(os.environ))(
            feeds
        )
        np.testing.assert_allclose(newer_runs_older["y"], own["y"], atol=0.05)
        with pytest.raises(StageFailed) as err:
            familyrun.simulator(
                new_ctx, options, families.interpreter(older), families.environ(older)
            )
    finally:
        os.chdir(here)
    assert "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in str(err.value)


def test_the_chip_selector_refuses_a_binary_newer_than_the_apps_runtime(two):
    p, _ = two
    index = str(p.root / "build/chip-index.json")
    entry = json.loads(open(index).read())["models"]["tiny"]["SM8750"]
    assert entry["qnn_runtime"]["qairt_family"] == "2.51" and list(entry["other_qairt"]) == [OLDER]
    assert "2.51 build" in chip_index.select("SM8750", True, index, runtime_qairt="2.51.0").reason
    older = chip_index.select("SM8750", True, index, runtime_qairt=f"{OLDER}.40")
    assert older.npu and f"QAIRT {OLDER} build" in older.reason and f"qairt{OLDER}" in older.bundle
    refused = chip_index.select("SM8750", True, index, runtime_qairt="2.49.40")
    assert not refused.npu and re.search(
        rf"would refuse .* needs a runtime of QAIRT >= {OLDER}", refused.reason
    )
