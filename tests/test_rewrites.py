"""The legalizing rewrites (toolchain/rewrites): each exact on the CPU and taken by the HTP where the original is not;
"auto" applies each only where the HTP needs it; and each row of the known-wrong table is still wrong on the HTP
(the simulator), while its rewrite is right."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from conftest import FIXTURES

from toolchain.backends.ort_qnn import ep
from toolchain.rewrites import known_wrong, library
from toolchain.spec import chips


def _fixtures():
    import importlib.util
    spec = importlib.util.spec_from_file_location("legalize", FIXTURES / "legalize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEGALIZE = _fixtures()
CHIPS = chips.load()
NAMES = tuple(library.rules())
# (rule, graph, the original is refused by the EP)
CASES = [("lstm-default-activations", LEGALIZE.lstm(), True),
         ("high-rank-fold", LEGALIZE.unfold(), True),
         ("high-rank-fold", LEGALIZE.unfold_transposed(), True),
         ("high-rank-fold", LEGALIZE.rank6_forms(), True),
         ("convtranspose-as-conv", LEGALIZE.transposed(), True),
         ("convtranspose-as-conv", LEGALIZE.transposed(channels=4, out_channels=6, group=1, pads=(2, 7), kernel=3,
                                                       dilation=4), True),
         ("pow-square-as-mul", LEGALIZE.square(), False),
         ("clip-computed-bounds", LEGALIZE.clip_floor(), True),
         ("conv-dilated-polyphase", LEGALIZE.dilated(), False),
         ("conv-dilated-polyphase", LEGALIZE.dilated(channels=16, length=200, pads=(30, 40), kernel=5, dilation=9,
                                                     group=4), False),
         ("conv-dilated-polyphase", LEGALIZE.dilated(channels=8, length=100, pads=(0, 0), kernel=3, dilation=5),
          False)]


def cpu(onnx_model, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def feeds_of(onnx_model, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in onnx_model.graph.input}


def options(chip: str) -> dict:
    return ep.provider_options(CHIPS[chip].record(), 3)


def test_each_rule_says_what_it_does_and_when_the_htp_needs_it():
    for rule in library.RULES:
        assert len(rule.why) > 60 and rule.why[0].isupper(), rule.name


@pytest.mark.parametrize("name, original, refused", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rewrite_is_exact_on_the_cpu_and_the_htp_takes_what_it_makes(tmp_path, name, original, refused):
    rewritten = copy.deepcopy(original)
    applied = library.apply(rewritten, (name,))
    chain = [n.name for n in original.graph.node if n.op_type in library.rules()[name].op_types]
    assert [a["rewrite"] for a in applied] == [name] and applied[0]["nodes"] == chain
    assert library.apply(copy.deepcopy(rewritten), (name,)) == []   # what it made is not its pattern any more
    feeds = feeds_of(original)
    for want, got in zip(cpu(original, feeds), cpu(rewritten, feeds)):
        assert want.shape == got.shape and np.abs(want - got).max() <= 1e-5 * max(1.0, np.abs(want).max())
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(rewritten, tmp_path / "rewritten.onnx")
    refused_nodes = ep.cpu_nodes(str(tmp_path / "original.onnx"), options("SM8750"))
    assert bool(refused_nodes) == refused
    if refused:   # a failing convert names the rewrite for the node
        named = ep.with_rewrites(str(tmp_path / "original.onnx"), refused_nodes)
        assert named[0][0] == chain[0] and named[0][3] == name, named
    assert ep.cpu_nodes(str(tmp_path / "rewritten.onnx"), options("SM8750")) == []


def test_auto_applies_a_rule_only_where_the_htp_needs_it():
    plain_conv = LEGALIZE.dilated(channels=8, length=64, kernel=3, dilation=2, pads=(2, 2))   # span 5: computed right
    undilated = LEGALIZE.transposed(dilation=1, pads=(2, 2))
    for onnx_model in (plain_conv, undilated):
        assert library.apply(copy.deepcopy(onnx_model), library.AUTO) == []
        assert len(library.apply(copy.deepcopy(onnx_model), NAMES)) == 1   # defined there, if asked for
    every = LEGALIZE.denoiser()
    applied = library.apply(every, library.AUTO)
    assert [a["rewrite"] for a in applied] == [n for n in NAMES if n != "clip-computed-bounds"]   # no front end
    assert known_wrong.found(every) == [] and library.apply(every, library.AUTO) == []   # nothing left to do


def test_a_spec_value_is_auto_or_known_names():
    assert library.problems("auto") == "" and library.problems(["pow-square-as-mul"]) == ""
    assert library.problems(["pow-squar"]) == "unknown rewrite 'pow-squar'; did you mean 'pow-square-as-mul'?"
    assert library.problems("all").startswith("expected \"auto\" or a list of rewrite names")
    assert library.problems(["pow-square-as-mul"] * 2) == "a rewrite is listed twice"


# ---- the known-wrong table, held by the simulator ----

def _row_case(row: dict):
    """The one-op graph a row was measured on, and feeds that show the fault."""
    if row["rewrite"] == "pow-square-as-mul":
        graph = LEGALIZE.square()
        x = feeds_of(graph)["x"]
        x[0, :4] = [-0.0, -1e-9, 0.0, -1e-5]
        return graph, {"x": x}
    graph = LEGALIZE.dilated()
    return graph, feeds_of(graph)


def _rel_error(want: np.ndarray, got: np.ndarray) -> float:
    return float(np.abs(want - got).max() / (want.max() - want.min()))


def _on_htp(onnx_model, feeds: dict, chip: str, folder) -> np.ndarray:
    folder.mkdir()
    onnx.save(onnx_model, folder / "g.onnx")
    ep.compile(str(folder / "g.onnx"), str(folder / "ctx" / "g.onnx"), options(chip))
    return ep.simulator(str(folder / "ctx" / "g.onnx"), options(chip))(feeds)["y"]


@pytest.mark.parametrize("row", known_wrong.rows(), ids=[r["rewrite"] for r in known_wrong.rows()])
@pytest.mark.parametrize("chip", ["SM8550", "SM8750"])
def test_each_known_wrong_op_is_still_wrong_on_the_htp_and_its_rewrite_is_right(tmp_path, row, chip):
    """If this fails because the HTP got it right, the QAIRT in use fixed the fault: the row can go."""
    graph, feeds = _row_case(row)
    assert [(n, r["rewrite"]) for n, r in known_wrong.found(graph)] == [(graph.graph.node[0].name, row["rewrite"])]
    want = cpu(graph, feeds)[0]
    wrong = _rel_error(want, _on_htp(graph, feeds, chip, tmp_path / "original"))
    assert wrong > 0.1, f"{row['op_type']} is now right on {chip} ({wrong:.3g} of the range): the row can go"
    fixed = copy.deepcopy(graph)
    library.apply(fixed, library.AUTO)
    assert known_wrong.found(fixed) == []
    assert _rel_error(want, _on_htp(fixed, feeds, chip, tmp_path / "rewritten")) < 0.01
