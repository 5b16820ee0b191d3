"""The QAIRT SDK toolchain against a stand-in SDK (tests/sdk_standin.py): command lines as in
sherpa-onnx's export workflows, HTP config JSON as its generate_config.py writes it (docs/qairt.md),
graph-name coupling, logs, preflight, incremental rules."""
from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sdk_standin as standin
from conftest import Project, add_qnet, sdk_env
from doit.tools import config_changed

from toolchain.compilers.qairt import readback
from toolchain.compilers.qairt import tools as qairt
from toolchain.errors import SpecError, StageFailed
from toolchain.qnn import sdk as sdk_layout
from toolchain.qnn.layout import layout_permutation, permutation_or_fail

BUILD_ID = "v2.40.0.251030-standin"
G = "build/qnet/qairt/net-a"   # per-graph QAIRT outputs
UPSTREAM = [
    "checkpoint:qnet",
    "export:qnet/net-a",
    "simplify:qnet/net-a",
    "inspect:qnet/net-a",
    "parity:qnet/net-a",
    "parity:qnet",
]
GRAPH_STAGES = ["convert:qnet/net-a", "modellib:qnet/net-a", "pagesize:qnet/net-a"]
CHIP_STAGES = ["htpconfig:qnet/net-a@{c}", "context:qnet/net-a@{c}", "readback:qnet/net-a@{c}",
               "verify:qnet@{c}", "manifest:qnet@{c}"]


def chip_stages(*chips):
    return [t.format(c=c) for c in chips for t in CHIP_STAGES]


