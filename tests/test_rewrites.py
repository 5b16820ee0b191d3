"""The legalizing rewrites (toolchain/rewrites): each exact on the CPU and taken by the HTP where
the original is not; "auto" applies each only where the HTP needs it; and each row of the
known-wrong table is still wrong on the HTP (the simulator), while its rewrite is right."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from conftest import FIXTURES

from toolchain.compilers.ort_qnn import ep
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
CASES = [
    ("lstm-default-activations", LEGALIZE.lstm(), True),
    ("high-rank-fold", LEGALIZE.unfold(), True),
    ("high-rank-fold", LEGALIZE.unfold_transposed(), True),
    ("high-rank-fold", LEGALIZE.rank6_forms(), True),
    ("convtranspose-as-conv", LEGALIZE.transposed(), True),
    (
        "convtranspose-as-conv",
        LEGALIZE.transposed(channels=4, out_channels=6, group=1, pads=(2, 7), kernel=3, dilation=4),
        True,
    ),
    ("pow-square-as-mul", LEGALIZE.square(), False),
    ("clip-computed-bounds", LEGALIZE.clip_floor(), True),
    ("if-as-where", LEGALIZE.gated(), True),
    ("conv-dilated-polyphase", LEGALIZE.dilated(), False),
    (
        "conv-dilated-polyphase",
        LEGALIZE.dilated(channels=16, length=200, pads=(30, 40), kernel=5, dilation=9, group=4),
        False,
    ),
    (
        "conv-dilated-polyphase",
        LEGALIZE.dilated(channels=8, length=100, pads=(0, 0), kernel=3, dilation=5),
        False,
    ),
]


def cpu(onnx_model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(
        onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)


def feeds_of(onnx_model, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in onnx_model.graph.input
    }


def options(chip: str) -> dict:
    return ep.provider_options(CHIPS[chip].record(), 3)


def test_each_rule_says_what_it_does_and_when_the_htp_needs_it():
    for rule in library.RULES:
        assert len(rule.why) > 60 and rule.why[0].isupper(), rule.name


@pytest.mark.parametrize(
    "name, original, refused", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_rewrite_is_exact_on_the_cpu_and_the_htp_takes_what_it_makes(
    tmp_path, name, original, refused
):
    rewritten = copy.deepcopy(original)
    applied = library.apply(rewritten, (name,))
    chain = [n.name for n in original.graph.node if n.op_type in library.rules()[name].op_types]
    assert [a["rewrite"] for a in applied] == [name] and applied[0]["nodes"] == chain
    # what it made is not its pattern any more
    assert library.apply(copy.deepcopy(rewritten), (name,)) == []
    feeds = feeds_of(original)
    for want, got in zip(cpu(original, feeds), cpu(rewritten, feeds)):
        assert want.shape == got.shape and np.abs(want - got).max() <= 1e-5 * max(
            1.0, np.abs(want).max()
        )
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(rewritten, tmp_path / "rewritten.onnx")
    refused_nodes = ep.cpu_nodes(str(tmp_path / "original.onnx"), options("SM8750"))
    assert bool(refused_nodes) == refused
    if refused:   # a failing convert names the rewrite for the node
        named = ep.with_rewrites(str(tmp_path / "original.onnx"), refused_nodes)
        # an If: its branches' nodes are listed too
        row = next((r for r in named if r[0] == chain[0]), None)
        assert row is not None and row[3] == name, named
    assert ep.cpu_nodes(str(tmp_path / "rewritten.onnx"), options("SM8750")) == []


def test_auto_applies_a_rule_only_where_the_htp_needs_it():
    # span 5: computed right
    plain_conv = LEGALIZE.dilated(channels=8, length=64, kernel=3, dilation=2, pads=(2, 2))
    undilated = LEGALIZE.transposed(dilation=1, pads=(2, 2))
    for onnx_model in (plain_conv, undilated):
        assert library.apply(copy.deepcopy(onnx_model), library.AUTO) == []
        # defined there, if asked for
        assert len(library.apply(copy.deepcopy(onnx_model), NAMES)) == 1
    every = LEGALIZE.denoiser()
    applied = library.apply(every, library.AUTO)
    no_front_end_no_gate = ("clip-computed-bounds", "if-as-where")
    assert [a["rewrite"] for a in applied] == [n for n in NAMES if n not in no_front_end_no_gate]
    # nothing left to do
    assert known_wrong.found(every) == [] and library.apply(every, library.AUTO) == []


def test_a_spec_value_is_auto_or_known_names():
    assert library.problems("auto") == "" and library.problems(["pow-square-as-mul"]) == ""
    assert (
        library.problems(["pow-squar"])
        == "unknown rewrite 'pow-squar'; did you mean 'pow-square-as-mul'?"
    )
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
def test_each_known_wrong_op_is_still_wrong_on_the_htp_and_its_rewrite_is_right(
    tmp_path, row, chip
):
    """If this fails because the HTP got it right, the QAIRT in use fixed the fault: the
    row can go."""
    graph, feeds = _row_case(row)
    assert [(n, r["rewrite"]) for n, r in known_wrong.found(graph)] == [
        (graph.graph.node[0].name, row["rewrite"])
    ]
    want = cpu(graph, feeds)[0]
    wrong = _rel_error(want, _on_htp(graph, feeds, chip, tmp_path / "original"))
    assert wrong > 0.1, (
        f"{row['op_type']} is now right on {chip} ({wrong:.3g} of the range): the row can go"
    )
    fixed = copy.deepcopy(graph)
    library.apply(fixed, library.AUTO)
    assert known_wrong.found(fixed) == []
    assert _rel_error(want, _on_htp(fixed, feeds, chip, tmp_path / "rewritten")) < 0.01


def test_a_rewrite_keeps_the_initializers_a_subgraph_reads_from_the_outer_graph():
    """openWakeWord's hey_jarvis model: an If body reads outer initializers by name; the
    rewritten model must keep them (the clean-up after a rule drops only what no node, at
    any depth, reads)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper
    then = h.make_graph([h.make_node("Add", ["sq", "bias"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [1, 4])])
    other = h.make_graph([h.make_node("Identity", ["sq"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", T.FLOAT, [1, 4])])
    graph = h.make_graph(
        [
            h.make_node("Pow", ["x", "two"], ["sq"]),
            h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        initializer=[
            numpy_helper.from_array(np.array(2, np.float32), "two"),
            numpy_helper.from_array(np.array(True), "flag"),
            numpy_helper.from_array(np.ones((1, 4), np.float32), "bias"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    # the If stays (if-as-where not asked for)
    applied = library.apply(model, ("pow-square-as-mul",))
    assert [a["rewrite"] for a in applied] == ["pow-square-as-mul"]
    names = {i.name for i in model.graph.initializer}
    # the body's read kept, the replaced Pow's exponent gone
    assert "bias" in names and "two" not in names, names
    onnx.checker.check_model(model, full_check=True)


def _random_case(rule: str, seed: int):
    """A seeded random graph of the rule's pattern family: sizes, groups, dilations,
    pads, which bounds."""
    rng = np.random.default_rng(seed)
    if rule == "convtranspose-as-conv":
        kernel, dilation, group = (
            int(rng.integers(2, 6)),
            int(rng.integers(2, 6)),
            int(rng.choice([1, 2, 4])),
        )
        span = dilation * (kernel - 1)
        return LEGALIZE.transposed(
            channels=4 * group,
            out_channels=2 * group,
            group=group,
            kernel=kernel,
            dilation=dilation,
            length=int(rng.integers(8, 40)),
            pads=tuple(int(p) for p in rng.integers(0, span + 1, 2)),
        )
    if rule == "clip-computed-bounds":
        return LEGALIZE.clip_floor(mels=int(rng.integers(4, 40)), frames=int(rng.integers(4, 80)),
                                   # a floor the seeded data reaches
                                   top_db=float(rng.uniform(0.5, 3.0)))
    return LEGALIZE.gated(features=int(rng.integers(2, 64)))


@pytest.mark.parametrize("rule", ["convtranspose-as-conv", "clip-computed-bounds", "if-as-where"])
@pytest.mark.parametrize("seed", range(4))
def test_a_rule_on_a_random_graph_of_its_family_is_exact_and_the_htp_takes_the_result(
    tmp_path, rule, seed
):
    original = _random_case(rule, seed)
    rewritten = copy.deepcopy(original)
    assert [a["rewrite"] for a in library.apply(rewritten, (rule,))] == [rule]
    for feed_seed in range(3):
        # the gate opens on some of them
        feeds = {n: v * 3 for n, v in feeds_of(original, feed_seed).items()}
        for want, got in zip(cpu(original, feeds), cpu(rewritten, feeds)):
            assert want.shape == got.shape and np.abs(want - got).max() <= 1e-5 * max(
                1.0, np.abs(want).max()
            )
    onnx.save(rewritten, tmp_path / "rewritten.onnx")
    assert ep.cpu_nodes(str(tmp_path / "rewritten.onnx"), options("SM8750")) == []
