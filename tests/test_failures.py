"""Failures inside the build: one clear message naming the file and tensor/node, exit 1, and
the outputs of other tasks left as they were."""
import hashlib
import json
import textwrap

MODULE = '''
import onnx
from onnx import helper as h, TensorProto as T


def export(checkpoint, graph, out, settings):
    x = h.make_tensor_value_info("x", T.{in_type}, {in_shape})
    y = h.make_tensor_value_info("y", T.FLOAT, {out_shape})
    nodes = {nodes}
    model = h.make_model(h.make_graph(nodes, "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])
    onnx.save(model, out)
'''

SPEC = '''
module = "handmade"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "handmade.bin"
sha256 = "{sha}"
format = "torch"
[parity]
reference = "none"   # no PyTorch code: the graphs are written by hand
[graphs.net]
inputs.x = {{ shape = [1, 4, 4], dtype = "float32" }}
outputs.y = {{ shape = {out_shape}, dtype = "float32" }}
'''


def handmade(project, nodes, in_type="FLOAT", in_shape="[1, 4, 4]", out_shape="[1, 4, 4]"):
    models = project.root / "models"
    (models / "handmade.py").write_text(MODULE.format(nodes=nodes, in_type=in_type, in_shape=in_shape,
                                                      out_shape=out_shape))
    (models / "handmade.bin").write_bytes(b"weights live in the export code")
    sha = hashlib.sha256(b"weights live in the export code").hexdigest()
    (models / "bad.toml").write_text(textwrap.dedent(SPEC.format(sha=sha, out_shape=out_shape)))


def test_an_op_that_would_fall_back_to_the_cpu_fails_convert_naming_it(project):
    handmade(project, '[h.make_node("Constant", [], ["axes"], value=h.make_tensor("a", T.INT64, [1], [1])),'
                      ' h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Det", ["r"], ["d"], name="det"),'
                      ' h.make_node("Unsqueeze", ["d", "axes"], ["y"], name="unsq")]', out_shape="[1, 1]")
    rc, executed, text = project.run("compile:bad/net@SM8750")
    assert rc == 1, text
    assert "inspect:bad/net" in executed
    assert "build/bad/net/net.onnx: 1 node(s) would run on the CPU, not the HTP: det (Det)" in text
    assert "convert:bad/net" in executed and "modellib:bad/net" not in executed   # the lowering found it
    assert not (project.root / "build/bad/ort-qnn/SM8750/net_qnn.bin").exists()
    assert not (project.root / "build/bad/ort-qnn/net/net.c").exists()
    assert (project.root / "build/bad/ort-qnn/net/net.convert.log").exists()   # kept for reading


def test_a_dynamic_shape_in_the_onnx_fails_inspect_naming_the_tensor(project):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]', in_shape='[1, 4, "T"]', out_shape="[1, 4, 4]")
    rc, _, text = project.run("inspect:bad/net")
    assert rc == 1
    assert "build/bad/net/net.onnx: input 'x': shape [1, 4, 'T'] is dynamic; export with fixed sizes" in text


def test_an_int64_input_in_the_onnx_fails_inspect(project):
    handmade(project, '[h.make_node("Cast", ["x"], ["y"], to=T.FLOAT)]', in_type="INT64")
    rc, _, text = project.run("inspect:bad/net")
    assert rc == 1
    assert "input 'x': int64; the HTP runtimes take int32" in text
    assert "input 'x': dtype int64, models/bad.toml declares float32" in text


def test_a_checkpoint_with_other_bytes_is_refused_with_both_hashes(project):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]')
    (project.root / "models/handmade.bin").write_bytes(b"someone else's weights")
    rc, _, text = project.run("checkpoint:bad")
    assert rc == 1
    pinned = hashlib.sha256(b"weights live in the export code").hexdigest()
    actual = hashlib.sha256(b"someone else's weights").hexdigest()
    assert "models/bad.toml: checkpoint.sha256: " in text and pinned in text and actual in text


