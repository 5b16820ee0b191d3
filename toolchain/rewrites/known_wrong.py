"""The ops the HTP is measured to compute wrong, as data (known_wrong.toml): each row an op pattern,
the fault as measured, the QAIRT families it was measured on and the rewrite that avoids it.
`inspect` fails a graph that holds one (before any compile) unless its spec applies that rewrite; a
test per row runs the one-op graph in the simulator and asserts the fault is still there, so a QAIRT
that fixes it says the row can go."""
from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from toolchain.rewrites.view import GraphView, attribute

TABLE = Path(__file__).with_name("known_wrong.toml")
# What a row's `when` may test: a Conv's input rank, input channels per group, largest dilation,
# smallest pad and whether its pads are the same at both ends; a Pow's constant exponent
CONDITIONS = (
    "rank",
    "channels_per_group_min",
    "dilation_min",
    "pad_min",
    "symmetric_pads",
    "exponent",
)


@functools.cache
def rows() -> tuple[dict, ...]:
    found = tomllib.loads(TABLE.read_text())["fault"]
    for i, row in enumerate(found):
        unknown = set(row["when"]) - set(CONDITIONS)
        if unknown:
            raise ValueError(
                f"{TABLE}: fault[{i}].when: unknown condition(s) {sorted(unknown)}; known: "
                f"{CONDITIONS}"
            )
    return tuple(found)


def match(view: GraphView, node) -> dict | None:
    """The first row whose pattern the node matches, or None."""
    return next(
        (
            row
            for row in rows()
            if row["op_type"] == node.op_type and _holds(view, node, row["when"])
        ),
        None,
    )


def found(onnx_model, precision: str = "fp16") -> list[tuple[str, dict]]:
    """(node, row) for every node of the graph a row measured at the graph's precision names
    (read-only: `onnx_model` is not changed)."""
    if not {row["op_type"] for row in rows() if precision in row["precision"]} & \
            {n.op_type for n in onnx_model.graph.node}:
        return []   # no shape inference over a model that holds none of the ops
    copy = type(onnx_model)()
    copy.CopyFrom(onnx_model)
    view = GraphView(copy)
    return [(view.label(n), row) for n in view.graph.node for row in [match(view, n)]
            if row and precision in row["precision"]]


def _holds(view: GraphView, node, when: dict) -> bool:
    shape = view.shape(node.input[0])
    weight = view.constant(node.input[1]) if len(node.input) > 1 else None
    kernel = list(weight.shape[2:]) if weight is not None and weight.ndim > 2 else []
    dilations = list(attribute(node, "dilations", [1] * len(kernel)))
    pads = list(attribute(node, "pads", [0] * 2 * len(kernel)))
    per_group = weight.shape[1] if weight is not None and weight.ndim > 2 else 0
    tests = {
        "rank": lambda v: shape is not None and len(shape) == v,
        "channels_per_group_min": lambda v: per_group >= v,
        "dilation_min": lambda v: bool(dilations) and max(dilations) >= v,
        "pad_min": lambda v: bool(pads) and min(pads) >= v,
        "symmetric_pads": lambda v: (pads[: len(kernel)] == pads[len(kernel) :]) == v,
        "exponent": lambda v: (
            weight is not None and weight.size == 1 and float(weight.reshape(-1)[0]) == v
        ),
    }
    return all(tests[key](value) for key, value in when.items())


def message(node: str, row: dict) -> str:
    return (
        f"{node} ({row['op_type']}) is computed wrong on the HTP: {row['fault']} (measured on "
        "QAIRT "
        f"{', '.join(row['qairt'])}: toolchain/rewrites/known_wrong.toml); apply the rewrite "
        f"{row['rewrite']!r} "
        f'(rewrite = ["{row["rewrite"]}"] or "auto")'
    )
