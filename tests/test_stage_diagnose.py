"""The diagnose stage (toolchain/stages/diagnose.py): the first op whose output departs from the
CPU, found on the spot by a failed verify and by `doit diagnose`, and an LSTM that passes only with
the option its spec declares."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import FIXTURES, LSTM, ONE_CHIP, sha256


def test_diagnose_names_the_first_op_that_departs(project, capsys):
    """offsetnet adds 2e4 and takes it away: in fp16 the Sub's output (the hidden
    values) loses them."""
    project.add_tiny("offset", **{**ONE_CHIP, 'module = "tinynet"': 'module = "offsetnet"'})
    shutil.copy(FIXTURES / "offsetnet.py", project.root / "models")
    rc, _, text = project.run("verify")
    assert rc == 1 and "net/y: call " in text and "`doit diagnose:offset@SM8750`" in text, text
    # found on the spot
    assert "net/y: op /Sub (Sub) is the first whose output /Sub_output_0 departs" in text
    capsys.readouterr()
    rc, executed, text = project.run("diagnose:offset@SM8750")
    assert rc == 0 and executed == ["diagnose:offset@SM8750"], text
    said = capsys.readouterr().out   # the summary action prints to the console, the step to its log
    assert "net: op /Sub (Sub) is the first whose output /Sub_output_0 departs from the CPU" in said
    assert "the op before it, /Add (Add), is within" in said
    found = json.loads((project.root / "build/offset/ort-qnn/SM8750/diagnose.json").read_text())[
        "net"
    ]
    assert found["first_divergent"]["op"] == "/Sub" and found["first_divergent"]["max_rel"] > 0.5
    assert found["last_within"]["op"] == "/Add" and found["last_within"]["max_rel"] < 0.02
    assert found["compiles"] < found["ops"] + 1 and found["checked"][-1]["op_type"] == "Gemm"
    assert project.run("diagnose:offset@SM8750")[1] == []   # incremental like every task


def test_diagnose_of_a_model_within_its_limits_says_so(project):
    project.add_tiny(**ONE_CHIP)
    rc, _, text = project.run("diagnose")
    assert rc == 0, text
    found = json.loads((project.root / "build/tiny/ort-qnn/SM8750/diagnose.json").read_text())[
        "net"
    ]
    assert found["first_divergent"] is None and found["compiles"] == 1


def test_an_lstm_passes_verify_only_with_the_option_its_spec_declares(project):
    models = project.root / "models"
    shutil.copy(FIXTURES / "lstmnet.py", models)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(models)!r}); import lstmnet; "
            f"lstmnet.make_checkpoint({str(models / 'lstm.pt')!r})",
        ],
        check=True,
    )
    (models / "lstm.toml").write_text(LSTM.format(sha=sha256(models / "lstm.pt")))
    rc, _, text = project.run()
    assert (
        rc == 1 and "build/lstm/ort-qnn/SM8750/embedder_qnn.bin: embedder/embed: call " in text
    ), text
    # the failed verify bisected it
    assert "embedder/embed: op /lstm/LSTM (LSTM) is the first whose output" in text
    rc, _, text = project.run("diagnose")   # names the op the option is for
    assert rc == 0, text
    found = json.loads((project.root / "build/lstm/ort-qnn/SM8750/diagnose.json").read_text())[
        "embedder"
    ]
    assert (
        found["first_divergent"]["op_type"] == "LSTM"
        and found["last_within"]["op_type"] == "Transpose"
    )
    project.edit("models/lstm.toml", "[graphs.embedder]\n",
                 "[graphs.embedder]\ncompile.ep_options = { enable_htp_monolithic_lstm = true }\n")
    rc, executed, text = project.run()
    assert rc == 0, text
    assert "compile:lstm/embedder@SM8750" in executed and "export:lstm/embedder" not in executed
    errors = json.loads((project.root / "build/lstm/ort-qnn/SM8750/verify.json").read_text())[
        "tensors"
    ]["embedder"]
    assert errors["max_rel"] < 0.02 and errors["cosine"] > 0.999


def two_branches(path):
    """y = 2 * Pow(x, 2) + b8(...b1(x)): the Pow early on one branch, eight ops of the other branch
    after it in graph order, the branches joined last."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    nodes = [h.make_node("Pow", ["x", "two"], ["a1"], name="/a/Pow")]
    previous = "x"
    for i in range(1, 9):
        nodes.append(
            h.make_node("Abs" if i % 2 else "Neg", [previous], [f"b{i}"], name=f"/b/op{i}")
        )
        previous = f"b{i}"
    nodes += [h.make_node("Mul", ["a1", "two"], ["a2"], name="/a/Mul"),
              h.make_node("Add", ["a2", previous], ["y"], name="/join/Add")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
                         initializer=[h.make_tensor("two", T.FLOAT, [], [2.0])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    # typed intermediates, as onnxsim leaves them
    onnx.save(onnx.shape_inference.infer_shapes(model), path)


def faulty_compiler(op: str, folder):
    """A compiler that gets one op wrong (its output + 1), and every other op right (the CPU): as
    the HTP computes Pow(-0.0, 2) in fp16 (issue 31). Each piece is run with the fault put in."""
    import onnx
    from onnx import helper as h

    from toolchain.shared import modeldata

    def compile_piece(path):
        piece = onnx.load(path)
        for node in list(piece.graph.node):
            if node.name == op:
                wrong = node.output[0]
                node.output[0] = wrong + "_right"
                piece.graph.node.append(h.make_node("Add", [wrong + "_right", "one"], [wrong]))
                piece.graph.initializer.append(h.make_tensor("one", 1, [], [1.0]))
        faulty = str(folder / f"faulty-{len(list(folder.iterdir()))}.onnx")
        onnx.save(piece, faulty)
        return modeldata.cpu(faulty)
    return compile_piece


def test_diagnose_follows_the_data_to_the_bad_op_on_another_branch(tmp_path):
    """The fault sits on the first op of one branch; the other branch's eight ops come after it in
    graph order. The bisection of old assumed one chain, stepped over the Pow and blamed the Mul
    after it; following the data names the Pow, and the Pow run alone on the CPU's values of its
    inputs confirms it."""
    import numpy as np
    import onnx

    from toolchain.stages import diagnose
    two_branches(tmp_path / "g.onnx")
    model = onnx.load(tmp_path / "g.onnx")
    (tmp_path / "pieces").mkdir()
    feeds = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)}
    limits = {"max_rel": 0.02, "min_cosine": 0.999}
    found = diagnose.bisect(model, feeds, faulty_compiler("/a/Pow", tmp_path / "pieces"), limits,
                            str(tmp_path / "scratch"))
    assert found["first_divergent"]["op"] == "/a/Pow", found["verdict"]
    assert found["last_within"] is None   # nothing before it on its branch: the input
    assert found["alone"]["max_rel"] > 0.02   # confirmed alone: the op's own fault
    assert "alone, fed the CPU's inputs, it is wrong too" in diagnose._line(found)
    right = diagnose.bisect(model, feeds, faulty_compiler("/nothing", tmp_path / "pieces"), limits,
                            str(tmp_path / "scratch2"))
    assert right["first_divergent"] is None and right["compiles"] == 1
    on_b = diagnose.bisect(model, feeds, faulty_compiler("/b/op5", tmp_path / "pieces"), limits,
                           str(tmp_path / "scratch3"))
    assert on_b["first_divergent"]["op"] == "/b/op5" and on_b["last_within"]["op"] == "/b/op4"