def test_a_corrupted_binary_is_rebuilt_before_it_is_verified(project):
    project.add_tiny("tiny")
    rc, _, text = project.run("compile:tiny/net@SM8750")
    assert rc == 0, text
    binary = project.root / "build/tiny/ort-qnn/SM8750/net_qnn.bin"
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF   # weight bytes: the runtime would load it and answer wrongly
    binary.write_bytes(bytes(data))
    clean = json.loads((project.root / "build/tiny/ort-qnn/SM8750/net.compile.json").read_text())["sha256"]
    rc, executed, text = project.run("verify:tiny@SM8750")
    assert rc == 0 and "compile:tiny/net@SM8750" in executed, text   # a target that changed: its task reruns
    assert hashlib.sha256(binary.read_bytes()).hexdigest() == clean     # the same bytes as compiled


def test_a_module_without_torch_runner_fails_parity_in_one_line(project):
    handmade(project, '[h.make_node("Relu", ["x"], ["y"])]')
    project.edit("models/bad.toml", 'reference = "none"', 'reference = "torch"')
    rc, _, text = project.run("parity")
    assert rc == 1 and "models/handmade.py: no torch_runner(checkpoint) function, which the parity stage" in text, text
    assert "AttributeError" not in text


def test_a_failed_verify_names_output_call_and_bound_writes_its_record_and_bisects_that_output(project):
    """Two outputs both lose precision in fp16; `a` is within its declared absolute check, `b` is not. The
    failure names b, the call and both numbers with what "range" means; verify.json holds status "failed"
    and every output's numbers; the bisection follows b's ops (a's come first in the graph)."""
    import shutil

    import onnx
    from conftest import FIXTURES
    project.add_tiny("heads", **{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]',
                                 'module = "tinynet"': 'module = "twoheadnet"',
                                 'outputs.y = { shape = [1, 10], dtype = "float32" }':
                                     'outputs.a = { shape = [1, 32], dtype = "float32" }\n'
                                     'outputs.b = { shape = [1, 10], dtype = "float32" }\n'
                                     'checks.a = { max_abs = 10 }            # multiples of 16: |error| <= 8'})
    shutil.copy(FIXTURES / "twoheadnet.py", project.root / "models")
    rc, executed, text = project.run("verify")
    assert rc == 1, text
    spec = "models/heads.toml"
    line = next(t for t in text.splitlines() if "net/b: call " in t)
    assert " of 3 on generated inputs (inputs and states as the CPU run fed them): max |error| " in line
    assert "of the range" in line and "range = the largest |value| of the CPU output in that call" in line
    assert f"allowed |error| <= 0.02 x range ({spec}: verify.max_rel)" in line, line
    assert "net/a: call" not in text   # within its own check
    record = json.loads((project.root / "build/heads/ort-qnn/SM8750/verify.json").read_text())
    assert record["status"] == "failed" and record["failures"][0].startswith("net/b: call ")
    outputs = record["tensors"]["net"]["outputs"]
    # a passes by its declared absolute bound only: relative to its range it is as far off as b
    assert outputs["a"]["passed"] is True and outputs["a"]["max_abs"] <= 10 and outputs["a"]["max_rel"] > 0.02, outputs
    assert outputs["a"]["check"] == {"max_abs": 10.0}
    assert outputs["b"]["passed"] is False and outputs["b"]["max_rel"] > 0.02
    bisected = next(t for t in record["failures"] if t.startswith("net/b: op "))
    found = bisected.split("net/b: op ")[1].split(" ")[0]
    model = onnx.load(str(project.root / "build/heads/net/net.onnx"))
    names = [n.name for n in model.graph.node]
    first_sub = next(n.name for n in model.graph.node if n.op_type == "Sub")   # a's, first in graph order
    assert found != first_sub and found in names, (found, first_sub, bisected)
    assert not (project.root / "build/heads/ort-qnn/SM8750/manifest.json").exists()
