"""Precision as a declared choice: w8a16 with a calibration set, chip capabilities, size limits."""
import json

import onnx
import pytest

from toolchain.spec import chips
from toolchain import spec
from toolchain.spec import SpecError

# max_rel_w8a16: uint8 per-tensor weights of a tiny random net on Gaussian inputs measure ~0.11.
W8A16 = {'precision = "fp16"': 'precision = "w8a16"\ncalibration = 8', "max_rel = 0.02": "max_rel_w8a16 = 0.2",
         'chips = ["SM8550", "SM8750"]': 'chips = ["SM8350", "SM8750"]'}


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
    assert all(i.data_type not in (2, 3) for i in onnx.load(quantized.root / "build/tiny/net/net.onnx").graph.initializer)
    for chip in ("SM8350", "SM8750"):
        m = json.loads((quantized.root / f"build/tiny/ort-qnn/{chip}/manifest.json").read_text())
        assert m["precision"] == {"net": "w8a16"}
        assert m["binaries"]["net"]["config"]["soc_type"] == chip
        assert m["verify"]["default"]["tensors"]["net"]["max_rel"] < 0.2   # the declared w8a16 bound


def test_changing_the_calibration_count_rebuilds_calibrate_to_verify_only(quantized):
    quantized.edit("models/tiny.toml", "calibration = 8", "calibration = 12")
    rc, executed, _ = quantized.run()
    assert rc == 0
    assert {t.split(":")[0] for t in executed} == {"calibrate", "quantize", "convert", "modellib", "compile", "verify", "manifest",
                                                   "report"}
    lines = (quantized.root / "build/tiny/net/calibration/input_list.txt").read_text().splitlines()
    assert len(lines) == 12


