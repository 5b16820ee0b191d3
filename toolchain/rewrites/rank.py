"""The HTP's tensors have rank 5 at most: a chain of nodes that carries a tensor of rank > 5 between
legal ones is computed at rank <= 5 instead, by dropping the size-1 axes and folding the axes that
move together into one.

A chain is every node that makes or reads such a tensor (connected through those tensors).
Row-major order is what makes the fold exact: a tensor with its size-1 axes dropped and
neighbouring axes merged holds its elements in the same order, so a Reshape (or Squeeze, Unsqueeze,
Flatten) can read the folded tensor directly, and a Gather that makes a rank > 5 tensor from 2-D
indices gathers the flat indices instead. Between the ends, each node puts a limit on which axes
may fold: a Transpose only folds the axes it keeps together and in order; a Slice or Concat keeps
its axis alone; an elementwise node folds its inputs and output alike. The folds are solved over
the whole chain, and the chain is rewritten only when every tensor in it fits in rank 5 and every
node in it is one of those kinds."""
from __future__ import annotations

from dataclasses import dataclass, field

from toolchain.rewrites.view import GraphView, attribute

# the HTP's tensors: a rank-6 tensor fails every op that makes or reads it ("Failed to add node.")
MAX_RANK = 5

# read and write the elements in row-major order
ORDER = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
ELEMENTWISE = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Erf",
    "Cast",
    "Identity",
    "Clip",
    "LeakyRelu",
    "Softplus",
    "HardSigmoid",
)
SAME_LAYOUT = ("Slice", "Concat")   # an axis of their own; the other axes as their inputs
OP_TYPES = ("Gather", "Transpose", *ORDER, *ELEMENTWISE, *SAME_LAYOUT)


@dataclass
class Layout:
    """How one rank > 5 tensor folds: the axes kept (size > 1, or kept by a node), and for each pair
    of neighbouring kept axes whether they merge."""

    shape: tuple[int, ...]
    kept: set[int] = field(default_factory=set)
    # kept axes that start a new group (a cut before them)
    apart: set[int] = field(default_factory=set)
    # kept axes that are a group of their own (a Slice's, a Concat's)
    alone: set[int] = field(default_factory=set)

    def joins(self, first: int, second: int) -> bool:
        """Whether the two axes are neighbours among the kept ones, in this order, in one group."""
        order = sorted(self.kept)
        at = order.index(first) if first in order else -1
        return (0 <= at < len(order) - 1 and order[at + 1] == second and second not in self.apart
                and not {first, second} & self.alone)

    def groups(self) -> list[list[int]]:
        found: list[list[int]] = []
        for axis in sorted(self.kept):
            if found and self.joins(found[-1][-1], axis):
                found[-1].append(axis)
            else:
                found.append([axis])
        return found

    def folded(self) -> list[int]:
        import math
        return [math.prod(self.shape[a] for a in g) for g in self.groups()]

    def group_of(self, axis: int) -> int:
        return next(i for i, g in enumerate(self.groups()) if axis in g)


def dims(view: GraphView, name: str) -> tuple[int, ...]:
    """The static shape of a tensor the chain already knows to have one."""
    shape = view.shape(name)
    if shape is None:
        raise ValueError(f"{name} has no static shape")
    return shape


def high(view: GraphView, name: str) -> bool:
    shape = view.shape(name) if name else None
    return shape is not None and len(shape) > MAX_RANK


def chain(view: GraphView, node) -> list:
    """The nodes connected to `node` through rank > 5 tensors, in graph order ([] when
    it touches none)."""
    nodes = list(view.graph.node)
    seen: set[str] = set()
    todo = [t for t in (*node.input, *node.output) if high(view, t)]
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for other in nodes:
            if tensor in other.input or tensor in other.output:
                todo.extend(
                    t for t in (*other.input, *other.output) if t not in seen and high(view, t)
                )
    return [n for n in nodes if any(t in seen for t in (*n.input, *n.output))]


def why_not(view: GraphView, nodes: list) -> str:
    """Why the chain cannot be folded ("" when it can): the node and what stops it."""
    return _solve(view, nodes)[1]


def _axis(node, rank: int) -> int:
    axis = attribute(node, "axis", 0)
    return axis + rank if axis < 0 else axis


