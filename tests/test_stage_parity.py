"""The parity stage (toolchain/stages/parity.py): PyTorch against the CPU ONNX, before
anything is compiled."""
from __future__ import annotations

import json

from conftest import ONE_CHIP, handmade, sha256


def test_a_module_without_torch_runner_is_refused_at_load_in_one_line(project, capsys):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]')
    project.edit("models/bad.toml", 'reference = "none"', 'reference = "torch"')
    rc, executed, _ = project.run("parity")
    err = capsys.readouterr().err
    assert rc == 3 and executed == [], err
    assert (
        'ERROR: models/bad.toml: parity.reference: "torch" compares the ONNX with the model '
        'code\'s '
        "torch_runner(checkpoint), which models/handmade.py does not define"
    ) in err, err


def test_a_model_failing_its_cpu_check_costs_no_compile(project):
    project.add_tiny("bad", **{**ONE_CHIP, "max_abs = 1e-4": "max_abs = 0"})
    project.add_tiny("good", seed=1, **ONE_CHIP)
    rc, executed, text = project.run("--continue")
    # 2: doit also reports the unmet dependencies
    assert rc in (1, 2) and "parity failed" in text, text
    assert "UnmetDependency - taskid:compile:bad/net@SM8750" in text
    assert "compile:good/net@SM8750" in executed and not [
        t for t in executed if t.startswith("compile:bad")
    ]


REFERENCE = '''
import numpy as np


def reference_runner(checkpoint):
    assert checkpoint is None   # the graph is given as a file: no checkpoint
    return lambda graph, feeds: {"y": np.maximum(feeds["x"], 0.0) * SCALE}


SCALE = 1.0
'''


def test_a_given_onnx_is_held_to_the_modules_own_reference(project):
    """[parity] reference = "module": any code of the model's (numpy here) is the reference,
    whatever the graphs' sources; a given file alone defaults to no reference."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    models = project.root / "models"
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), models / "relu.onnx")
    (models / "relu.py").write_text(REFERENCE)
    (models / "relu.toml").write_text(
        f'module = "relu"\nchips = ["SM8750"]\n[license]\nname = "Apache-2.0"\n[graphs.net]\n'
        f'source = {{ onnx = "relu.onnx", sha256 = "{sha256(models / "relu.onnx")}" }}\n'
        f'inputs.x = {{ shape = [1, 8], dtype = "float32" }}\noutputs.y = {{ shape = [1, 8], dtype '
        f'= "float32" }}\n'
    )
    assert project.run("parity")[1] == []   # no reference declared: none to compare with
    project.edit("models/relu.toml", "[graphs.net]", '[parity]\nreference = "module"\n[graphs.net]')
    rc, executed, text = project.run("parity")
    assert rc == 0 and executed == [
        "export:relu/net",
        "simplify:relu/net",
        "parity:relu/net",
        "parity:relu",
    ], text
    record = json.loads((project.root / "build/relu/parity.json").read_text())
    # which inputs each check used
    assert record["inputs"] == {"tensors": {"net": "generated inputs"}, "samples": []}
    project.edit("models/relu.py", "SCALE = 1.0", "SCALE = 2.0")
    rc, _, text = project.run("parity")
    assert rc == 1 and "parity failed for build/relu/net/net.onnx: net: max abs error" in text, text