def test_a_limit_below_fp16s_step_is_said_before_the_op_and_is_no_fault_of_it():
    """The op found is then fp16's own rounding: the line says the limit cannot be held first, and
    does not call the op at fault; with a limit fp16 can hold, the same numbers blame the op."""
    from toolchain.stages import diagnose

    found = {
        "verdict": "op /conv/Conv (Conv) is the first whose output /conv/Conv_output_0 departs "
                   "from the CPU",
        "first_divergent": {"max_rel": 0.0007, "cosine": 0.99999},
        "last_within": None,
        "compiles": 2,
        "alone": {"max_rel": 0.0006, "cosine": 0.99999},
        "limits": {"max_rel": 1e-5, "min_cosine": 0.0},
    }
    line = diagnose._line(found)
    assert line.startswith("the bound max_rel 1e-05 is below what fp16 can hold"), line
    assert line.index("fp16 can hold") < line.index("op /conv/Conv") and "own fault" not in line
    assert "it is off too (max error 0.0006): fp16's own rounding" in line
    still_tight = diagnose._line({**found, "limits": {"max_rel": 5e-5, "min_cosine": 0.0},
                                  "alone": {"max_rel": 0.3, "cosine": 0.9}})
    assert "the op's own fault" not in still_tight   # 5e-05: still below one fp16 step
    held = diagnose._line({**found, "limits": {"max_rel": 0.02, "min_cosine": 0.0},
                           "alone": {"max_rel": 0.3, "cosine": 0.9}})
    assert held.startswith("op /conv/Conv") and held.endswith("the op's own fault [2 compiles]")
