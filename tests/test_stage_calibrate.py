"""Calibration (toolchain/stages/calibrate.py) and the w8a16 build it feeds: the calibration set as
raw files in the toolchain's layout, never the verify clips, and a w8a16 graph for a chip without
fp16 that stays close (one build; the tests below change it in order)."""
from __future__ import annotations

import json

import onnx
import pytest
from conftest import W8A16


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from conftest import Project
    p = Project(tmp_path_factory.mktemp("w8a16") / "proj")
    p.add_tiny("tiny", **W8A16)
    rc, executed, text = p.run()
    assert rc == 0, text
    return p


def test_calibration_set_is_raw_native_dtype_one_line_per_sample(quantized):
    folder = quantized.root / "build/tiny/net/calibration"
    lines = (folder / "input_list.txt").read_text().splitlines()
    assert lines == [f"{i:04d}-x.raw" for i in range(8)]        # one file per graph input, in order
    assert (folder / "0000-x.raw").stat().st_size == 1 * 4 * 16 * 4   # headerless float32 [1,4,16]
    record = json.loads((folder / "calibration.json").read_text())
    assert record["count"] == 8 and record["inputs"] == [["x", [1, 4, 16], "float32"]]


def test_w8a16_builds_for_a_chip_without_fp16_and_stays_close(quantized):
    model = onnx.load(quantized.root / "build/tiny/net/net.w8a16.onnx")
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert all(i.data_type not in (2, 3)
               for i in onnx.load(quantized.root / "build/tiny/net/net.onnx").graph.initializer)
    for chip in ("SM8350", "SM8750"):
        m = json.loads((quantized.root / f"build/tiny/ort-qnn/{chip}/manifest.json").read_text())
        assert m["precision"] == {"net": "w8a16"}
        assert m["binaries"]["net"]["config"]["soc_type"] == chip
        # the declared w8a16 bound
        assert m["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.2


def test_changing_the_calibration_count_rebuilds_calibrate_to_verify_only(quantized):
    quantized.edit("models/tiny.toml", "calibration = 8", "calibration = 12")
    rc, executed, _ = quantized.run()
    assert rc == 0
    assert {t.split(":")[0] for t in executed} == {
        "calibrate",
        "quantize",
        "convert",
        "modellib",
        "compile",
        "verify",
        "manifest",
        "report",
    }
    lines = (quantized.root / "build/tiny/net/calibration/input_list.txt").read_text().splitlines()
    assert len(lines) == 12


def test_calibration_layout_follows_the_toolchain_and_reads_back_the_same(tmp_path):
    # The embedded toolchain reads ONNX layout; qnn-onnx-converter --use_native_input_files
    # reads QNN's (3-D last two axes swapped, 4-D NHWC). Both sets must read back as the
    # same ONNX-layout feeds.
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.stages import calibrate

    g = h.make_graph(
        [h.make_node("Identity", ["a"], ["a2"]), h.make_node("Identity", ["b"], ["b2"])],
        "g",
        [
            h.make_tensor_value_info("a", T.FLOAT, [1, 2, 3]),
            h.make_tensor_value_info("b", T.FLOAT, [1, 2, 3, 4]),
        ],
        [
            h.make_tensor_value_info("a2", T.FLOAT, [1, 2, 3]),
            h.make_tensor_value_info("b2", T.FLOAT, [1, 2, 3, 4]),
        ],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    # no graph_feeds: seeded generated inputs
    (tmp_path / "mod.py").write_text("")
    inputs = [["a", [1, 2, 3], "float32"], ["b", [1, 2, 3, 4], "float32"]]
    sets = {}
    for layout in ("onnx", "qnn"):
        folder = tmp_path / layout
        calibrate.write(
            str(tmp_path / "mod.py"),
            {"g": str(tmp_path / "g.onnx")},
            None,
            "g",
            inputs,
            2,
            str(folder),
            layout,
        )
        sets[layout] = calibrate.read(str(folder), inputs)
        assert json.loads((folder / "calibration.json").read_text())["layout"] == layout
    a = np.fromfile(tmp_path / "onnx/0001-a.raw", np.float32).reshape(1, 2, 3)
    b = np.fromfile(tmp_path / "onnx/0001-b.raw", np.float32).reshape(1, 2, 3, 4)
    assert np.array_equal(
        np.fromfile(tmp_path / "qnn/0001-a.raw", np.float32), a.transpose(0, 2, 1).ravel()
    )
    assert np.array_equal(
        np.fromfile(tmp_path / "qnn/0001-b.raw", np.float32), b.transpose(0, 2, 3, 1).ravel()
    )
    assert not np.array_equal(a.ravel(), a.transpose(0, 2, 1).ravel())
    for got, want in zip(sets["qnn"], sets["onnx"]):
        assert all(np.array_equal(got[k], want[k]) and got[k].shape == want[k].shape for k in want)


def test_calibration_never_uses_the_default_tier_verify_samples(tmp_path):
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.errors import StageFailed
    from toolchain.stages import calibrate

    g = h.make_graph(
        [h.make_node("Identity", ["a"], ["b"])],
        "g",
        [h.make_tensor_value_info("a", T.FLOAT, [1, 2])],
        [h.make_tensor_value_info("b", T.FLOAT, [1, 2])],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    (tmp_path / "mod.py").write_text(
        "import numpy as np\n"
        "def samples(data_dir): return [(k,) for k in ('s1', 's2', 's3')]\n"
        "def graph_feeds(run, sample): return {'g': [{'a': np.full((1, 2), int(sample[0][1]), "
        "np.float32)}]}\n"
    )
    args = (
        str(tmp_path / "mod.py"),
        {"g": str(tmp_path / "g.onnx")},
        str(tmp_path),
        "g",
        [["a", [1, 2], "float32"]],
    )
    calibrate.write(*args, 2, str(tmp_path / "cal"), "onnx", ["s1"])
    record = json.loads((tmp_path / "cal/calibration.json").read_text())
    assert record["samples"] == ["s2", "s3"] and record["held_out"] == ["s1"]
    assert [f["a"][0, 0] for f in calibrate.read(str(tmp_path / "cal"), args[4])] == [2, 3]
    with pytest.raises(StageFailed, match="held-out verify clips"):
        calibrate.write(*args, 3, str(tmp_path / "cal"), "onnx", ["s1"])       # 2 left, 3 asked
    with pytest.raises(StageFailed, match="every sample is a held-out verify clip"):
        calibrate.write(*args, 1, str(tmp_path / "cal"), "onnx", ["s1", "s2", "s3"])


def test_a_window_copy_is_calibrated_from_the_interface_or_named_when_the_code_cannot(tmp_path):
    # A [windows] copy (g_2f: the graph at 2 frames) has no feeds of its own in code written for the
    # declared graphs: calibration_feeds() that takes `io` finds its shape there; one that does not
    # is named, not a KeyError.
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h

    from toolchain.errors import StageFailed
    from toolchain.stages import calibrate
    onnx_files = {}
    for name, frames in (("g", 4), ("g_2f", 2)):
        g = h.make_graph([h.make_node("Identity", ["a"], ["b"])], name,
                         [h.make_tensor_value_info("a", T.FLOAT, [1, frames])],
                         [h.make_tensor_value_info("b", T.FLOAT, [1, frames])])
        onnx.save(
            h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / f"{name}.onnx"
        )
        onnx_files[name] = str(tmp_path / f"{name}.onnx")
    io = {name: {"inputs": [["a", [1, n], "float32"]], "outputs": [["b", [1, n], "float32"]]}
          for name, n in (("g", 4), ("g_2f", 2))}
    (tmp_path / "fixed.py").write_text(
        "import numpy as np\n"
        "def calibration_feeds(run, sample): return {'g': [{'a': np.ones((1, 4), np.float32)}]}\n")
    (tmp_path / "windowed.py").write_text(
        "import numpy as np\n"
        "def calibration_feeds(run, sample, io):\n"
        "    return {g: [{'a': np.full(spec['inputs'][0][1], 7, np.float32)}] for g, spec in "
        "io.items()}\n"
    )
    inputs = io["g_2f"]["inputs"]
    with pytest.raises(
        StageFailed, match=r"fixed.py: calibration_feeds\(\) returned no inputs for graph 'g_2f'"
    ):
        calibrate.write(
            str(tmp_path / "fixed.py"),
            onnx_files,
            None,
            "g_2f",
            inputs,
            1,
            str(tmp_path / "a"),
            io=io,
        )
    calibrate.write(
        str(tmp_path / "windowed.py"),
        onnx_files,
        None,
        "g_2f",
        inputs,
        1,
        str(tmp_path / "b"),
        io=io,
    )
    (feeds,) = calibrate.read(str(tmp_path / "b"), inputs)
    assert feeds["a"].shape == (1, 2) and np.all(feeds["a"] == 7)


def test_tensor_names_with_a_slash_or_space_make_plain_calibration_file_names():
    from toolchain import artifacts
    assert artifacts.calibration_raw_name(3, "encoder/x 0") == "0003-encoder_x_0.raw"
    # unchanged for plain names
    assert artifacts.calibration_raw_name(0, "input_ids") == "0000-input_ids.raw"