def _slice_axes(view: GraphView, node, rank: int) -> list[int] | None:
    starts = view.constant(node.input[1])
    if starts is None or any(view.constant(t) is None for t in node.input[2:] if t):
        return None
    axes = (
        view.constant(node.input[3])
        if len(node.input) > 3 and node.input[3]
        else range(len(starts.reshape(-1)))
    )
    return [int(a) + rank if a < 0 else int(a) for a in list(axes)]


def _solve(view: GraphView, nodes: list) -> tuple[dict[str, Layout], str]:
    """The layout of every rank > 5 tensor of the chain, or why there is none."""
    layouts: dict[str, Layout] = {}
    for node in nodes:
        for t in (*node.input, *node.output):
            if high(view, t) and t not in layouts:
                given = {i.name for i in view.graph.input} - {
                    i.name for i in view.graph.initializer
                }
                if view.is_output(t) or t in given:
                    return {}, f"{t} (rank {len(dims(view, t))}) is an input or output of the graph"
                shape = dims(view, t)
                layouts[t] = Layout(shape, {a for a, n in enumerate(shape) if n != 1})
    ties: list[tuple[str, str, list[int]]] = []   # (a, b, perm): b's axis j is a's axis perm[j]
    for node in nodes:
        ins = [t for t in node.input if t in layouts]
        outs = [t for t in node.output if t in layouts]
        label = f"{node.name or node.op_type} ({node.op_type})"
        if node.op_type in ORDER:
            continue
        if node.op_type == "Gather":
            if ins:
                return (
                    {},
                    f"{label} reads a rank {len(dims(view, ins[0]))} tensor: no fold of a Gather's "
                    "input",
                )
            if view.shape(node.input[1]) is None:
                return {}, f"{label}: the indices have no static shape"
            continue
        if node.op_type == "Transpose":
            perm = list(attribute(node, "perm", []))
            ties.append((ins[0], outs[0], perm))
            continue
        if node.op_type in ELEMENTWISE or node.op_type in SAME_LAYOUT:
            same = ins + outs
            for t in node.input:
                if (
                    t
                    and t not in layouts
                    and view.shape(t) is not None
                    and _numel(view.shape(t)) != 1
                    and node.op_type not in SAME_LAYOUT[:1]
                ):
                    return (
                        {},
                        f"{label} broadcasts {t} {list(dims(view, t))} against a rank > 5 tensor",
                    )
                if t and t not in layouts and view.shape(t) is None:
                    return {}, f"{label}: {t} has no static shape"
            if node.op_type == "Concat" and len(ins) != len([t for t in node.input if t]):
                return {}, f"{label} joins a rank > 5 tensor with a tensor of another rank"
            rank = len(dims(view, same[0]))
            if node.op_type in SAME_LAYOUT:
                axes = (
                    [_axis(node, rank)]
                    if node.op_type == "Concat"
                    else _slice_axes(view, node, rank)
                )
                if axes is None:
                    return {}, f"{label}: starts, ends, axes and steps must be constants"
                for t in same:
                    layouts[t].kept.update(axes)
                    layouts[t].alone.update(axes)
            if any(len(dims(view, t)) != rank for t in same):
                return {}, f"{label}: its rank > 5 tensors differ in rank"
            ties.extend((same[0], t, list(range(rank))) for t in same[1:])
            continue
        return (
            {},
            f"{label} makes or reads a rank > 5 tensor and no fold is defined for {node.op_type}",
        )
    _tie(layouts, ties)
    for t, layout in layouts.items():
        if len(layout.groups()) > MAX_RANK:
            return (
                {},
                f"{t} {list(layout.shape)} folds to rank {len(layout.groups())} at best: its axes "
                "do not move "
                f"together",
            )
        if not layout.groups():
            return {}, f"{t} {list(layout.shape)} has no axis above 1"
    return layouts, ""


def _numel(shape) -> int:
    import math
    return math.prod(shape)


