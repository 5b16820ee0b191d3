"""The rank > 5 fold (toolchain/rewrites/rank.py) on seeded random chains of the kinds exporters
write: made by a Gather with 2-D indices or an Unsqueeze, moved by Transposes, scaled, sliced,
joined, read back by a Reshape. Each chain the rule folds is exact on the CPU and taken whole by the
HTP; each it leaves says why."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import helper as h
from test_rewrites import LEGALIZE, cpu, feeds_of, options

from toolchain.compilers.ort_qnn import ep
from toolchain.rewrites import library, rank
from toolchain.rewrites.view import GraphView


def random_chain(seed: int):
    """x (rank 5, sizes 1-4) -> rank 6 (Gather by 2-D indices or Unsqueeze) -> 1-4 of Transpose,
    Mul, Relu, Add, Slice, Concat -> Reshape to [2, -1] or [-1]."""
    rng = np.random.default_rng(seed)
    shape = [int(rng.choice([1, 2, 3, 4])) for _ in range(5)]
    nodes, inits = [], []
    if rng.random() < 0.5:
        axis = int(rng.integers(5))
        shape[axis] = max(shape[axis], 2)
        idx = rng.integers(0, shape[axis], size=(2, 3)).astype(np.int64)
        inits.append(("idx", idx))
        nodes.append(h.make_node("Gather", ["x", "idx"], ["t0"], name="Gather0", axis=axis))
        current = shape[:axis] + [2, 3] + shape[axis + 1:]
    else:
        axis = int(rng.integers(6))
        inits.append(("at", np.array([axis], np.int64)))
        nodes.append(h.make_node("Unsqueeze", ["x", "at"], ["t0"], name="Unsqueeze0"))
        current = shape[:axis] + [1] + shape[axis:]
    x_shape = shape
    for i in range(1, int(rng.integers(2, 6))):
        src, out, kind = (
            f"t{i - 1}",
            f"t{i}",
            rng.choice(["Transpose", "Mul", "Relu", "Add", "Slice", "Concat"]),
        )
        if kind == "Transpose":
            perm = [int(p) for p in rng.permutation(6)]
            nodes.append(h.make_node("Transpose", [src], [out], name=f"Transpose{i}", perm=perm))
            current = [current[p] for p in perm]
        elif kind == "Mul":
            inits.append((f"k{i}", np.array([0.5], np.float32)))
            nodes.append(h.make_node("Mul", [src, f"k{i}"], [out], name=f"Mul{i}"))
        elif kind in ("Relu", "Add"):
            nodes.append(
                h.make_node(kind, [src] * (2 if kind == "Add" else 1), [out], name=f"{kind}{i}")
            )
        elif kind == "Slice":
            axes = [a for a in range(6) if current[a] > 1]
            if not axes:
                nodes.append(h.make_node("Relu", [src], [out], name=f"Relu{i}"))
                continue
            a = int(rng.choice(axes))
            inits += [
                (f"s{i}", np.array([1], np.int64)),
                (f"e{i}", np.array([current[a]], np.int64)),
                (f"a{i}", np.array([a], np.int64)),
            ]
            nodes.append(
                h.make_node("Slice", [src, f"s{i}", f"e{i}", f"a{i}"], [out], name=f"Slice{i}")
            )
            current[a] -= 1
        else:
            a = int(rng.integers(6))
            nodes.append(h.make_node("Concat", [src, src], [out], name=f"Concat{i}", axis=a - 6))
            current[a] *= 2
    last = nodes[-1].output[0]
    target = [2, -1] if int(np.prod(current)) % 2 == 0 else [-1]
    inits.append(("shape", np.array(target, np.int64)))
    nodes.append(h.make_node("Reshape", [last, "shape"], ["y"], name="Reshape_end"))
    out = [2, int(np.prod(current)) // 2] if target == [2, -1] else [int(np.prod(current))]
    return LEGALIZE.model(nodes, [("x", x_shape)], [("y", out)], inits)


SEEDS = range(32)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_rank6_chain_folds_exactly_and_the_htp_takes_it_or_the_rule_says_why_not(
    tmp_path, seed
):
    import onnx
    original = random_chain(seed)
    rewritten = copy.deepcopy(original)
    applied = library.apply(rewritten, library.AUTO)
    if not applied:
        view = GraphView(copy.deepcopy(original))
        reason = rank.why_not(view, rank.chain(view, view.graph.node[0]))
        # the only way these chains fail: axes a Transpose scatters
        assert "folds to rank" in reason, reason
        return
    assert applied == [
        {"rewrite": "high-rank-fold", "nodes": [n.name for n in original.graph.node]}
    ]
    feeds = feeds_of(original, seed)
    want, got = cpu(original, feeds)[0], cpu(rewritten, feeds)[0]
    assert want.shape == got.shape and np.abs(want - got).max() <= 1e-5
    onnx.save(rewritten, tmp_path / "rewritten.onnx")
    assert ep.cpu_nodes(str(tmp_path / "rewritten.onnx"), options("SM8750")) == []


def test_most_random_chains_fold():
    folded = sum(bool(library.apply(random_chain(seed), library.AUTO)) for seed in SEEDS)
    assert folded >= len(SEEDS) * 3 // 4, folded


def test_a_transpose_that_scatters_six_axes_is_left_naming_the_tensor():
    # six axes above 1, no two neighbours kept together: no fold fits rank 5
    perm = [5, 3, 1, 4, 2, 0]
    graph = LEGALIZE.model(
        [
            h.make_node("Reshape", ["x", "six"], ["u"], name="/r/Reshape"),
            h.make_node("Transpose", ["u"], ["t"], name="/r/Transpose", perm=perm),
            h.make_node("Reshape", ["t", "flat"], ["y"], name="/r/Flat"),
        ],
        [("x", [36, 18])],
        [("y", [648])],
        [("six", np.array([2, 3, 2, 3, 2, 3], np.int64)), ("flat", np.array([648], np.int64))],
    )
    assert library.apply(copy.deepcopy(graph), library.AUTO) == []
    view = GraphView(graph)
    assert rank.why_not(view, rank.chain(view, graph.graph.node[1])) == (
        "u [2, 3, 2, 3, 2, 3] folds to rank 6 at best: its axes do not move together")


def test_a_chain_through_an_op_without_a_fold_is_left_naming_the_op():
    graph = LEGALIZE.model(
        [
            h.make_node("Reshape", ["x", "six"], ["u"], name="/r/Reshape"),
            h.make_node("Softmax", ["u"], ["s"], name="/r/Softmax", axis=-1),
            h.make_node("Reshape", ["s", "flat"], ["y"], name="/r/Flat"),
        ],
        [("x", [6, 6])],
        [("y", [36])],
        [("six", np.array([1, 2, 1, 3, 2, 3], np.int64)), ("flat", np.array([36], np.int64))],
    )
    assert library.apply(copy.deepcopy(graph), library.AUTO) == []
    view = GraphView(graph)
    assert rank.why_not(view, rank.chain(view, graph.graph.node[0])) == (
        "/r/Softmax (Softmax) makes or reads a rank > 5 tensor and no fold is defined for Softmax")


def test_a_given_graph_the_htp_refuses_is_told_the_limit_and_no_export_to_fix(tmp_path):
    """The EP says only "Failed to add node."; the build names the rank, why no rule folds it, and,
    for a given file, a next step that is not its export."""
    import onnx
    graph = LEGALIZE.model(
        [
            h.make_node("Reshape", ["x", "six"], ["u"], name="/r/Reshape"),
            h.make_node("Softmax", ["u"], ["s"], name="/r/Softmax", axis=-1),
            h.make_node("Reshape", ["s", "flat"], ["y"], name="/r/Flat"),
        ],
        [("x", [6, 6])],
        [("y", [36])],
        [("six", np.array([1, 2, 1, 3, 2, 3], np.int64)), ("flat", np.array([36], np.int64))],
    )
    onnx.save(graph, tmp_path / "g.onnx")
    with pytest.raises(ep.OffTheHtp) as refused:
        ep.lower(str(tmp_path / "g.onnx"), options("SM8750"), given="pypi:some-package==1.0/g.onnx")
    message = str(refused.value)
    assert (
        "/r/Softmax (Softmax: input u has rank 6 > 5, the HTP's most — no rule matches this chain: "
        "/r/Softmax "
        "(Softmax) makes or reads a rank > 5 tensor and no fold is defined for Softmax)"
    ) in message, message
    assert (
        "the graph is given (pypi:some-package==1.0/g.onnx), so there is no export to fix"
        in message
    )
    assert "export (" not in message and "in the export" not in message
    with pytest.raises(ep.OffTheHtp) as exported:
        ep.lower(str(tmp_path / "g.onnx"), options("SM8750"))
    assert str(exported.value).endswith("fix them in the export (replace or rewrite these ops)")
