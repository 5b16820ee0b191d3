"""Models nobody tuned for (issue 15): compiler options per graph in the spec, the first op that departs
(diagnose), a given ONNX with dynamic axes from an installed package, any checkpoint format, the model
code's own packages, cheap CPU checks before compiles."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import FIXTURES, ROOT, Project, sha256

ONE_CHIP = {'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]'}
NET = "[graphs.net]\n"


def compile_options(text: str) -> dict:
    """tiny.toml replacements declaring [graphs.net.compile] `text`."""
    return {**ONE_CHIP, NET: f'{NET}compile.{text}\n'}


@pytest.mark.parametrize("declared, message", [
    ("ep_options = { enable_htp_monolitic_lstm = true }",
     "graphs.net.compile.ep_options.enable_htp_monolitic_lstm: not an option of the QNN EP; "
     "did you mean 'enable_htp_monolithic_lstm'?"),
    ("ep_options = { vtcm_mb = 4 }", "graphs.net.compile.ep_options.vtcm_mb: set by the chip table"),
    ('ep_options = { enable_htp_monolithic_lstm = "yes" }',
     "enable_htp_monolithic_lstm: 'yes': expected true or false (1 or 0)"),
    ('converter_args = ["--act_bitwidth", "8"]', "graphs.net.compile.converter_args: unknown key (that is a QAIRT option)"),
    ("ep_options = { htp_performance_mode = [1] }", "htp_performance_mode: [1]: expected burst, balanced"),
])
def test_a_compiler_option_is_checked_at_load_naming_the_field(project, declared, message):
    project.add_tiny(**compile_options(declared))
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and cli.stderr.startswith("ERROR: ") and message in cli.stderr, cli.stderr
    assert "tiny.toml" in cli.stderr and "Traceback" not in cli.stderr


def test_an_ep_option_recompiles_that_graph_only_and_is_recorded(project):
    project.add_tiny("tiny", **ONE_CHIP)
    project.add_tiny("other", seed=1, **ONE_CHIP)
    rc, _, text = project.run()
    assert rc == 0, text
    # an option the Saver route cannot reproduce: the graph compiles with the EP directly (docs/design-card.md)
    project.edit("models/tiny.toml", NET, f'{NET}compile.route = "ep"\n'
                 f"compile.ep_options = {{ enable_htp_fp16_clamp_overflow = true }}\n")
    rc, executed, text = project.run()
    assert rc == 0, text
    assert {"compile:tiny/net@SM8750", "verify:tiny@SM8750", "manifest:tiny@SM8750"} <= set(executed)
    assert not [t for t in executed if "other" in t or t.split(":")[0] in ("export", "simplify", "parity")], executed
    compiled = json.loads((project.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())
    assert compiled["options"]["enable_htp_fp16_clamp_overflow"] == "1"
    manifest = json.loads((project.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["compile_options"] == {"net": {"route": "ep", "ep_options": {"enable_htp_fp16_clamp_overflow": True}}}
    assert manifest["binaries"]["net"]["options"]["enable_htp_fp16_clamp_overflow"] == "1"
    assert project.run()[1] == []


# ---- diagnose ----------------------------------------------------------------------------------------------

def test_diagnose_names_the_first_op_that_departs(project, capsys):
    """offsetnet adds 2e4 and takes it away: in fp16 the Sub's output (the hidden values) loses them."""
    project.add_tiny("offset", **{**ONE_CHIP, 'module = "tinynet"': 'module = "offsetnet"'})
    shutil.copy(FIXTURES / "offsetnet.py", project.root / "models")
    rc, _, text = project.run("verify")
    assert rc == 1 and "net/y: call " in text and "`doit diagnose:offset@SM8750`" in text, text
    assert "net/y: op /Sub (Sub) is the first whose output /Sub_output_0 departs" in text   # found on the spot
    capsys.readouterr()
    rc, executed, text = project.run("diagnose:offset@SM8750")
    assert rc == 0 and executed == ["diagnose:offset@SM8750"], text
    said = capsys.readouterr().out   # the summary action prints to the console, the step to its log
    assert "net: op /Sub (Sub) is the first whose output /Sub_output_0 departs from the CPU" in said
    assert "the op before it, /Add (Add), is within" in said
    found = json.loads((project.root / "build/offset/ort-qnn/SM8750/diagnose.json").read_text())["net"]
    assert found["first_divergent"]["op"] == "/Sub" and found["first_divergent"]["max_rel"] > 0.5
    assert found["last_within"]["op"] == "/Add" and found["last_within"]["max_rel"] < 0.02
    assert found["compiles"] < found["ops"] + 1 and found["checked"][-1]["op_type"] == "Gemm"
    assert project.run("diagnose:offset@SM8750")[1] == []   # incremental like every task