def _tie(layouts: dict[str, Layout], ties: list) -> None:
    """Until nothing changes: tied tensors keep the same axes (through the permutation) and fold
    only what is neighbouring, in order, and folded in both."""
    changed = True
    while changed:
        changed = False
        for a, b, perm in ties:
            la, lb = layouts[a], layouts[b]
            inverse = {src: j for j, src in enumerate(perm)}
            kept_b = lb.kept | {inverse[x] for x in la.kept}
            kept_a = la.kept | {perm[j] for j in kept_b}
            alone_b = lb.alone | {inverse[x] for x in la.alone}
            alone_a = la.alone | {perm[j] for j in alone_b}
            if (kept_a, kept_b, alone_a, alone_b) != (la.kept, lb.kept, la.alone, lb.alone):
                la.kept, lb.kept, la.alone, lb.alone, changed = (
                    kept_a,
                    kept_b,
                    alone_a,
                    alone_b,
                    True,
                )
            # b's neighbours (j1, j2) stay in one group only if a's axes perm[j1], perm[j2] do; and
            # the other way
            for left, right, to_other in ((lb, la, perm), (la, lb, inverse)):
                order = sorted(left.kept)
                for first, second in zip(order, order[1:]):
                    if left.joins(first, second) and not right.joins(
                        to_other[first], to_other[second]
                    ):
                        left.apart.add(second)
                        changed = True


def foldable(view: GraphView, node) -> bool:
    nodes = chain(view, node)
    return bool(nodes) and node in nodes and not why_not(view, nodes)


def fold(view: GraphView, node) -> list[str]:
    """Rewrite the chain of `node` at rank <= 5; the labels of the nodes it replaced."""
    import numpy as np
    nodes = chain(view, node)
    layouts, _ = _solve(view, nodes)
    labels = [view.label(n) for n in nodes]
    name = {t: view.fresh(f"{t}_rank{len(layout.groups())}") for t, layout in layouts.items()}
    for t, layout in layouts.items():   # a rank > 5 constant is stored folded
        value = view.constant(t)
        if value is not None:
            name[t] = view.add_constant(name[t], value.reshape(layout.folded()))

    def read(t: str) -> str:
        return name.get(t, t)

    def to_shape(src: str, out: str, base: str) -> list:
        target = layouts[out].folded() if out in layouts else list(dims(view, out))
        shape = view.add_constant(f"{base}_shape", np.array(target, np.int64))
        return [view.node("Reshape", [read(src), shape], [read(out)], base)]

    for n in nodes:
        base = n.name or n.op_type
        if n.op_type in ORDER:
            new = to_shape(n.input[0], n.output[0], base)
        elif n.op_type == "Gather":
            indices = view.constant(n.input[1])
            if indices is not None:
                flat, before = view.add_constant(f"{n.input[1]}_flat", indices.reshape(-1)), []
            else:
                flat = view.fresh(f"{n.input[1]}_flat")
                before = [
                    view.node(
                        "Reshape",
                        [n.input[1], view.add_constant("minus_one", np.array([-1], np.int64))],
                        [flat],
                        f"{base}_flatten_indices",
                    )
                ]
            gathered = view.fresh(f"{n.output[0]}_flat")
            new = [
                *before,
                view.node(
                    "Gather", [n.input[0], flat], [gathered], base, axis=attribute(n, "axis", 0)
                ),
            ]
            new += to_shape(gathered, n.output[0], f"{base}_fold")
            name[gathered] = gathered
        elif n.op_type == "Transpose":
            src, out = layouts[n.input[0]], layouts[n.output[0]]
            perm = list(attribute(n, "perm"))
            groups_in = src.groups()
            folded = [groups_in.index([perm[j] for j in g]) for g in out.groups()]
            new = [
                view.node("Transpose", [read(n.input[0])], [read(n.output[0])], base, perm=folded)
            ]
        else:
            inputs = []
            for t in n.input:
                value = view.constant(t) if t and t not in layouts else None
                if (
                    value is not None
                    and value.size == 1
                    and value.ndim > 0
                    and n.op_type != "Slice"
                ):
                    t = view.add_constant(f"{t}_scalar", value.reshape(()))
                inputs.append(read(t))
            attrs = {a.name: attribute(n, a.name) for a in n.attribute}
            layout = layouts[next(t for t in (*n.input, *n.output) if t in layouts)]
            if n.op_type == "Concat":
                attrs["axis"] = layout.group_of(_axis(n, len(layout.shape)))
            if n.op_type == "Slice":
                axes = _slice_axes(view, n, len(layout.shape)) or []
                inputs = inputs[:3] + [view.add_constant(f"{base}_axes", np.array(
                    [layout.group_of(a) for a in axes], np.int64))] + inputs[4:]
            new = [view.node(n.op_type, inputs, [read(t) for t in n.output], base, **attrs)]
        view.replace(n, new)
    return labels