def test_fp16_for_a_chip_without_fp16_is_refused_pointing_at_w8a16(project):
    path = project.add_tiny("tiny", **{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8350"]'})
    with pytest.raises(SpecError, match='SM8350 .* has no fp16.*precision = "w8a16"'):
        spec.load(path, chips.load())


def test_w8a16_without_calibration_is_refused(project):
    path = project.add_tiny("tiny", **{'precision = "fp16"': 'precision = "w8a16"'})
    with pytest.raises(SpecError, match="graphs.net.calibration: a w8a16 graph needs calibration"):
        spec.load(path, chips.load())


def test_a_graph_over_the_fp16_size_limit_is_refused_before_compiling(project):
    project.add_tiny("tiny", **{"[parity]": "[compile]\nmax_fp16_params = 1000\n\n[parity]"})
    rc, executed, text = project.run()
    assert rc == 1
    assert "M parameters" in text and "exceed the per-context limit of 0.0 M" in text
    assert 'declare the graph precision = "w8a16"' in text and "split it into several graphs" in text
    assert not [t for t in executed if t.startswith("compile:")]


TIED_EMBEDDING = r"""
import json, sys, numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain.engine import paths
from toolchain.stages import calibrate
from toolchain.backends.ort_qnn import ep as ort_qnn, quantize
out, V, D = sys.argv[1], 8000, 128
rng = np.random.default_rng(0)
# Whisper's tied token embedding: one table read by a Gather (lookup) and by MatMul(W, x^T) (logits).
g = h.make_graph([h.make_node("Gather", ["W", "token"], ["e"]), h.make_node("Reshape", ["e", "shape"], ["e2"]),
                  h.make_node("Add", ["e2", "x"], ["s"]), h.make_node("Transpose", ["s"], ["st"], perm=[1, 0]),
                  h.make_node("MatMul", ["W", "st"], ["logits"])], "g",
                 [h.make_tensor_value_info("token", T.INT32, [1, 1]), h.make_tensor_value_info("x", T.FLOAT, [1, D])],
                 [h.make_tensor_value_info("logits", T.FLOAT, [V, 1])],
                 [nh.from_array((rng.standard_normal((V, D)) * 0.05).astype(np.float32), "W"),
                  nh.from_array(np.array([1, D], np.int64), "shape")])
model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
model.ir_version = 9
onnx.save(model, out + "/m.onnx")
rewritten = onnx.load(out + "/m.onnx")
tables = quantize.place_weights(rewritten)
inputs = [["token", [1, 1], "int32"], ["x", [1, D], "float32"]]
feeds = [{"token": np.array([[i * 97]], np.int32), "x": rng.standard_normal((1, D)).astype(np.float32)} for i in range(8)]
lines = []
for i, f in enumerate(feeds):
    for name, _, _ in inputs:
        f[name].tofile(f"{out}/{paths.calibration_raw_name(i, name)}")
    lines.append(" ".join(paths.calibration_raw_name(i, name) for name, _, _ in inputs))
open(out + "/input_list.txt", "w").write("\n".join(lines) + "\n")
quantize.quantize(out + "/m.onnx", out, inputs, out + "/q.onnx")
ort_qnn.compile(out + "/q.onnx", out + "/q_ctx.onnx", ort_qnn.provider_options({"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}, 3))
ref, same = ort.InferenceSession(out + "/m.onnx"), ort.InferenceSession(rewritten.SerializeToString())
sim = ort_qnn.simulator(out + "/q_ctx.onnx", ort_qnn.provider_options({"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}, 3))
want = ref.run(None, feeds[0])[0]
print("RESULT " + json.dumps({"tables": tables, "table_bytes": V * D, "binary": __import__("os").path.getsize(out + "/q_ctx_qnn.bin"),
                              "rewrite_err": float(np.abs(same.run(None, feeds[0])[0] - want).max()),
                              "htp_rel": float(np.abs(sim(feeds[0])["logits"] - want).max() / np.ptp(want))}))
"""


def test_w8a16_stores_a_tied_embedding_in_8_bits(tmp_path):
    # Without quantize.place_weights the binary holds the table in 8 bits for the Gather and in 16 bits
    # for MatMul(W, x^T): 3x the table size (measured); with it, two 8-bit copies.
    import subprocess, sys
    run = subprocess.run([sys.executable, "-c", TIED_EMBEDDING, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    line = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, run.stdout + run.stderr
    got = json.loads(line[0][len("RESULT "):])
    assert got["tables"] == ["W"]
    assert got["rewrite_err"] < 1e-5                              # the rewrite is the same product
    assert got["binary"] < 2.4 * got["table_bytes"], got          # 8-bit: ~2x table, not 3x
    assert got["htp_rel"] < 0.05, got                             # and the HTP result still matches float
    q = onnx.load(tmp_path / "q.onnx")
    assert {i.name: i.data_type for i in q.graph.initializer}["W_quantized"] == onnx.TensorProto.UINT8


def test_calibration_layout_follows_the_toolchain_and_reads_back_the_same(tmp_path):
    # The embedded toolchain reads ONNX layout; qnn-onnx-converter --use_native_input_files reads QNN's
    # (3-D last two axes swapped, 4-D NHWC). Both sets must read back as the same ONNX-layout feeds.
    import numpy as np
    from onnx import TensorProto as T, helper as h
    from toolchain.stages import calibrate
    g = h.make_graph([h.make_node("Identity", ["a"], ["a2"]), h.make_node("Identity", ["b"], ["b2"])], "g",
                     [h.make_tensor_value_info("a", T.FLOAT, [1, 2, 3]), h.make_tensor_value_info("b", T.FLOAT, [1, 2, 3, 4])],
                     [h.make_tensor_value_info("a2", T.FLOAT, [1, 2, 3]), h.make_tensor_value_info("b2", T.FLOAT, [1, 2, 3, 4])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    (tmp_path / "mod.py").write_text("")                       # no graph_feeds: seeded generated inputs
    inputs = [["a", [1, 2, 3], "float32"], ["b", [1, 2, 3, 4], "float32"]]
    sets = {}
    for layout in ("onnx", "qnn"):
        folder = tmp_path / layout
        calibrate.write(str(tmp_path / "mod.py"), {"g": str(tmp_path / "g.onnx")}, None, "g", inputs, 2, str(folder), layout)
        sets[layout] = calibrate.read(str(folder), inputs)
        assert json.loads((folder / "calibration.json").read_text())["layout"] == layout
    a = np.fromfile(tmp_path / "onnx/0001-a.raw", np.float32).reshape(1, 2, 3)
    b = np.fromfile(tmp_path / "onnx/0001-b.raw", np.float32).reshape(1, 2, 3, 4)
    assert np.array_equal(np.fromfile(tmp_path / "qnn/0001-a.raw", np.float32), a.transpose(0, 2, 1).ravel())
    assert np.array_equal(np.fromfile(tmp_path / "qnn/0001-b.raw", np.float32), b.transpose(0, 2, 3, 1).ravel())
    assert not np.array_equal(a.ravel(), a.transpose(0, 2, 1).ravel())
    for got, want in zip(sets["qnn"], sets["onnx"]):
        assert all(np.array_equal(got[k], want[k]) and got[k].shape == want[k].shape for k in want)


def test_calibration_never_uses_the_default_tier_verify_samples(tmp_path):
    from onnx import TensorProto as T, helper as h
    from toolchain.stages import calibrate
    from toolchain.engine.worker import StageFailed
    g = h.make_graph([h.make_node("Identity", ["a"], ["b"])], "g", [h.make_tensor_value_info("a", T.FLOAT, [1, 2])],
                     [h.make_tensor_value_info("b", T.FLOAT, [1, 2])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    (tmp_path / "mod.py").write_text(
        "import numpy as np\n"
        "def samples(data_dir): return [(k,) for k in ('s1', 's2', 's3')]\n"
        "def graph_feeds(run, sample): return {'g': [{'a': np.full((1, 2), int(sample[0][1]), np.float32)}]}\n")
    args = (str(tmp_path / "mod.py"), {"g": str(tmp_path / "g.onnx")}, str(tmp_path), "g", [["a", [1, 2], "float32"]])
    calibrate.write(*args, 2, str(tmp_path / "cal"), "onnx", ["s1"])
    record = json.loads((tmp_path / "cal/calibration.json").read_text())
    assert record["samples"] == ["s2", "s3"] and record["held_out"] == ["s1"]
    assert [f["a"][0, 0] for f in calibrate.read(str(tmp_path / "cal"), args[4])] == [2, 3]
    with pytest.raises(StageFailed, match="held-out verify clips"):
        calibrate.write(*args, 3, str(tmp_path / "cal"), "onnx", ["s1"])       # 2 left, 3 asked
    with pytest.raises(StageFailed, match="every sample is a held-out verify clip"):
        calibrate.write(*args, 1, str(tmp_path / "cal"), "onnx", ["s1", "s2", "s3"])


EXTERNAL_DATA = r"""
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain.backends.ort_qnn import ep as ort_qnn
out = sys.argv[1]
w = nh.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 256])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 256])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), out + "/m.onnx", save_as_external_data=True,
          location="m.weights", size_threshold=0)
ort_qnn.compile(out + "/m.onnx", out + "/ctx/m.onnx", ort_qnn.provider_options({"soc_model": 69, "htp_arch": 79, "vtcm_mb": 8}, 3))
print("RESULT ok")
"""


def test_a_graph_with_external_weights_compiles(tmp_path):
    # ONNX over 2 GB must keep its weights in a side file (bench/size_limit.py compiles 1.2 B parameters).
    import subprocess, sys
    run = subprocess.run([sys.executable, "-c", EXTERNAL_DATA, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert "RESULT ok" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "m.weights").stat().st_size == 256 * 256 * 4 and (tmp_path / "ctx/m_qnn.bin").exists()
