"""The rewrite rules, in the order they are applied, and what the build calls: `problems` (a spec's
value), `apply` (the simplify stage), `for_node` (a failing convert's hint). Each rule is exact
(the same function, up to float rounding on the CPU); the docstring of each `apply` says when the
HTP needs it and what was measured (QAIRT 2.51, the wheel's onnxruntime-qnn 2.7.0, its EP log or
its x86 simulator)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from toolchain.rewrites import known_wrong, limits, rank
from toolchain.rewrites.view import GraphView, attribute

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)

AUTO = "auto"
# 0.12: one Gather's form; 0.13: every rank > 5 chain
RENAMED = {"gather-high-rank": "high-rank-fold"}


@dataclass(frozen=True)
class Rule:
    """One legalizing ONNX rewrite: the ops it reads, when it applies, when the HTP needs
    it, and how."""

    name: str
    op_types: tuple[str, ...]
    # (GraphView, node) -> bool: the rewrite is defined for this node (explicit `rewrite = [...]`)
    applies: Callable
    # (GraphView, node) -> bool: the HTP refuses or miscomputes the node as written ("auto")
    needed: Callable
    # (GraphView, node) -> None, or the labels of all the nodes it replaced (a chain rule)
    apply: Callable

    @property
    def why(self) -> str:
        """The rule's docstring on one line: what it does, then when the HTP needs it, with
        the measured reason."""
        return " ".join((self.apply.__doc__ or "").split())


def rules() -> dict[str, Rule]:
    return {r.name: r for r in RULES}


def problems(declared) -> str:
    """Why a spec's `rewrite` value is not one (empty when it is): "auto" or a list of
    known rule names."""
    if declared == AUTO:
        return ""
    known = tuple(rules())
    if (
        not isinstance(declared, (list, tuple))
        or not declared
        or not all(isinstance(n, str) for n in declared)
    ):
        return f'expected "auto" or a list of rewrite names ({", ".join(known)}), got {declared!r}'
    for name in declared:
        if name in RENAMED:
            return (f"the rewrite {name!r} is now {RENAMED[name]!r} (it folds every chain of rank "
                    "> 5 tensors)")
        if name not in known:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, known, n=1)
            return f"unknown rewrite {name!r}; " + (f"did you mean {close[0]!r}?" if close else
                                                     f"known: {', '.join(known)}")
    if len(set(declared)) != len(declared):
        return "a rewrite is listed twice"
    return ""


def apply(onnx_model, declared) -> list[dict]:
    """Rewrite `onnx_model` in place with the declared rules ("auto": each rule where the HTP needs
    it), in the library's order; [{"rewrite": name, "nodes": [the original nodes it replaced]}] of
    those that changed something."""
    view = GraphView(onnx_model)
    applied = []
    for rule in rules().values():
        if declared != AUTO and rule.name not in declared:
            continue
        test = rule.needed if declared == AUTO else rule.applies
        touched: list[str] = []
        for node in list(view.graph.node):
            if node.op_type in rule.op_types and node in view.graph.node and test(view, node):
                label = view.label(node)
                # a chain rule names every node it replaced
                touched.extend(rule.apply(view, node) or [label])
        if touched:
            applied.append({"rewrite": rule.name, "nodes": touched})
    if applied:
        view.finish()
    return applied


def for_node(onnx_model, node_name: str) -> str:
    """The rule that would make the HTP take this node ("" when none does): what a
    failing convert suggests."""
    return for_nodes(onnx_model, [node_name])[0][0]


def for_nodes(onnx_model, names: list[str]) -> list[tuple[str, str]]:
    """For each named node: the rule that would make the HTP take it ("" for none), and the limit of
    the HTP its tensors break ("" when none is measured: limits.py), on one view of the graph."""
    view = GraphView(onnx_model)
    by_name = {node.name: node for node in view.graph.node if node.name}
    found = []
    for name in names:
        node = by_name.get(name)
        if node is None:
            found.append(("", ""))
            continue
        rule = next(
            (
                r.name
                for r in rules().values()
                if node.op_type in r.op_types and r.needed(view, node)
            ),
            "",
        )
        found.append((rule, limits.broken(view, node)))
    return found


# ---- If (control flow) whose branches are plain graphs ----

def _branches(node) -> list:
    """The then and else bodies of an If, in that order."""
    bodies = {a.name: a.g for a in node.attribute}
    return [bodies["then_branch"], bodies["else_branch"]]


def _if_inlinable(view: GraphView, node) -> bool:
    from onnx import AttributeProto
    bodies = _branches(node)
    nested = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
    if any(a.type in nested for body in bodies for inner in body.node for a in inner.attribute):
        return False   # nested control flow: not inlined
    return all(len(b.output) == len(node.output) for b in bodies)


def if_as_where(view: GraphView, node) -> None:
    """An If whose branches are plain graphs computes both and selects: each branch's nodes are
    inlined where the If stands (their tensors renamed fresh, outer tensors read as before), then
    Where(cond, then, else) per output. Exact, a branch having no side effects; it costs the
    branch not taken.

    The HTP runs no control flow: the EP leaves an If, and the graph behind it, on the CPU ("If" is
    not among the ops it lowers), e.g. openWakeWord's hey_jarvis detector, whose If runs a verifier
    model only when the score is high enough. A computed condition cannot be folded away: only
    computing both branches keeps the graph whole."""
    from onnx import numpy_helper
    base, nodes, chosen = node.name or "If", [], []
    for branch, body in zip(("then", "else"), _branches(node)):
        renamed: dict[str, str] = {}
        for init in body.initializer:
            renamed[init.name] = view.add_constant(
                f"{base}_{branch}_{init.name}", numpy_helper.to_array(init)
            )
        for inner in body.node:
            for out in inner.output:
                if out:
                    renamed[out] = view.fresh(f"{base}_{branch}_{out}")
            copy = view.node(inner.op_type, [renamed.get(i, i) for i in inner.input],
                             [renamed.get(o, o) for o in inner.output],
                             f"{base}_{branch}_{inner.name or inner.op_type}")
            copy.attribute.extend(inner.attribute)
            copy.domain = inner.domain
            nodes.append(copy)
        chosen.append([renamed.get(o.name, o.name) for o in body.output])
    for out, then, other in zip(node.output, *chosen):
        nodes.append(view.node("Where", [node.input[0], then, other], [out], f"{base}_where"))
    view.replace(node, nodes)


# ---- LSTM whose `activations` attribute spells out the defaults ----

LSTM_DEFAULT = ("sigmoid", "tanh", "tanh")


def _lstm_restates_defaults(view: GraphView, node) -> bool:
    activations = attribute(node, "activations")
    if (
        activations is None
        or attribute(node, "activation_alpha")
        or attribute(node, "activation_beta")
    ):
        return False
    directions = 2 if attribute(node, "direction", b"forward") == b"bidirectional" else 1
    return [a.decode().lower() for a in activations] == list(LSTM_DEFAULT) * directions


def lstm_default_activations(view: GraphView, node) -> None:
    """An LSTM whose `activations` attribute restates the defaults (Sigmoid, Tanh, Tanh per
    direction) loses the attribute.

    The QNN EP refuses any LSTM that carries the attribute, defaults or not: "QNN EP doesn't support
    non-default activations for LSTM" (its verbose log; the node then runs on the CPU). Exporters
    that write every attribute (e.g. some ONNX converters of Keras/TF models) produce it."""
    kept = [a for a in node.attribute if a.name != "activations"]
    new = view.node("LSTM", list(node.input), list(node.output), node.name or "LSTM")
    new.attribute.extend(kept)
    view.replace(node, [new])


# ---- any chain of nodes carrying a tensor of rank > 5 (the "unfold" idiom, and every
# other form) ----

def _rank_chain(view: GraphView, node) -> bool:
    return rank.foldable(view, node)


def high_rank_fold(view: GraphView, node) -> list[str]:
    """Every chain of nodes that carries a tensor of rank > 5 between legal tensors (Gather,
    Transpose, Reshape, Squeeze/Unsqueeze, Slice, Concat, elementwise) is computed at rank <=
    5: size-1 axes dropped, axes that move together folded into one (rank.py says how the
    folds are solved).

    The HTP holds tensors of rank 5 at most: the EP leaves every node that makes or reads a rank-6
    tensor on the CPU with no reason but "Failed to add node." (measured on a Gather of [1,4,8,10]
    by [2,3,5] indices, and on a speech enhancer's unfold: Gather of a rank-5 tensor by [3,129]
    indices, a rank-6 Transpose, a Reshape)."""
    return rank.fold(view, node)


# ---- dilated ConvTranspose with stride 1 ----

def _spatial(view: GraphView, node):
    """(kernel, dilations, strides, pads as (begin, end) pairs) of a Conv/ConvTranspose with a
    constant weight and explicit padding; None otherwise."""
    weight = view.constant(node.input[1])
    if weight is None or attribute(node, "auto_pad", b"NOTSET") != b"NOTSET":
        return None
    kernel = list(weight.shape[2:])
    n = len(kernel)
    dilations = list(attribute(node, "dilations", [1] * n))
    strides = list(attribute(node, "strides", [1] * n))
    pads = list(attribute(node, "pads", [0] * 2 * n))
    return kernel, dilations, strides, list(zip(pads[:n], pads[n:]))


def _transpose_as_conv(view: GraphView, node) -> bool:
    found = _spatial(view, node)
    if found is None or attribute(node, "output_shape") is not None:
        return False
    kernel, dilations, strides, pads = found
    if any(s != 1 for s in strides) or any(attribute(node, "output_padding", [0] * len(kernel))):
        return False
    return all(d * (k - 1) - p >= 0 for k, d, pair in zip(kernel, dilations, pads) for p in pair)


def convtranspose_as_conv(view: GraphView, node) -> None:
    """A ConvTranspose with stride 1 becomes the equivalent Conv: the kernel flipped in
    every spatial axis, its input/output channels swapped per group, padding d*(k-1) - p,
    the same dilation.

    The HTP's TransposeConv refuses dilation: "QNN's TransposeConv2d operator only supports default
    dilation values of 1." (the EP's log; the node runs on the CPU); its Conv takes dilation.
    Applied by "auto" to dilated ones only."""
    import numpy as np
    kernel, dilations, _, pads = _spatial(view, node)
    weight = view.constant(node.input[1])
    group = attribute(node, "group", 1)
    c_in, c_out_per_group = weight.shape[0], weight.shape[1]
    w = weight.reshape(group, c_in // group, c_out_per_group, *kernel).swapaxes(1, 2)
    w = w.reshape(group * c_out_per_group, c_in // group, *kernel)
    w = np.ascontiguousarray(np.flip(w, axis=tuple(range(2, 2 + len(kernel)))))
    begin = [d * (k - 1) - p for k, d, (p, _) in zip(kernel, dilations, pads)]
    end = [d * (k - 1) - p for k, d, (_, p) in zip(kernel, dilations, pads)]
    inputs = [node.input[0], view.add_constant(f"{node.input[1]}_as_conv", w), *node.input[2:]]
    view.replace(
        node,
        [
            view.node(
                "Conv",
                inputs,
                list(node.output),
                node.name or "ConvTranspose",
                dilations=dilations,
                group=group,
                kernel_shape=kernel,
                pads=begin + end,
            )
        ],
    )


# ---- Pow(x, 2) ----

def _square(view: GraphView, node) -> bool:
    exponent = view.constant(node.input[1])
    return exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0


def pow_square_as_mul(view: GraphView, node) -> None:
    """Pow(x, 2) becomes Mul(x, x).

    Reported on QAIRT 2.51 (SM8550, SM8750): in fp16 the HTP's Pow(x, 2.0) returns -4.0 for x = -0.0
    (or -1e-9), which turned a speech enhancer's output into garbage; a Mul has no such case and is
    cheaper. Whether this build's QAIRT still shows the fault is the known-wrong table's business
    (known_wrong.toml); "auto" applies the rule to every square, as it is exact and never slower."""
    view.replace(
        node,
        [view.node("Mul", [node.input[0], node.input[0]], list(node.output), node.name or "Pow")],
    )


# ---- 1-D Conv with a large dilation ----

def _dilated_conv_1d(view: GraphView, node) -> bool:
    found = _spatial(view, node)
    shape = view.shape(node.input[0])
    if found is None or shape is None or len(shape) != 3:
        return False
    _, dilations, strides, _ = found
    return strides == [1] and dilations[0] > 1


def conv_dilated_polyphase(view: GraphView, node) -> None:
    """A 1-D Conv with dilation D (stride 1) becomes a 2-D Conv without dilation on the D phases of
    its padded input: Pad (the conv's own padding, then up to a multiple of D), Reshape [N, C, L/D,
    D], Conv with kernel [k, 1], Reshape back, Slice to the original length.

    The HTP computes some dilated 1-D Convs wrong in fp16 (known_wrong.toml holds the measured
    ones); the same weights without dilation are right. "auto" applies it where the table
    names the Conv."""
    import numpy as np
    (k,), (dilation,), _, ((pad_begin, pad_end),) = _spatial(view, node)
    batch, _, length = view.shape(node.input[0])
    padded = length + pad_begin + pad_end
    rows = math.ceil(padded / dilation)
    out_length, out_rows = padded - dilation * (k - 1), rows - (k - 1)
    weight = view.constant(node.input[1])
    base, nodes, x = node.name or "Conv", [], node.input[0]
    extra = rows * dilation - padded
    if pad_begin or pad_end or extra:
        pads = view.add_constant(
            "polyphase_pads", np.array([0, 0, pad_begin, 0, 0, pad_end + extra], np.int64)
        )
        nodes.append(
            view.node("Pad", [x, pads], [x := view.fresh(f"{base}_padded")], f"{base}_pad")
        )
    grid = view.add_constant(
        "polyphase_grid",
        np.array([batch, weight.shape[1] * attribute(node, "group", 1), rows, dilation], np.int64),
    )
    nodes.append(
        view.node("Reshape", [x, grid], [x := view.fresh(f"{base}_phases")], f"{base}_phases")
    )
    w2 = view.add_constant(f"{node.input[1]}_phases", weight.reshape(*weight.shape, 1))
    nodes.append(
        view.node(
            "Conv",
            [x, w2, *node.input[2:]],
            [x := view.fresh(f"{base}_conv2d")],
            base,
            group=attribute(node, "group", 1),
            kernel_shape=[k, 1],
        )
    )
    flat = view.add_constant(
        "polyphase_flat", np.array([batch, weight.shape[0], out_rows * dilation], np.int64)
    )
    last = out_rows * dilation == out_length
    nodes.append(
        view.node(
            "Reshape",
            [x, flat],
            list(node.output) if last else [x := view.fresh(f"{base}_flat")],
            f"{base}_unphase",
        )
    )
    if not last:
        starts, ends, axes = (view.add_constant(f"polyphase_{n}", np.array([v], np.int64))
                              for n, v in (("start", 0), ("end", out_length), ("axis", 2)))
        nodes.append(view.node("Slice", [x, starts, ends, axes], list(node.output), f"{base}_cut"))
    view.replace(node, nodes)


# ---- Clip whose min or max is computed ----

def _clip_computed_bounds(view: GraphView, node) -> bool:
    bounds = [t for t in node.input[1:3] if t]
    return any(view.constant(t) is None for t in bounds)


def clip_as_max_min(view: GraphView, node) -> None:
    """A Clip whose min or max is computed from the data becomes Max(x, min) then Min(_, max) (each
    only where the bound is given): the same values, Clip being defined as exactly that.

    The HTP's Clip takes constant bounds only: "QNN doesn't support dynamic min/max." (the EP's log;
    the node runs on the CPU), e.g. a log-mel front end's top-dB floor, Clip(x, min = ReduceMax(x) -
    80); its elementwise Maximum and Minimum take computed tensors."""
    x, base = node.input[0], node.name or "Clip"
    bounds = [(op, t) for op, t in (("Max", node.input[1] if len(node.input) > 1 else ""),
                                    ("Min", node.input[2] if len(node.input) > 2 else "")) if t]
    nodes = []
    for i, (op, bound) in enumerate(bounds):
        out = list(node.output) if i == len(bounds) - 1 else [view.fresh(f"{base}_{op.lower()}")]
        nodes.append(view.node(op, [x, bound], out, f"{base}_{op.lower()}"))
        x = out[0]
    view.replace(node, nodes)


RULES = (
    # first: the nodes it inlines are then the other rules' to legalize (a LayerNorm's square
    # in a branch)
    Rule("if-as-where", ("If",), _if_inlinable, _if_inlinable, if_as_where),
    Rule(
        "lstm-default-activations",
        ("LSTM",),
        _lstm_restates_defaults,
        _lstm_restates_defaults,
        lstm_default_activations,
    ),
    Rule("high-rank-fold", rank.OP_TYPES, _rank_chain, _rank_chain, high_rank_fold),
    Rule(
        "convtranspose-as-conv",
        ("ConvTranspose",),
        _transpose_as_conv,
        lambda view, node: (
            _transpose_as_conv(view, node) and any(d > 1 for d in _spatial(view, node)[1])
        ),
        convtranspose_as_conv,
    ),
    Rule("pow-square-as-mul", ("Pow",), _square, _square, pow_square_as_mul),
    Rule(
        "conv-dilated-polyphase",
        ("Conv",),
        _dilated_conv_1d,
        lambda view, node: (
            _dilated_conv_1d(view, node) and known_wrong.match(view, node) is not None
        ),
        conv_dilated_polyphase,
    ),
    Rule(
        "clip-computed-bounds",
        ("Clip",),
        _clip_computed_bounds,
        _clip_computed_bounds,
        clip_as_max_min,
    ),
)