def test_diagnose_of_a_model_within_its_limits_says_so(project):
    project.add_tiny(**ONE_CHIP)
    rc, _, text = project.run("diagnose")
    assert rc == 0, text
    found = json.loads((project.root / "build/tiny/ort-qnn/SM8750/diagnose.json").read_text())["net"]
    assert found["first_divergent"] is None and found["compiles"] == 1


# ---- a given ONNX with dynamic axes, from an installed package -----------------------------------------------

def ppocr(project: Project, shape=(64, 64)) -> Project:
    """models/extra/ppocr-det.toml for one chip, at the given H, W."""
    models = project.root / "models"
    shutil.copy(ROOT / "models/ppocr_det.py", models)
    text = (ROOT / "models/extra/ppocr-det.toml").read_text().replace('module = "../ppocr_det"', 'module = "ppocr_det"')
    text = text.replace('chips = ["SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"]', 'chips = ["SM8750"]')
    text = text.replace("[1, 3, 64, 64]", f"[1, 3, {shape[0]}, {shape[1]}]").replace("[1, 1, 64, 64]",
                                                                                    f"[1, 1, {shape[0]}, {shape[1]}]")
    (models / "ppocr-det.toml").write_text(text)
    return project


def test_a_dynamic_axis_onnx_from_an_installed_package_builds_from_the_toml_alone(project):
    rc, executed, text = ppocr(project).run()
    assert rc == 0, text
    assert {"export:ppocr-det/det", "compile:ppocr-det/det@SM8750", "verify:ppocr-det@SM8750"} <= set(executed)
    record = json.loads((project.root / "build/ppocr-det/det/export.json").read_text())
    assert record["pinned"] == {"x": {"0": "p2o.DynamicDimension.0 -> 1", "2": "p2o.DynamicDimension.1 -> 64",
                                      "3": "p2o.DynamicDimension.2 -> 64"}}
    assert record["settings"]["onnx"].startswith("pypi:rapidocr-onnxruntime==1.4.4/")
    assert record["onnx_sha256"] == sha256(project.root / "build/ppocr-det/det/export.onnx")
    manifest = json.loads((project.root / "build/ppocr-det/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["verify"]["default"]["tensors"]["det"]["cosine"] > 0.999


def test_a_shape_the_model_cannot_take_is_one_line(project):
    rc, _, text = ppocr(project, shape=(48, 64)).run("export")
    assert rc == 1 and "shapes pinned to the spec's {'x': [1, 3, 48, 64]} do not fit the model" in text, text


def test_an_output_axis_that_depends_on_data_is_named(project):
    """NonZero's output length depends on the values: no input shape fixes it."""
    models = project.root / "models"
    subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import onnx
        from onnx import helper as h, TensorProto as T
        g = h.make_graph([h.make_node("NonZero", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                         [h.make_tensor_value_info("y", T.INT64, [2, "k"])])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), "nz.onnx")""")], cwd=models, check=True)
    (models / "plain.py").write_text('"""No export code: the ONNX is given."""\n')
    (models / "nz.toml").write_text(textwrap.dedent(f'''
        module = "plain"
        chips = ["SM8750"]
        [license]
        name = "Apache-2.0"
        [parity]
        reference = "none"
        [graphs.net]
        source = {{ onnx = "nz.onnx", sha256 = "{sha256(models / 'nz.onnx')}" }}
        inputs.x = {{ shape = [1, 4], dtype = "float32" }}
        outputs.y = {{ shape = [2, 4], dtype = "int32", batch_axis = -1 }}
        '''))
    rc, _, text = project.run("export")
    assert rc == 1 and "output y axis 1 (k) stays dynamic with the inputs pinned: it depends on data" in text, text


# ---- checkpoint format, requires, fail fast ----------------------------------------------------------------

def test_any_checkpoint_format_reaches_the_model_code(project):
    project.add_tiny(**{**ONE_CHIP, 'format = "torch"': 'format = "tinynet-v1"'})
    rc, executed, text = project.run("checkpoint")
    assert rc == 0 and executed == ["checkpoint:tiny"], text
    project.edit("models/tinynet.py", "def make_checkpoint", 'def prepare_checkpoint(src, out, fmt):\n'
                 '    raise ValueError(f"format {fmt!r} is not one this code reads")\n\n\ndef make_checkpoint')
    rc, _, text = project.run("checkpoint")
    assert rc == 1 and "checkpoint.format = 'tinynet-v1': " in text and "is not one this code reads" in text, text
    assert "Traceback" not in text


@pytest.mark.parametrize("requires, message", [
    ('["qnn-no-such-package==1.0"]', "requires: qnn-no-such-package is not installed: pip install 'qnn-no-such-package==1.0'"),
    ('["numpy<2"]', "requires: numpy 2."),
    ('["numpy>>2"]', "requires: 'numpy>>2' is not a requirement"),
])
def test_the_model_codes_packages_are_checked_at_load(project, requires, message):
    project.add_tiny(**{**ONE_CHIP, 'module = "tinynet"': f'module = "tinynet"\nrequires = {requires}'})
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and message in cli.stderr and "Traceback" not in cli.stderr, cli.stderr


def test_the_model_codes_packages_are_recorded(project):
    project.add_tiny(**{**ONE_CHIP, 'module = "tinynet"': 'module = "tinynet"\nrequires = ["numpy>=2"]'})
    rc, _, text = project.run()
    assert rc == 0, text
    import numpy
    manifest = json.loads((project.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["tools"]["model_code"] == {"numpy>=2": numpy.__version__}


def test_a_model_failing_its_cpu_check_costs_no_compile(project):
    project.add_tiny("bad", **{**ONE_CHIP, "max_abs = 1e-4": "max_abs = 0"})
    project.add_tiny("good", seed=1, **ONE_CHIP)
    rc, executed, text = project.run("--continue")
    assert rc in (1, 2) and "parity failed" in text, text   # 2: doit also reports the unmet dependencies
    assert "UnmetDependency - taskid:compile:bad/net@SM8750" in text
    assert "compile:good/net@SM8750" in executed and not [t for t in executed if t.startswith("compile:bad")]


def test_the_projects_wav_reader_for_model_code(tmp_path):
    import wave

    import numpy as np
    import toolchain.audio
    samples = (np.sin(np.arange(1600) / 10) * 16000).astype("<i2")
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.stack([samples, samples], axis=1).tobytes())
    got = toolchain.audio.read_wav(tmp_path / "a.wav")
    assert got.dtype == np.float32 and np.allclose(got, samples / 32768.0)
    with pytest.raises(ValueError, match="a.wav: 16000 Hz; expected 8000 Hz"):
        toolchain.audio.read_wav(tmp_path / "a.wav", rate=8000)


LSTM = '''
description = "speaker LSTM: mels -> 128-d embedding"
module = "lstmnet"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "lstm.pt"
sha256 = "{sha}"
format = "torch"
[export]
exporter = "legacy"
opset = 17
[verify]
max_rel = 0.02
min_cosine = 0.999
[graphs.embedder]
inputs.mels = {{ shape = [1, 100, 40], dtype = "float32" }}
outputs.embed = {{ shape = [1, 128], dtype = "float32" }}
'''


def test_an_lstm_passes_verify_only_with_the_option_its_spec_declares(project):
    models = project.root / "models"
    shutil.copy(FIXTURES / "lstmnet.py", models)
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(models)!r}); import lstmnet; "
                    f"lstmnet.make_checkpoint({str(models / 'lstm.pt')!r})"], check=True)
    (models / "lstm.toml").write_text(LSTM.format(sha=sha256(models / "lstm.pt")))
    rc, _, text = project.run()
    assert rc == 1 and "build/lstm/ort-qnn/SM8750/embedder_qnn.bin: embedder/embed: call " in text, text
    assert "embedder/embed: op /lstm/LSTM (LSTM) is the first whose output" in text   # the failed verify bisected it
    rc, _, text = project.run("diagnose")   # names the op the option is for
    assert rc == 0, text
    found = json.loads((project.root / "build/lstm/ort-qnn/SM8750/diagnose.json").read_text())["embedder"]
    assert found["first_divergent"]["op_type"] == "LSTM" and found["last_within"]["op_type"] == "Transpose"
    project.edit("models/lstm.toml", "[graphs.embedder]\n",
                 "[graphs.embedder]\ncompile.ep_options = { enable_htp_monolithic_lstm = true }\n")
    rc, executed, text = project.run()
    assert rc == 0, text
    assert "compile:lstm/embedder@SM8750" in executed and "export:lstm/embedder" not in executed
    errors = json.loads((project.root / "build/lstm/ort-qnn/SM8750/verify.json").read_text())["tensors"]["embedder"]
    assert errors["max_rel"] < 0.02 and errors["cosine"] > 0.999


def test_qairt_converter_args_are_checked_and_come_last():
    from toolchain.backends.qairt import tools
    assert tools.converter_arg_problems(["--float_bitwidth", "32", "--use_per_channel_quantization"]) == []
    assert tools.converter_arg_problems(["--float_bitwidht", "32"])[0].startswith(
        "--float_bitwidht: not a qnn-onnx-converter flag; did you mean '--float_bitwidth'?")
    assert "--input_list is set by the build" in tools.converter_arg_problems(["--input_list", "x"])[0]
    assert tools.converter_arg_problems(["--act_bitwidth"]) == ["--act_bitwidth takes a value"]
    sdk = type("Sdk", (), {"python": "py", "tool": staticmethod(lambda name: name)})()
    argv = tools.converter_argv(sdk, "m.onnx", "m.cpp", None, ("--act_bitwidth", "8"))
    assert argv[-4:] == ["--bias_bitwidth", "32", "--act_bitwidth", "8"]   # after the defaults: they win
