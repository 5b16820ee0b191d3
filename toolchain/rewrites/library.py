"""The rewrite rules, in the order they are applied, and what the build calls: `problems` (a spec's value), `apply`
(the simplify stage), `for_node` (a failing convert's hint). Each rule is exact (the same function, up to float
rounding on the CPU); the docstring of each `apply` says when the HTP needs it and what was measured (QAIRT 2.51,
the wheel's onnxruntime-qnn 2.7.0, its EP log or its x86 simulator)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from toolchain.rewrites import known_wrong
from toolchain.rewrites.view import GraphView, attribute

# numpy is imported where used: doit's own process loads this module on every run (tests/test_engine_worker.py)

AUTO = "auto"


@dataclass(frozen=True)
class Rule:
    """One legalizing ONNX rewrite: the ops it reads, when it applies, when the HTP needs it, and how."""

    name: str
    op_types: tuple[str, ...]
    applies: Callable   # (GraphView, node) -> bool: the rewrite is defined for this node (explicit `rewrite = [...]`)
    needed: Callable    # (GraphView, node) -> bool: the HTP refuses or miscomputes the node as written ("auto")
    apply: Callable     # (GraphView, node) -> None: replaces the node in the view

    @property
    def why(self) -> str:
        """The rule's docstring on one line: what it does, then when the HTP needs it, with the measured reason."""
        return " ".join((self.apply.__doc__ or "").split())


def rules() -> dict[str, Rule]:
    return {r.name: r for r in RULES}


def problems(declared) -> str:
    """Why a spec's `rewrite` value is not one (empty when it is): "auto" or a list of known rule names."""
    if declared == AUTO:
        return ""
    known = tuple(rules())
    if not isinstance(declared, (list, tuple)) or not declared or not all(isinstance(n, str) for n in declared):
        return f"expected \"auto\" or a list of rewrite names ({', '.join(known)}), got {declared!r}"
    for name in declared:
        if name not in known:
            import difflib  # for an error's suggestion only: not at every load
            close = difflib.get_close_matches(name, known, n=1)
            return f"unknown rewrite {name!r}; " + (f"did you mean {close[0]!r}?" if close else
                                                     f"known: {', '.join(known)}")
    if len(set(declared)) != len(declared):
        return "a rewrite is listed twice"
    return ""


def apply(onnx_model, declared) -> list[dict]:
    """Rewrite `onnx_model` in place with the declared rules ("auto": each rule where the HTP needs it), in the
    library's order; [{"rewrite": name, "nodes": [the original nodes it replaced]}] of those that changed something."""
    view = GraphView(onnx_model)
    applied = []
    for rule in rules().values():
        if declared != AUTO and rule.name not in declared:
            continue
        test = rule.needed if declared == AUTO else rule.applies
        touched = []
        for node in list(view.graph.node):
            if node.op_type in rule.op_types and test(view, node):
                touched.append(view.label(node))
                rule.apply(view, node)
        if touched:
            applied.append({"rewrite": rule.name, "nodes": touched})
    if applied:
        view.finish()
    return applied


def for_node(onnx_model, node_name: str) -> str:
    """The rule that would make the HTP take this node ("" when none does): what a failing convert suggests."""
    view = GraphView(onnx_model)
    for node in view.graph.node:
        if node.name == node_name:
            return next((r.name for r in rules().values() if node.op_type in r.op_types and r.needed(view, node)), "")
    return ""


# ---- LSTM whose `activations` attribute spells out the defaults ----

LSTM_DEFAULT = ("sigmoid", "tanh", "tanh")


def _lstm_restates_defaults(view: GraphView, node) -> bool:
    activations = attribute(node, "activations")
    if activations is None or attribute(node, "activation_alpha") or attribute(node, "activation_beta"):
        return False
    directions = 2 if attribute(node, "direction", b"forward") == b"bidirectional" else 1
    return [a.decode().lower() for a in activations] == list(LSTM_DEFAULT) * directions


def lstm_default_activations(view: GraphView, node) -> None:
    """An LSTM whose `activations` attribute restates the defaults (Sigmoid, Tanh, Tanh per direction) loses the
    attribute.

    The QNN EP refuses any LSTM that carries the attribute, defaults or not: "QNN EP doesn't support non-default
    activations for LSTM" (its verbose log; the node then runs on the CPU). Exporters that write every attribute
    (e.g. some ONNX converters of Keras/TF models) produce it."""
    kept = [a for a in node.attribute if a.name != "activations"]
    new = view.node("LSTM", list(node.input), list(node.output), node.name or "LSTM")
    new.attribute.extend(kept)
    view.replace(node, [new])


# ---- Gather whose output has more than 5 dimensions (the "unfold" idiom) ----

MAX_RANK = 5   # the HTP's tensors: a rank-6 tensor fails every op that makes or reads it ("Failed to add node.")


def _gather_high_rank(view: GraphView, node) -> bool:
    out = view.shape(node.output[0])
    data, indices = view.shape(node.input[0]), view.shape(node.input[1])
    if out is None or data is None or indices is None or len(out) <= MAX_RANK or view.is_output(node.output[0]):
        return False
    users = view.consumers(node.output[0])
    return bool(users) and all(u.op_type == "Reshape" and u.input[0] == node.output[0] for u in users)


