"""The verify stage (toolchain/stages/verify.py): a failure names the output, the call and the bound, writes its
record and bisects that output."""
from __future__ import annotations

import json


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
