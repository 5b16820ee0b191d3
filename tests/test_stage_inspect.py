"""The inspect stage (toolchain/stages/inspect.py): an ONNX the HTP cannot take as it is (a dynamic
shape, an int64 input, more fp16 parameters than a context holds) fails before any compile, naming
the tensor and the fix."""
from __future__ import annotations

from conftest import handmade


def test_a_dynamic_shape_in_the_onnx_fails_inspect_naming_the_tensor(project):
    handmade(
        project,
        '[h.make_node("Relu", ["x"], ["y"])]',
        in_shape='[1, 4, "T"]',
        out_shape="[1, 4, 4]",
    )
    rc, _, text = project.run("inspect:bad/net")
    assert rc == 1
    assert (
        "build/bad/net/net.onnx: input 'x': shape [1, 4, 'T'] is dynamic; export with fixed sizes"
        in text
    )


def test_an_int64_input_in_the_onnx_fails_inspect(project):
    handmade(project, '[h.make_node("Cast", ["x"], ["y"], to=T.FLOAT)]', in_type="INT64")
    rc, _, text = project.run("inspect:bad/net")
    assert rc == 1
    assert "input 'x': int64; the HTP runtimes take int32" in text
    assert "input 'x': dtype int64, models/bad.toml declares float32" in text


def test_a_graph_over_the_fp16_size_limit_is_refused_before_compiling(project):
    project.add_tiny("tiny", **{"[parity]": "[compile]\nmax_fp16_params = 1000\n\n[parity]"})
    rc, executed, text = project.run()
    assert rc == 1
    assert "M parameters" in text and "exceed the per-context limit of 0.0 M" in text
    assert (
        'declare the graph precision = "w8a16"' in text and "split it into several graphs" in text
    )
    assert not [t for t in executed if t.startswith("compile:")]


def test_a_shape_mismatch_says_which_side_to_change():
    """An output's shape follows from the inputs: the spec changes; an input's is what the app
    feeds: the export changes, unless the app feeds what the ONNX takes."""
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.stages import inspect

    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8])],
    )
    declared = {
        "inputs": [["x", [1, 4, 16], "float32"]],
        "outputs": [["y", [1, 4, 16], "float32"]],
        "batch_axes": {},
    }
    assert inspect.problems(h.make_model(graph), declared, "models/m.toml", "net") == [
        "input 'x': shape [1, 4, 8] in the ONNX, models/m.toml declares [1, 4, 16]: the spec is "
        "what the app feeds, "
        "so make export() build the graph with an input of [1, 4, 16] (its example input's shape), "
        "or, if the app "
        "feeds [1, 4, 8], declare graphs.net.inputs.x shape = [1, 4, 8]",
        "output 'y': shape [1, 4, 8] in the ONNX, models/m.toml declares [1, 4, 16]: an output's "
        "shape follows from "
        "the inputs, so declare graphs.net.outputs.y shape = [1, 4, 8] (or change the graph, if it "
        "must make "
        "[1, 4, 16])",
    ]