def gather_high_rank(view: GraphView, node) -> None:
    """A Gather whose output has rank > 5 and is only reshaped gathers flat indices instead (its output keeps the
    data's rank) and the reshapes read that.

    The HTP holds tensors of rank 5 at most: the EP leaves a Gather with a rank-6 output on the CPU with no reason
    but "Failed to add node." (and so every node that reads it), measured on [1,4,8,10] gathered by [2,3,5]
    indices. Frame-splitting code ("unfold": Gather with 2-D indices, then Reshape) makes such a Gather."""
    import numpy as np
    indices = view.constant(node.input[1])
    if indices is not None:
        flat = view.add_constant(f"{node.input[1]}_flat", indices.reshape(-1))
        before = []
    else:
        flat = view.fresh(f"{node.input[1]}_flat")
        before = [view.node("Reshape", [node.input[1], view.add_constant("minus_one", np.array([-1], np.int64))],
                            [flat], f"{node.name or 'Gather'}_flatten_indices")]
    gathered = view.fresh(f"{node.output[0]}_flat")
    for user in view.consumers(node.output[0]):
        user.input[0] = gathered
    view.replace(node, [*before, view.node("Gather", [node.input[0], flat], [gathered], node.name or "Gather",
                                           axis=attribute(node, "axis", 0))])


# ---- dilated ConvTranspose with stride 1 ----

def _spatial(view: GraphView, node):
    """(kernel, dilations, strides, pads as (begin, end) pairs) of a Conv/ConvTranspose with a constant weight and
    explicit padding; None otherwise."""
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
    """A ConvTranspose with stride 1 becomes the equivalent Conv: the kernel flipped in every spatial axis, its
    input/output channels swapped per group, padding d*(k-1) - p, the same dilation.

    The HTP's TransposeConv refuses dilation: "QNN's TransposeConv2d operator only supports default dilation values
    of 1." (the EP's log; the node runs on the CPU); its Conv takes dilation. Applied by "auto" to dilated ones only."""
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
    view.replace(node, [view.node("Conv", inputs, list(node.output), node.name or "ConvTranspose",
                                  dilations=dilations, group=group, kernel_shape=kernel, pads=begin + end)])


# ---- Pow(x, 2) ----

def _square(view: GraphView, node) -> bool:
    exponent = view.constant(node.input[1])
    return exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0


def pow_square_as_mul(view: GraphView, node) -> None:
    """Pow(x, 2) becomes Mul(x, x).

    Reported on QAIRT 2.51 (SM8550, SM8750): in fp16 the HTP's Pow(x, 2.0) returns -4.0 for x = -0.0 (or -1e-9),
    which turned a speech enhancer's output into garbage; a Mul has no such case and is cheaper. Whether this build's
    QAIRT still shows the fault is the known-wrong table's business (known_wrong.toml); "auto" applies the rule to
    every square, as it is exact and never slower."""
    view.replace(node, [view.node("Mul", [node.input[0], node.input[0]], list(node.output), node.name or "Pow")])


# ---- 1-D Conv with a large dilation ----

def _dilated_conv_1d(view: GraphView, node) -> bool:
    found = _spatial(view, node)
    shape = view.shape(node.input[0])
    if found is None or shape is None or len(shape) != 3:
        return False
    _, dilations, strides, _ = found
    return strides == [1] and dilations[0] > 1


def conv_dilated_polyphase(view: GraphView, node) -> None:
    """A 1-D Conv with dilation D (stride 1) becomes a 2-D Conv without dilation on the D phases of its padded
    input: Pad (the conv's own padding, then up to a multiple of D), Reshape [N, C, L/D, D], Conv with kernel
    [k, 1], Reshape back, Slice to the original length.

    The HTP computes some dilated 1-D Convs wrong in fp16 (known_wrong.toml holds the measured ones); the same
    weights without dilation are right. "auto" applies it where the table names the Conv."""
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
        pads = view.add_constant("polyphase_pads", np.array([0, 0, pad_begin, 0, 0, pad_end + extra], np.int64))
        nodes.append(view.node("Pad", [x, pads], [x := view.fresh(f"{base}_padded")], f"{base}_pad"))
    grid = view.add_constant("polyphase_grid", np.array([batch, weight.shape[1] * attribute(node, "group", 1),
                                                         rows, dilation], np.int64))
    nodes.append(view.node("Reshape", [x, grid], [x := view.fresh(f"{base}_phases")], f"{base}_phases"))
    w2 = view.add_constant(f"{node.input[1]}_phases", weight.reshape(*weight.shape, 1))
    nodes.append(view.node("Conv", [x, w2, *node.input[2:]], [x := view.fresh(f"{base}_conv2d")], base,
                           group=attribute(node, "group", 1), kernel_shape=[k, 1]))
    flat = view.add_constant("polyphase_flat", np.array([batch, weight.shape[0], out_rows * dilation], np.int64))
    last = out_rows * dilation == out_length
    nodes.append(view.node("Reshape", [x, flat], list(node.output) if last else [x := view.fresh(f"{base}_flat")],
                           f"{base}_unphase"))
    if not last:
        starts, ends, axes = (view.add_constant(f"polyphase_{n}", np.array([v], np.int64))
                              for n, v in (("start", 0), ("end", out_length), ("axis", 2)))
        nodes.append(view.node("Slice", [x, starts, ends, axes], list(node.output), f"{base}_cut"))
    view.replace(node, nodes)


RULES = (
    Rule("lstm-default-activations", ("LSTM",), _lstm_restates_defaults, _lstm_restates_defaults,
         lstm_default_activations),
    Rule("gather-high-rank", ("Gather",), _gather_high_rank, _gather_high_rank, gather_high_rank),
    Rule("convtranspose-as-conv", ("ConvTranspose",), _transpose_as_conv,
         lambda view, node: _transpose_as_conv(view, node) and any(d > 1 for d in _spatial(view, node)[1]),
         convtranspose_as_conv),
    Rule("pow-square-as-mul", ("Pow",), _square, _square, pow_square_as_mul),
    Rule("conv-dilated-polyphase", ("Conv",), _dilated_conv_1d,
         lambda view, node: _dilated_conv_1d(view, node) and known_wrong.match(view, node) is not None,
         conv_dilated_polyphase),
)
