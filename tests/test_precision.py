"""Precision as a declared choice: w8a16 with a calibration set, chip capabilities, size limits."""
import json

import onnx
import pytest

from toolchain import chips, spec
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
    assert {t.split(":")[0] for t in executed} == {"calibrate", "quantize", "compile", "verify", "manifest",
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
