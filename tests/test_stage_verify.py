"""The verify stage (toolchain/stages/verify.py): a failure names the output, the call and the
bound, writes its record and bisects that output."""
from __future__ import annotations

import json

from conftest import ONE_CHIP

from toolchain import pipeline, spec
from toolchain.spec import chips
from toolchain.stages import verify


def test_a_failed_verify_names_output_call_and_bound_writes_its_record_and_bisects_that_output(
    project,
):
    """Two outputs both lose precision in fp16; `a` is within its declared absolute check, `b` is
    not. The failure names b, the call and both numbers with what "range" means; verify.json
    holds status "failed" and every output's numbers; the bisection follows b's ops (a's come
    first in the graph)."""
    import shutil

    import onnx
    from conftest import FIXTURES
    project.add_tiny(
        "heads",
        **{
            'chips = ["SM8550", "SM8750"]': 'chips = ["SM8750"]',
            'module = "tinynet"': 'module = "twoheadnet"',
            'outputs.y = { shape = [1, 10], dtype = "float32" }': 'outputs.a = { shape = [1, 32], '
                                                                  'dtype = "float32" }\n'
            'outputs.b = { shape = [1, 10], dtype = "float32" }\n'
            "checks.a = { max_abs = 10 }            # multiples of 16: |error| <= 8",
        },
    )
    shutil.copy(FIXTURES / "twoheadnet.py", project.root / "models")
    rc, executed, text = project.run("verify")
    assert rc == 1, text
    spec = "models/heads.toml"
    line = next(t for t in text.splitlines() if "net/b: call " in t)
    # twoheadnet's graph_feeds() (tinynet's: seeded values) without data: said as what it is
    assert (
        " of 3 on graph_feeds() without a sample (inputs and states as the CPU run fed them): max "
        "|error| "
        in line
    )
    assert (
        "of the range" in line
        and "range = the largest |value| of the CPU output in that call" in line
    )
    assert f"allowed |error| <= 0.02 x range ({spec}: verify.max_rel)" in line, line
    assert "net/a: call" not in text   # within its own check
    record = json.loads((project.root / "build/heads/ort-qnn/SM8750/verify.json").read_text())
    assert record["status"] == "failed" and record["failures"][0].startswith("net/b: call ")
    # what it used
    assert record["inputs"] == {"tensors": {"net": "graph_feeds() without a sample"}, "samples": []}
    outputs = record["tensors"]["net"]["outputs"]
    # a passes by its declared absolute bound only: relative to its range it is as far off as b
    assert (
        outputs["a"]["passed"] is True
        and outputs["a"]["max_abs"] <= 10
        and outputs["a"]["max_rel"] > 0.02
    ), outputs
    assert outputs["a"]["check"] == {"max_abs": 10.0}
    assert outputs["b"]["passed"] is False and outputs["b"]["max_rel"] > 0.02
    bisected = next(t for t in record["failures"] if t.startswith("net/b: op "))
    found = bisected.split("net/b: op ")[1].split(" ")[0]
    model = onnx.load(str(project.root / "build/heads/net/net.onnx"))
    names = [n.name for n in model.graph.node]
    # a's, first in graph order
    first_sub = next(n.name for n in model.graph.node if n.op_type == "Sub")
    assert found != first_sub and found in names, (found, first_sub, bisected)
    assert not (project.root / "build/heads/ort-qnn/SM8750/manifest.json").exists()


def test_a_bound_tighter_than_fp16_can_hold_is_said_before_any_op_is_blamed(project):
    """max_rel 1e-5 is below one fp16 step (2^-10 of a value): the failure says so first and bisects
    no op (every op would depart by that much, and the first Conv would be called at fault)."""
    project.add_tiny(**{**ONE_CHIP, "max_rel = 0.02": "max_rel = 1e-5"})
    rc, _, text = project.run("verify")
    assert rc == 1, text
    line = next(t for t in text.splitlines() if "net/y: " in t)
    assert (
        "net/y: the bound max_rel 1e-05 is below what fp16 can hold (one fp16 step is 2^-10 = "
        "0.00098 of a value, "
        "before any op adds its own rounding), so no op is to blame: raise it to 0.002 or more"
    ) in line, line
    assert "; measured: call " in line and "own fault" not in text
    record = json.loads((project.root / "build/tiny/ort-qnn/SM8750/verify.json").read_text())
    # no op bisected for it
    assert not [f for f in record["failures"] if f.startswith("net/y: op ")]


CLASSIFIER = """

def samples(data_dir):
    return [(name,) for name in ("cat", "dog")]


def evaluate(run, samples):
    return [int(run("net", graph_feeds(run, s)["net"][0])["y"].argmax()) for s in samples]


def agree(ref, got, settings):
    return {"summary": f"top-1 same {sum(a == b for a, b in zip(ref, got))}/{len(ref)}"}, []
"""


def test_the_tiers_say_what_they_run_and_only_a_transcriber_says_wer(project):
    """A classifier with two clips: the default tier's tensor check is the first sample's
    graph_feeds() and its metric every sample (not "(clips (generated inputs))"); a spec naming
    clips says them; the full tier says no WER."""
    tiny = project.add_tiny(
        **{**ONE_CHIP, 'module = "tinynet"\n': 'module = "tinynet"\ndata = "data/photos"\n'}
    )
    (project.root / "models/data/photos").mkdir(parents=True)
    code = project.root / "models/tinynet.py"
    code.write_text(code.read_text() + CLASSIFIER)
    model = spec.load(tiny, chips.load())
    assert verify.inputs_said(model, ()) == (
        "tensors on the first sample (graph_feeds()), the model's metric "
        "(agree()) on every sample of photos"
    )
    assert verify.inputs_said(model, ("dog", "cat")) == (
        "tensors on clip dog (graph_feeds()), the model's metric (agree()) on clips dog, cat"
    )
    # no data: the module's feeds, no sample
    project.edit("models/tiny.toml", 'data = "data/photos"\n', "")
    assert (
        verify.inputs_said(spec.load(tiny, chips.load()), ())
        == "tensors on graph_feeds() without a sample"
    )
    full = next(s for s in pipeline.STAGES if s.name == "verify_full")
    assert "WER" not in full.doc and "the model's own metric" in full.doc