QAIRT_CHAIN = GRAPH_STAGES + chip_stages("SM8550", "SM8750") + ["report"]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The chip-independent stages of qnet built once (ONNX, inspect, parity); tests copy it."""
    tmp = tmp_path_factory.mktemp("upstream")
    with pytest.MonkeyPatch.context() as mp:
        sdk_env(mp, tmp)
        project = Project(tmp / "proj")
        add_qnet(project)
        rc, executed, text = project.run("inspect", "parity")
    assert rc == 0 and executed == UPSTREAM, text
    return project.root


def copy_of(upstream: Path, tmp: Path) -> Project:
    shutil.copytree(upstream, tmp / "proj")
    return Project(tmp / "proj")


@pytest.fixture
def fresh(upstream, tmp_path, monkeypatch):
    """(project with upstream built, stand-in SDK root) for one test."""
    sdk = sdk_env(monkeypatch, tmp_path)
    return copy_of(upstream, tmp_path), sdk


@pytest.fixture(scope="module")
def qairt_built(upstream, tmp_path_factory):
    """qnet built through the whole QAIRT chain once; the tests below run in order and
    may change it."""
    tmp = tmp_path_factory.mktemp("built")
    mp = pytest.MonkeyPatch()
    sdk = sdk_env(mp, tmp)
    project = copy_of(upstream, tmp)
    rc, executed, text = project.run()
    yield project, sdk, rc, executed, text
    mp.undo()


# ---- fresh copies of the upstream build ----
def test_a_failing_converter_stops_the_chain(fresh):
    project, sdk = fresh
    standin.configure(sdk, fail={"qnn-onnx-converter": "Node Relu: unsupported"})
    rc, executed, text = project.run()
    assert rc == 1 and executed == ["convert:qnet/net-a"], text
    assert "qnn-onnx-converter exited with 1" in text and "ERROR: Node Relu: unsupported" in text
    assert (
        not (project.root / f"{G}/net-a.cpp").exists()
        and (project.root / f"{G}/net-a.convert.log").is_file()
    )


def test_a_4k_aligned_android_lib_fails_the_page_size_check(fresh):
    project, sdk = fresh
    # a lib generator that ignored LDFLAGS
    standin.configure(sdk, page_size={"aarch64-android": 4096})
    rc, executed, text = project.run("pagesize")
    assert rc == 1 and executed == GRAPH_STAGES, text
    assert (
        f"{G}/model_libs/aarch64-android/libnet-a.so: LOAD segments aligned to 0x1000 < 0x4000"
        in text
    )
    assert "align 0x1000" in (project.root / f"{G}/net-a.pagesize.log").read_text()


def test_without_an_ndk_only_x86_64_libs_are_built_and_it_is_said_once(
    upstream, tmp_path, monkeypatch, capsys
):
    sdk = sdk_env(monkeypatch, tmp_path, ndk=False)
    project = copy_of(upstream, tmp_path)
    rc, executed, text = project.run("pagesize")
    assert rc == 0 and executed == GRAPH_STAGES, text
    assert standin.calls(sdk, "qnn-model-lib-generator")[0]["argv"][-2:] == [
        "-t",
        "x86_64-linux-clang",
    ]
    assert not (project.root / f"{G}/model_libs/aarch64-android").exists()
    record = json.loads((project.root / f"{G}/net-a.pagesize.json").read_text())
    assert (
        list(record["libs"]) == ["x86_64-linux-clang"]
        and "no aarch64-android lib" in record["note"]
    )
    assert (
        capsys.readouterr().err.count(
            "ndk-build is not on PATH: building x86_64-linux-clang model libs only"
        )
        == 1
    )
    project.edit("models/qnet.toml", "[export]", '[compile]\nandroid_libs = "required"\n\n[export]')
    assert project.run("list")[0] == 3   # a load-time mistake: doit's one ERROR line, exit 3
    assert "ERROR: QAIRT preflight failed" in (err := capsys.readouterr().err)
    assert "ndk-build is not on PATH, and models/qnet.toml ask for aarch64-android" in err


def test_without_the_utility_read_back_goes_through_libqnnsystem(fresh):
    project, sdk = fresh
    (sdk / "bin/x86_64-linux-clang/qnn-context-binary-utility").unlink()
    rc, executed, text = project.run("readback:qnet/net-a@SM8550")
    # the stand-in's libQnnSystem.so is a placeholder: the path is taken, the real read is
    # not possible here
    assert rc == 1 and executed[-1] == "readback:qnet/net-a@SM8550", text
    assert "build/qnet/qairt/SM8550/net-a.bin: libQnnSystem cannot read it" in text
    assert (
        f"qnnbin.binary_info(build/qnet/qairt/SM8550/net-a.bin, {sdk}/lib/x86_64-linux-clang)"
        in (project.root / "build/qnet/qairt/SM8550/net-a.readback.log").read_text()
    )


# ---- the built chain, in order ----
def test_first_build_runs_exactly_the_qairt_chain(qairt_built):
    project, sdk, rc, executed, text = qairt_built
    assert rc == 0, text
    # upstream was built before; no compile:* (ort-qnn) task
    assert sorted(executed) == sorted(QAIRT_CHAIN)
    assert (project.root / "build/qnet/qairt/SM8750/net-a.bin").is_file()
    assert not (project.root / "build/qnet/ort-qnn").exists()


def test_command_lines_are_the_guides(qairt_built):
    project, sdk, *_ = qairt_built
    host = f"{sdk}/bin/x86_64-linux-clang"
    assert [c["argv"] for c in standin.calls(sdk, "qnn-onnx-converter")] == [
        ["--input_network", "build/qnet/net-a/net-a.onnx", "--output_path", f"{G}/net-a.cpp",
         "--act_bitwidth", "16", "--bias_bitwidth", "32"]]
    lib_calls = standin.calls(sdk, "qnn-model-lib-generator")
    assert [c["argv"] for c in lib_calls] == [
        ["-c", f"{G}/net-a.cpp", "-b", f"{G}/net-a.bin", "-o", f"{G}/model_libs"]
    ]
    assert lib_calls[0]["env"]["LDFLAGS"] == "-Wl,-z,max-page-size=16384"
    assert all(c["pythonpath"] == f"{sdk}/lib/python" and c["env"]["QNN_SDK_ROOT"] == str(sdk)
               for c in standin.calls(sdk))
    # both run by the converter's Python (default python3.10), not python3
    for tool in ("convert", "modellib"):
        ran = json.loads((project.root / f"{G}/net-a.{tool}.json").read_text())["argv"]
        assert ran[0] == str(Path(os.environ["PATH"].split(os.pathsep)[0]) / "python3.10")
        assert (
            ran[1]
            == f"{host}/qnn-{'onnx-converter' if tool == 'convert' else 'model-lib-generator'}"
        )
    assert sorted(c["argv"] for c in standin.calls(sdk, "qnn-context-binary-generator")) == [
        [
            "--backend",
            f"{sdk}/lib/x86_64-linux-clang/libQnnHtp.so",
            "--model",
            f"{G}/model_libs/x86_64-linux-clang/libnet-a.so",
            "--output_dir",
            f"build/qnet/qairt/{chip}",
            "--binary_file",
            "net-a",
            "--config_file",
            f"build/qnet/qairt/{chip}/net-a.config/htp_backend_extensions.json",
        ]
        for chip in ("SM8550", "SM8750")
    ]
    assert sorted(c["argv"] for c in standin.calls(sdk, "qnn-context-binary-utility")) == [
        ["--context_binary", f"build/qnet/qairt/{chip}/net-a.bin", "--json_file",
         f"build/qnet/qairt/{chip}/net-a.binary_info.json"] for chip in ("SM8550", "SM8750")]
    netrun = standin.calls(sdk, "qnn-net-run")
    assert len(netrun) == 2 and netrun[0]["argv"] == [
        "--backend", f"{sdk}/lib/x86_64-linux-clang/libQnnHtp.so",
        "--retrieve_context", "build/qnet/qairt/SM8550/net-a.bin",
        "--input_list", "build/qnet/qairt/SM8550/netrun-default/net-a/input_list.txt",
        "--output_dir", "build/qnet/qairt/SM8550/netrun-default/net-a/output"]
    # scratch removed
    assert not (project.root / "build/qnet/qairt/SM8550/netrun-default").exists()


def test_htp_config_json_is_generate_config_pys(qairt_built):
    project, sdk, *_ = qairt_built
    folder = project.root / "build/qnet/qairt/SM8750/net-a.config"
    assert (folder / "htp_backend_extensions.json").read_text() == (
        '{\n    "backend_extensions": {\n'
        '        "shared_library_path": '
        f'"{sdk}/lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so",\n'
        f'        "config_file_path": "{folder.relative_to(project.root)}/htp_config.json"\n    '
        f'}}\n}}'
    )
    assert (folder / "htp_config.json").read_text() == """{
    "graphs": [
        {
            "vtcm_mb": 8,
            "O": 3,
            "graph_names": [
                "net_a"
            ]
        }
    ],
    "devices": [
        {
            "device_id": 0,
            "soc_id": 69,
            "dsp_arch": "v79",
            "cores": [
                {
                    "core_id": 0,
                    "perf_profile": "burst",
                    "rpc_control_latency": 200
                }
            ]
        }
    ]
}"""
    sm8550 = json.loads(
        (project.root / "build/qnet/qairt/SM8550/net-a.config/htp_config.json").read_text()
    )
    assert sm8550["devices"][0]["soc_id"] == 43 and sm8550["devices"][0]["dsp_arch"] == "v73"


def test_graph_name_comes_from_the_converter_output_name_everywhere(qairt_built):
    project, *_ = qairt_built
    assert (
        qairt.graph_name(f"{G}/net-a.cpp") == "net_a"
        and qairt.graph_name("x/encoder.cpp") == "encoder"
    )
    converted = json.loads((project.root / f"{G}/net-a_net.json").read_text())["graph"]["name"]
    config = json.loads(
        (project.root / "build/qnet/qairt/SM8550/net-a.config/htp_config.json").read_text()
    )
    manifest = json.loads((project.root / "build/qnet/qairt/SM8550/manifest.json").read_text())
    assert (
        converted
        == config["graphs"][0]["graph_names"][0]
        == manifest["binaries"]["net-a"]["graph_name"]
        == "net_a"
    )


def test_one_log_per_stage_per_graph_and_chip(qairt_built):
    project, *_ = qairt_built
    logs = sorted(
        str(p.relative_to(project.root)) for p in (project.root / "build/qnet/qairt").rglob("*.log")
    )
    per_chip = [
        f"build/qnet/qairt/{c}/{f}"
        for c in ("SM8550", "SM8750")
        for f in ("net-a.context.log", "net-a.htpconfig.log", "net-a.readback.log", "verify.log")
    ]
    assert logs == sorted(
        per_chip + [f"{G}/net-a.{s}.log" for s in ("convert", "modellib", "pagesize")]
    )
    assert "qnn-model-lib-generator" in (project.root / f"{G}/net-a.modellib.log").read_text()
    assert (
        "qnn-context-binary-generator"
        in (project.root / "build/qnet/qairt/SM8550/net-a.context.log").read_text()
    )


def test_manifest_records_toolchain_sdk_and_runtime_libraries(qairt_built):
    project, sdk, *_ = qairt_built
    m = json.loads((project.root / "build/qnet/qairt/SM8750/manifest.json").read_text())
    assert m["toolchain"] == "qairt"
    assert m["sdk"]["build_id"] == BUILD_ID and m["sdk"]["tool"]["build_id_source"].endswith(
        "backendGetBuildId"
    )
    libs = m["runtime_libraries"]
    assert libs["sdk_root"] == str(sdk) and libs["build_id"] == BUILD_ID
    assert libs["android_aarch64"] == {
        "libQnnHtp.so": "lib/aarch64-android/libQnnHtp.so",
        "libQnnSystem.so": "lib/aarch64-android/libQnnSystem.so",
        "libQnnHtpV79Stub.so": "lib/aarch64-android/libQnnHtpV79Stub.so",
    }
    assert libs["hexagon_dsp"] == {
        "libQnnHtpV79Skel.so": "lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so"
    }
    android = m["model_libs"]["net-a"]["libs"]["aarch64-android"]
    assert android["machine"] == "AArch64" and android["min_align"] == 0x4000
    # qnn-net-run path, layouts undone
    assert m["verify"]["default"]["tensors"]["net-a"]["max_rel"] < 1e-6
    assert "| qnet | SM8750 | v79 |" in (project.root / "build/report.md").read_text()


def test_second_run_executes_nothing(qairt_built):
    project, *_ = qairt_built
    rc, executed, text = project.run()
    assert rc == 0 and executed == [], text


def test_changing_the_chip_list_never_rebuilds_convert_or_model_libs(qairt_built):
    project, *_ = qairt_built
    project.edit(
        "models/qnet.toml", 'chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8750", "SM8850"]'
    )
    rc, executed, text = project.run()
    assert rc == 0, text
    assert sorted(executed) == sorted(chip_stages("SM8850") + ["report"])
    project.edit(
        "models/qnet.toml", 'chips = ["SM8550", "SM8750", "SM8850"]', 'chips = ["SM8550", "SM8750"]'
    )
    rc, executed, text = project.run()
    assert rc == 0 and executed == ["report"], text


def test_switching_sdk_rebuilds_the_qairt_stages_and_nothing_upstream(qairt_built):
    project, sdk, *_ = qairt_built
    standin.set_build_id(sdk, "v2.41.0.251212-standin")   # same paths, another SDK build
    rc, executed, text = project.run()
    assert rc == 0, text
    assert sorted(executed) == sorted(QAIRT_CHAIN)
    m = json.loads((project.root / "build/qnet/qairt/SM8550/manifest.json").read_text())
    assert m["sdk"]["build_id"] == m["runtime_libraries"]["build_id"] == "v2.41.0.251212-standin"


def test_a_failing_tool_fails_at_once_with_its_log_tail_and_nothing_downstream_runs(qairt_built):
    project, sdk, *_ = qairt_built
    binary = project.root / "build/qnet/qairt/SM8550/net-a.bin"
    assert binary.is_file()
    standin.configure(sdk, fail={"qnn-context-binary-generator": "HTP prepare failed for op Relu"})
    project.run("forget", "context:qnet/net-a@SM8550")
    # even so, nothing downstream of the failure runs
    rc, executed, text = project.run("--continue")
    # 2: doit counts the unmet dependents
    assert rc == 2 and executed == ["context:qnet/net-a@SM8550"], text
    assert "UnmetDependency - taskid:readback:qnet/net-a@SM8550" in text
    assert "TaskFailed - taskid:context:qnet/net-a@SM8550" in text
    assert (
        "qnn-context-binary-generator exited with 1; log build/qnet/qairt/SM8550/net-a.context.log"
        in text
    )
    # the tail
    assert "qnn-context-binary-generator: step 29\nERROR: HTP prepare failed for op Relu" in text
    assert not binary.exists()  # a stale binary cannot feed readback / verify / manifest
    assert (
        "HTP prepare failed"
        in (project.root / "build/qnet/qairt/SM8550/net-a.context.log").read_text()
    )


# ---- selection, preflight, build id ----
def generated(project: Project) -> dict[str, list[dict]]:
    """{basename: [task dicts]} as dodo.py generates them for this project."""
    cwd = os.getcwd()
    os.chdir(project.root)
    try:
        members = runpy.run_path(str(project.root / "dodo.py"))
        creators = [
            m.create_doit_tasks for m in members.values() if hasattr(m, "create_doit_tasks")
        ]
        return {
            c.basename: [t for t in (c() or []) if isinstance(t, dict)]
            for c in creators
            if c.basename != "report"
        }
    finally:
        os.chdir(cwd)


def test_auto_takes_qairt_only_with_a_valid_sdk(tmp_path, monkeypatch):
    sdk = sdk_env(monkeypatch, tmp_path)
    project = Project(tmp_path / "proj")
    add_qnet(project, **{'compiler = "qairt"': 'compiler = "auto"'})
    tasks = generated(project)
    assert [t["name"] for t in tasks["convert"]] == ["qnet/net-a"] and tasks["compile"] == []
    assert tasks["context"][0]["targets"][0] == "build/qnet/qairt/SM8550/net-a.bin"
    assert ("compiler qairt" in tasks["model"][0]["doc"]
            and "[qairt v2.40.0.251030-standin]" in tasks["convert"][0]["doc"])
    shutil.rmtree(sdk / "bin/x86_64-linux-clang")   # no longer a valid SDK: the embedded toolchain
    tasks = generated(project)
    assert tasks["context"] == [] and len(tasks["compile"]) == 2
    # convert and modellib are now the embedded toolchain's (the design card's route), not the SDK's
    assert (all("QNN Saver" in t["doc"] for t in tasks["convert"])
            and len(tasks["convert"]) == len(tasks["modellib"]) == 1)
    assert tasks["compile"][0]["targets"][1] == "build/qnet/ort-qnn/SM8550/net-a_qnn.bin"
    assert "compiler ort-qnn" in tasks["model"][0]["doc"]


def test_every_qairt_task_has_one_config_changed_a_log_and_plain_settings(fresh):
    project, _ = fresh
    tasks = generated(project)
    for stage in ("convert", "modellib", "pagesize", "htpconfig", "context", "readback", "verify"):
        assert tasks[stage], stage
        for t in tasks[stage]:
            assert re.fullmatch(r"qnet(/net-a)?(@SM\d{4})?", t["name"]) and t["clean"] is True
            # + the engine's outputs check
            configs = [u for u in t["uptodate"] if isinstance(u, config_changed)]
            assert len(configs) == 1 and json.dumps(configs[0].config)
            assert any(p.endswith(".log") for p in t["targets"]) and all(
                p.startswith("build/") for p in t["targets"]
            )
            chip = "@" in t["name"]
            assert (chip and stage not in ("convert", "modellib", "pagesize")) or (
                not chip and stage != "htpconfig"
            )
            assert configs[0].config["sdk"]["build_id"] == BUILD_ID


def test_preflight_names_every_missing_piece_with_its_fix(tmp_path, monkeypatch, capsys):
    # an SDK without v81 libraries
    sdk = sdk_env(monkeypatch, tmp_path, arches=(68, 69, 73, 75, 79))
    (sdk / "bin/x86_64-linux-clang/qnn-net-run").unlink()
    (tmp_path / "hostbin/clang++").unlink()
    monkeypatch.setenv("QAIRT_PYTHON", str(tmp_path / "no/python3.10"))
    project = Project(tmp_path / "proj")
    add_qnet(project, **{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750", "SM8850"]'})
    assert project.run("list")[0] == 3
    text = capsys.readouterr().err
    assert text.startswith("ERROR: QAIRT preflight failed for models/qnet.toml (compiler qairt):")
    assert f"{sdk}/bin/x86_64-linux-clang/qnn-net-run is missing or not executable" in text
    assert "QNN_SDK_ROOT must be the unzipped qairt/<version> folder" in text
    assert (
        f"{tmp_path}/no/python3.10' was not found: install Python 3.10" in text
        and "QAIRT_PYTHON=" in text
    )
    assert "clang++ is not on PATH" in text and "check-linux-dependency.sh" in text
    (sdk / "bin/x86_64-linux-clang/qnn-net-run").write_text("")
    (sdk / "bin/x86_64-linux-clang/qnn-net-run").chmod(0o755)
    assert project.run("list")[0] == 3
    assert (
        f"{sdk}/lib/aarch64-android/libQnnHtpV81Stub.so is missing: this SDK has no HTP v81 "
        "libraries "
        f"for SM8850; use a QAIRT release that supports v81" in capsys.readouterr().err
    )
    monkeypatch.delenv("QNN_SDK_ROOT")
    # as a user sees it: doit's one-line ERROR, exit 3, no traceback
    cli = project.doit_cli("list")
    assert (
        cli.returncode == 3
        and "ERROR: QAIRT preflight failed" in cli.stderr
        and "Traceback" not in cli.stderr
    )
    assert (
        "QNN_SDK_ROOT is not set: unzip the QAIRT SDK and source qairt/<version>/bin/envsetup.sh"
        in cli.stderr
    )


def test_converter_python_must_find_the_sdks_modules(tmp_path, monkeypatch):
    sdk = sdk_env(monkeypatch, tmp_path)
    shutil.rmtree(sdk / "lib/python/qti")
    version, problems = qairt.python_problems("python3.10", str(sdk))
    assert version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert problems == [
        f"the converter's Python {tmp_path}/hostbin/python3.10 (Python {version}) cannot import "
        f"qti.aisw.converters: install Python 3.10 with the SDK's deps (python3 "
        f"$QNN_SDK_ROOT/bin/check-python-dependency), or set QAIRT_PYTHON=/path/to/that/python"
    ]


def test_build_id_is_read_from_libqnnhtp_with_a_labelled_fallback(tmp_path):
    sdk = standin.make_sdk(tmp_path / "sdk")
    assert sdk_layout.read_build_id(str(sdk)) == (
        BUILD_ID,
        f"{sdk}/lib/x86_64-linux-clang/libQnnHtp.so backendGetBuildId",
    )
    (sdk / "lib/x86_64-linux-clang/libQnnHtp.so").write_bytes(b"not a library")
    build_id, source = sdk_layout.read_build_id(str(sdk))
    assert build_id == "2.40.0.251030" and source.startswith(
        f"FALLBACK {sdk}/sdk.yaml version (libQnnHtp.so did not"
    )


def test_stand_in_tools_reject_unknown_and_missing_flags(tmp_path):
    sdk = standin.make_sdk(tmp_path / "sdk")
    tool = str(sdk / "bin/x86_64-linux-clang/qnn-context-binary-generator")
    bogus = subprocess.run(
        [
            tool,
            "--backend",
            "b",
            "--model",
            "m",
            "--output_dir",
            "o",
            "--binary_file",
            "f",
            "--bogus",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    missing = subprocess.run([tool, "--backend", "b"], capture_output=True, text=True)
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr
    assert missing.returncode == 2 and "required" in missing.stderr


# ---- read-back rules ----
def test_read_back_rejects_another_sdk_a_renamed_graph_and_another_chip():
    chip = {"name": "SM8750", "soc_model": 69, "htp_arch": 79, "vtcm_mb": 8, "fp16": True}
    expected = {
        "graph_name": "net_a",
        "build_id": "v2.40",
        "exact_build_id": True,
        "chip": chip,
        "io": {"inputs": [["x", [1, 4, 16], "float32"]], "outputs": [["y", [1, 4, 8], "float32"]]},
        "view": {
            "inputs": [["x", [1, 16, 4], "float32"]],
            "outputs": [["y", [1, 4, 8], "float32"]],
        },
    }
    good = {"buildId": "v2.40", "socModel": 69, "graphs": [{"name": "net_a",
            # 3-D: the converter swaps
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16, 4]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4, 8]}]}]}
    assert readback.readback_problems(good, {}, expected) == []
    bad = {
        **good,
        "buildId": "v2.41",
        "socModel": 87,
        "graphs": [{**good["graphs"][0], "name": "net-a"}],
    }
    found = readback.readback_problems(bad, {"arch": 81, "vtcm_size": 4 << 20}, expected)
    assert [f.split(" ")[0] for f in found] == ["build", "graphs", "socModel", "arch", "vtcm_size"]
    assert (
        readback.dtype("QNN_DATATYPE_UFIXED_POINT_16") == "ufixed16"
        and readback.dtype(0x0232) == "float32"
    )
    assert layout_permutation([1, 3, 8, 8], [1, 8, 8, 3]) == (0, 2, 3, 1)
    assert layout_permutation([1, 4, 16], [1, 4, 15]) is None
    # a raw file in a layout the build does not know is refused, naming the tensor,
    # not written transposed
    with pytest.raises(StageFailed, match=r"tensor 'mel': QNN's shape \[1, 4, 15\] is no layout"):
        permutation_or_fail([1, 4, 16], [1, 4, 15], "mel")


def test_a_w8a16_graph_quantized_by_the_converter_from_where_it_runs_with_its_io_recorded(fresh):
    """The converter runs from the project root: its input list must name files it can open from
    there (the stand-in opens them as the real one does); a calibrated graph's I/O is
    UFIXED_POINT_16 with a scale and offset, accepted by the read-back and recorded in the compile
    record and the manifest."""
    project, sdk = fresh
    add_qnet(project, **{"[graphs.net-a]": '[graphs.net-a]\nprecision = "w8a16"\ncalibration = 1'})
    rc, executed, text = project.run()
    assert rc == 0, text
    listed = f"{G}/net-a.input_list.txt"
    call = standin.calls(sdk, "qnn-onnx-converter")[-1]
    assert call["argv"][call["argv"].index("--input_list") + 1] == listed and call["cwd"] == str(
        project.root
    )
    lines = (project.root / listed).read_text().split()
    assert len(lines) == 1 and all((project.root / f).is_file() for f in lines)
    # relative: same bytes in any checkout
    assert all(f.startswith("build/qnet/net-a/calibration/") for f in lines)
    for chip in ("SM8550", "SM8750"):
        info = json.loads(
            (project.root / f"build/qnet/qairt/{chip}/net-a.compile.json").read_text()
        )["info"]
        assert info["graphs"][0]["inputs"][0] == {
            "name": "x",
            "dtype": "ufixed16",
            "shape": [1, 16, 4],
            "scale": 0.0001,
            "offset": -32768,
        }
        manifest = json.loads((project.root / f"build/qnet/qairt/{chip}/manifest.json").read_text())
        assert manifest["binaries"]["net-a"]["io"]["outputs"][0]["dtype"] == "ufixed16"
        assert manifest["binaries"]["net-a"]["io"]["outputs"][0]["offset"] == -32768


def test_names_are_sanitised_as_the_converter_does(fresh):
    """A graph named net.b and tensors x.in / y-out: the converter calls them net_b, x_in, y_out;
    the HTP config must name graph net_b (or it would not apply) and the read-back must expect
    the same names."""
    project, sdk = fresh
    add_qnet(project, **{"[graphs.net-a]": '[graphs."net.b"]', "inputs.x =": 'inputs."x.in" =',
                         "outputs.y =": 'outputs."y-out" =',
                         "opset = 17": 'opset = 17\nargs = { input = "x.in", output = "y-out" }'})
    rc, executed, text = project.run()
    assert rc == 0, text
    config = json.loads(
        (project.root / "build/qnet/qairt/SM8750/net.b.config/htp_config.json").read_text()
    )
    assert config["graphs"][0]["graph_names"] == ["net_b"]
    graph = json.loads((project.root / "build/qnet/qairt/SM8750/net.b.compile.json").read_text())[
        "info"
    ]["graphs"][0]
    assert (graph["name"], graph["inputs"][0]["name"], graph["outputs"][0]["name"]) == (
        "net_b",
        "x_in",
        "y_out",
    )
    assert "verify:qnet@SM8750" in executed


@pytest.mark.parametrize("replace, field", [
    ({"inputs.x =": 'inputs."1x" ='}, "graphs.net-a.inputs.1x"),
    ({"[graphs.net-a]": '[graphs.2net]'}, "graphs.2net"),
])
def test_names_the_converter_cannot_keep_are_refused_at_load(tmp_path, monkeypatch, replace, field):
    sdk_env(monkeypatch, tmp_path)
    project = Project(tmp_path / "proj")
    add_qnet(project, **replace)
    with pytest.raises(SpecError, match=re.escape(f"qnet.toml: {field}: ") + ".*digit"):
        generated(project)


def test_auto_says_which_compiler_it_chose_and_why(tmp_path, monkeypatch, capsys):
    sdk = sdk_env(monkeypatch, tmp_path)
    project = Project(tmp_path / "proj")
    add_qnet(project, **{'compiler = "qairt"': 'compiler = "auto"'})
    generated(project)
    assert (
        f'compiler = "auto" -> qairt: $QNN_SDK_ROOT={sdk} is a complete SDK'
        in capsys.readouterr().out
    )
    # incomplete: said, not silently skipped
    (sdk / "lib/x86_64-linux-clang/libQnnSystem.so").unlink()
    generated(project)
    out = capsys.readouterr().out
    assert f'compiler = "auto" -> ort-qnn: $QNN_SDK_ROOT={sdk} is not a complete SDK' in out
    assert "libQnnSystem.so is missing" in out


def test_qairt_converter_args_are_checked_and_come_last():
    from toolchain.compilers.qairt import tools

    assert (
        tools.converter_arg_problems(["--float_bitwidth", "32", "--use_per_channel_quantization"])
        == []
    )
    assert tools.converter_arg_problems(["--float_bitwidht", "32"])[0].startswith(
        "--float_bitwidht: not a qnn-onnx-converter flag; did you mean '--float_bitwidth'?")
    assert (
        "--input_list is set by the build" in tools.converter_arg_problems(["--input_list", "x"])[0]
    )
    assert tools.converter_arg_problems(["--act_bitwidth"]) == ["--act_bitwidth takes a value"]
    sdk = type("Sdk", (), {"python": "py", "tool": staticmethod(lambda name: name)})()
    argv = tools.converter_argv(sdk, "m.onnx", "m.cpp", None, ("--act_bitwidth", "8"))
    # after the defaults: they win
    assert argv[-4:] == ["--bias_bitwidth", "32", "--act_bitwidth", "8"]
