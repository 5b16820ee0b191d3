"""The diagnose stage (toolchain/stages/diagnose.py): the first op whose output departs from the CPU, found on the spot
by a failed verify and by `doit diagnose`, and an LSTM that passes only with the option its spec declares."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import FIXTURES, LSTM, ONE_CHIP, sha256


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
