"""Try a given ONNX in one command (toolchain/check.py, `python -m toolchain check`, `init --from`):
bad input is one line naming the argument or the file (nothing run, nothing written); a small ONNX
with a dynamic axis is pinned, inspected, rewritten and converted by the build's own tasks, and the
spec it used is kept with --write; what stays off the HTP is said per node with the EP's reason and
the rule (or none); and real given ONNX files from installed packages become a project that `doit`
builds and verifies."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest

from toolchain import __main__ as cli

PPOCR_CLS = (
    "rapidocr-onnxruntime==1.4.4:rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
)
JARVIS = "openwakeword==0.4.0:openwakeword/resources/models/hey_jarvis_v0.1.onnx"


def _onnx(path, nodes, inputs, outputs, initializers=()):
    import onnx
    from onnx import helper as h
    graph = h.make_graph(nodes, "g", inputs, outputs, list(initializers))
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def _relu(path, batch="N"):
    """x [N, 8] -> Relu -> y [N, 8]: a dynamic batch axis."""
    from onnx import TensorProto as T
    from onnx import helper as h
    return _onnx(
        path,
        [h.make_node("Relu", ["x"], ["y"], name="relu")],
        [h.make_tensor_value_info("x", T.FLOAT, [batch, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [batch, 8])],
    )


def _refused(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err.strip()


def test_bad_input_is_one_line_naming_the_argument_and_nothing_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    model = str(_relu(tmp_path / "m.onnx"))
    assert _refused(capsys, "check", model) == (
        f"error: {model}: input 'x' has dynamic axes 0 (N): give their "
        f"sizes, --shape x=N,8 with numbers"
    )
    assert _refused(capsys, "check", model, "--shape", "y=1,8") == \
        f"error: --shape y=...: {model} has no input 'y'; its inputs: x"
    assert _refused(capsys, "check", model, "--shape", "x=1") == (
        f"error: --shape x=1: input 'x' of {model} is "
        f"[N, 8]: give a size for each of its 2 axes, and "
        f"the fixed ones as they are"
    )
    assert _refused(capsys, "check", model, "--shape", "x=1,9").startswith(
        "error: --shape x=1,9: input 'x' of "
    )
    assert (
        _refused(capsys, "check", model, "--shape", "x=one,8")
        == "error: --shape x=one,8: expected INPUT=SIZE,SIZE,... with sizes > 0, e.g. --shape "
           "x=1,3,64,64"
    )
    assert _refused(capsys, "check", model, "--chip", "SM8751", "--shape", "x=1,8") == \
        "error: --chip SM8751: unknown chip 'SM8751'; did you mean 'SM8750'?"
    assert _refused(capsys, "check", "nope.onnx") == \
        "error: nope.onnx: no such file (a given ONNX: a file, or package==version:path/in/package)"
    assert (
        _refused(capsys, "check", "no-such-dist==1.0:x/m.onnx", "--shape", "x=1,8")
        == "error: no-such-dist==1.0:x/m.onnx: package: no-such-dist is not installed: pip install "
           "'no-such-dist==1.0'"
    )
    from onnx import TensorProto as T
    from onnx import helper as h
    wide = str(_onnx(tmp_path / "i64.onnx", [h.make_node("Identity", ["ids"], ["out"])],
                     [h.make_tensor_value_info("ids", T.INT64, [1, 4])],
                     [h.make_tensor_value_info("out", T.INT64, [1, 4])]))
    assert _refused(capsys, "check", wide) == (
        f"error: {wide}: input 'ids' is int64; the HTP runtimes take float32, "
        f"float16, int32 at graph I/O, and a given ONNX keeps its interface: "
        f"bring one whose inputs are among them"
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models/m.toml").write_text("# mine\n")
    assert _refused(capsys, "check", model, "--shape", "x=1,8", "--write", "models/m.toml") == \
        "error: --write models/m.toml: already exists; check writes only a new spec"
    assert _refused(capsys, "init", "proj", "--shape", "x=1,8") == \
        "error: init: --shape only with --from (a given ONNX); the example is for SM8750"
    assert (
        _refused(capsys, "init", "proj", "--from", model)
        == f"error: {model}: input 'x' has dynamic axes 0 (N): give their sizes, --shape x=N,8 "
           "with numbers"
    )
    # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i64.onnx", "m.onnx", "models"]
    assert (tmp_path / "models/m.toml").read_text() == "# mine\n"


def test_a_small_onnx_is_pinned_converted_and_its_spec_kept(tmp_path, capsys, monkeypatch):
    """The CI test: a Relu with a dynamic batch, through the build's own export, simplify,
    inspect, rewrite, convert."""
    monkeypatch.chdir(tmp_path)
    model = str(_relu(tmp_path / "relu.onnx"))
    assert cli.main(["check", model, "--shape", "x=1,8", "--write", "models/relu.toml"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [
        "  input x: [1, 8] float32 (pinned: axis 0 N -> 1)",
        "  output y: [1, 8] float32",
    ], out
    assert "inspect: 1 nodes, 0 parameters, opset 17: static, batch 1, I/O as declared" in out
    assert 'rewrite "auto": no rule needed' in out
    assert any(line.startswith("convert: nothing stays off the HTP: ") for line in out), out
    assert (
        out[-1].startswith("next: doit")
        and "wrote models/relu.toml" in out
        and "wrote models/given.py" in out
    )
    spec = tomllib.loads((tmp_path / "models/relu.toml").read_text())
    sha = hashlib.sha256((tmp_path / "relu.onnx").read_bytes()).hexdigest()
    assert spec["graphs"]["net"]["source"] == {"onnx": "../relu.onnx", "sha256": sha}
    assert spec["graphs"]["net"]["inputs"] == {"x": {"shape": [1, 8], "dtype": "float32"}}
    assert spec["graphs"]["net"]["outputs"] == {"y": {"shape": [1, 8], "dtype": "float32"}}
    assert spec["graphs"]["net"]["rewrite"] == "auto" and spec["chips"] == ["SM8750"]
    assert "check applied none" in (tmp_path / "models/relu.toml").read_text()
    assert not (tmp_path / "build").exists()   # the check's own build was in a throw-away folder


def test_compile_too_compiles_for_the_chip_and_verifies_in_the_simulator(tmp_path, capsys):
    model = str(_relu(tmp_path / "relu.onnx"))
    assert cli.main(["check", model, "--shape", "x=1,8", "--chip", "SM8550", "--compile"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(
        re.fullmatch(r"compile \(SM8550\): \d+\.\d\d MB context binary", line) for line in out
    ), out
    assert any(
        re.fullmatch(
            r"verify \(SM8550, HTP simulator vs CPU, generated inputs\): passed: y max rel \S+",
            line,
        )
        for line in out
    ), out


def test_what_stays_off_the_htp_is_said_per_node_with_the_eps_reason(tmp_path, capsys):
    """A Det, which the QNN EP does not lower and no rule of the library rewrites: the convert says
    so, per node."""
    from onnx import TensorProto as T
    from onnx import helper as h
    axes = h.make_tensor("axes", T.INT64, [1], [1])
    model = str(
        _onnx(
            tmp_path / "det.onnx",
            [
                h.make_node("Relu", ["x"], ["r"], name="relu"),
                h.make_node("Det", ["r"], ["d"], name="det"),
                h.make_node("Unsqueeze", ["d", "axes"], ["y"], name="unsq"),
            ],
            [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 4])],
            [h.make_tensor_value_info("y", T.FLOAT, [1, 1])],
            [axes],
        )
    )
    assert cli.main(["check", model]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "convert: 1 node(s) stay off the HTP:" in out, out
    off = out[out.index("convert: 1 node(s) stay off the HTP:") + 1]
    # the EP's words
    assert off.startswith("  det (Det): Operators of type `Det` are not supported by QNN EP."), off
    assert off.endswith("; no rule of the library applies"), off
    failed = [line for line in out if line.startswith("FAILED ")]
    assert len(failed) == 1 and failed[0].startswith(
        "FAILED convert:det/net (in check's throw-away build): build/det"
        "/net/net.onnx: 1 node(s) would run on the CPU"
    ), failed


def _installed(requirement: str) -> bool:
    name, _, version = requirement.partition("==")
    try:
        return metadata.version(name) == version
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    not _installed("openwakeword==0.4.0"), reason="openwakeword==0.4.0 not installed"
)
def test_a_real_given_onnx_gets_the_rules_it_needs_named(tmp_path, capsys):
    """openWakeWord's hey_jarvis detector as its package ships it: an If and four Pow the
    HTP needs rewritten."""
    assert cli.main(["check", JARVIS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("rewrite 'if-as-where' on 1 node(s): ") for line in out), out
    assert any(line.startswith("rewrite 'pow-square-as-mul' on 4 node(s)") for line in out), out
    assert "rewrites proven on the CPU: the rewritten graph computes what the given one does" in out
    assert any(line.startswith("convert: nothing stays off the HTP") for line in out), out


@pytest.mark.skipif(
    not _installed("rapidocr-onnxruntime==1.4.4"),
    reason="rapidocr-onnxruntime==1.4.4 not installed",
)
def test_init_from_a_packaged_onnx_makes_a_project_doit_builds_and_verifies(tmp_path):
    """PP-OCR's text-direction classifier (paddle2onnx, dynamic N, H, W) from its package, as a
    user runs it."""
    proj = tmp_path / "ocr"
    missing = subprocess.run(
        [sys.executable, "-m", "toolchain", "init", str(proj), "--from", PPOCR_CLS],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.startswith(f"error: {PPOCR_CLS}: input 'x' has dynamic axes 0 ("), (
        missing.stderr
    )
    assert not proj.exists()
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolchain",
            "init",
            str(proj),
            "--from",
            PPOCR_CLS,
            "--shape",
            "x=1,3,48,192",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "convert: nothing stays off the HTP" in made.stdout, made.stdout
    spec = tomllib.loads((proj / "models/ch_ppocr_mobile_v2.0_cls_infer.toml").read_text())
    net = spec["graphs"]["net"]
    assert net["source"]["package"] == "rapidocr-onnxruntime==1.4.4" and net["inputs"]["x"][
        "shape"
    ] == [1, 3, 48, 192]
    assert net["outputs"] == {
        "save_infer_model/scale_0.tmp_1": {"shape": [1, 2], "dtype": "float32"}
    }
    assert sorted(p.name for p in proj.iterdir()) == [".gitignore", "dodo.py", "models"]
    built = subprocess.run(
        [sys.executable, "-m", "doit"],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "CI": "1"},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    manifest = json.loads(
        (proj / "build/ch_ppocr_mobile_v2.0_cls_infer/ort-qnn/SM8750/manifest.json").read_text()
    )
    assert manifest["verify"]["default"]["status"] == "passed"
