"""What the HTP cannot hold, checked on a node the EP refused without a reason ("Failed to add
node."): the measurable limits of its tensors, so a failing convert names the cause instead of
passing the EP's silence on."""
from __future__ import annotations

from toolchain.rewrites import rank
from toolchain.rewrites.view import GraphView

NO_64_BIT = {11: "float64"}   # the HTP has no 64-bit float (onnx TensorProto.DOUBLE)


def broken(view: GraphView, node) -> str:
    """The first limit of the HTP a node's tensors break, in words ("" when none is found): a rank
    above 5 (and whether the rank rule folds its chain), a 64-bit float."""
    for kind, names in (("input", node.input), ("output", node.output)):
        for name in names:
            shape = view.shape(name) if name else None
            if shape is not None and len(shape) > rank.MAX_RANK:
                why = rank.why_not(view, rank.chain(view, node))
                return (f"{kind} {name} has rank {len(shape)} > {rank.MAX_RANK}, the HTP's most"
                        + (f" — no rule matches this chain: {why}" if why else ""))
    for name in (*node.input, *node.output):
        dtype = view.dtype(name) if name else None
        if dtype in NO_64_BIT:
            return f"{name} is {NO_64_BIT[dtype]}, which the HTP does not have"
    return ""
