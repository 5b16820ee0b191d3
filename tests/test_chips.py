"""The chip table against what the bundled SDK really builds for each row."""
import json
import subprocess
import sys

import pytest

from toolchain.spec import chips

TABLE = chips.load()


def test_guide_defaults_and_known_corrections():
    assert [c.name for c in TABLE.values() if c.default] == [
        "SM8550",
        "SM8650",
        "SM8750",
        "SM8850",
        "QCS9100",
    ]
    assert TABLE["SM8350"].soc_model == 30 and TABLE["SM8350"].fp16 is False   # 35 is SM7325 here
    assert TABLE["SM8475"].htp_arch == 68                                      # not v69 in this SDK
    assert TABLE["SA8295"].fp16 is True and TABLE["SA8295"].htp_arch == 68
    assert all(c.source for c in TABLE.values())


COMPILE_ONE = r"""
import json, sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
from toolchain.compilers.ort_qnn import ep as ort_qnn
from toolchain.qnn import qnnbin
chip, out = json.loads(sys.argv[1]), sys.argv[2]
w = nh.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
                 [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), out + "/m.onnx")
ort_qnn.compile(out + "/m.onnx", out + "/m_ctx.onnx", ort_qnn.provider_options(chip, 3))
cfg, info = qnnbin.config_fields(out + "/m_ctx_qnn.bin"), qnnbin.binary_info(out + "/m_ctx_qnn.bin")
print("RESULT " + json.dumps({"cfg": {k: cfg.get(k) for k in ("soc_type", "arch", "vtcm_size",
                                                              "relaxed_precision_flag")},
                              "socModel": info["socModel"]}))
"""


@pytest.mark.parametrize("name", list(TABLE))
def test_every_row_compiles_to_what_the_row_says(name, tmp_path):
    chip = TABLE[name]
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_ONE, json.dumps(chip.record()), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, run.stdout + run.stderr
    got = json.loads(line[0][len("RESULT "):])
    assert got["cfg"] == {"soc_type": name, "arch": chip.htp_arch, "vtcm_size": chip.vtcm_mb << 20,
                          "relaxed_precision_flag": chip.fp16}
    assert got["socModel"] == chip.soc_model
