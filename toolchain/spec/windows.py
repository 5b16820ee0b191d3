"""[windows]: several fixed input lengths of one model (Whisper's encoder windows), each a graph
of its own.

    [windows] sizes = [5, 10, 30]                            # the largest is the graphs as declared
    under [graphs] unit = "s"                                     # names the copies:
    <graph>_<size><unit> (encoder_5s)
    graphs = ["encoder", "decoder"]                # the graphs cut per window
    axes = { mel = 2, cross_k = 2, cross_v = 2 }   # the axis of each tensor that follows the window
    route = "auto"                                 # or [10, 30]: the windows the bundle's
    loop may pick

Routing: the bundle's loop picks the smallest routed window that holds the input. "auto" routes the
largest window and every window the model code's agree() found "safe" at parity (on the CPU, over
every sample that fits it: its task outputs equal the largest window's); a list routes those sizes
whatever was measured.

A window is a first-class graph, not a variant: a variant is a model of its own (own checkpoint,
bundle, binary), while the windows of one model share its weights, its bundle (which picks a window
per utterance) and, where the compiler can, one context binary per chip (docs/whisper-windows.md).
So each cut copy is an ordinary Graph that every stage (export, simplify, parity, compile, verify)
handles as it handles any graph; the declared graphs keep their names and files, so a spec that adds
windows rebuilds nothing it built before."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from toolchain.spec.records import NAME, Graph, Tensor
from toolchain.spec.table import Settings, Table


def windows(t: Table, graphs: tuple[Graph, ...]) -> tuple[Settings, tuple[Graph, ...]]:
    """The [windows] record and the cut copies of its graphs, largest window first out (it is
    the declared one)."""
    sizes = t.req("sizes", list)
    if len(sizes) < 2 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes
    ):
        t.fail(
            "sizes",
            "expected two or more positive integers (the largest is the graphs as declared), got "
            f"{sizes}",
        )
    if sizes != sorted(set(sizes)):
        t.fail("sizes", f"expected each size once, smallest first, got {sizes}")
    unit = t.opt("unit", str, "s")
    if not NAME.match(f"x{unit}"):
        t.fail("unit", f"{unit!r} becomes part of graph names: lower-case letters and digits only")
    names = t.req("graphs", list)
    declared = {g.name: g for g in graphs}
    for name in names:
        if name not in declared:
            t.fail(
                "graphs", f"{name!r} is not a graph of this model (graphs: {', '.join(declared)})"
            )
    if not names or len(set(names)) != len(names):
        t.fail("graphs", f"expected the names of the graphs cut per window, each once, got {names}")
    axes = t.req("axes", dict)
    tensors = {x.name: x for n in names for x in (*declared[n].inputs, *declared[n].outputs)}
    for tensor, axis in axes.items():
        if tensor not in tensors:
            t.fail(f"axes.{tensor}", f"no tensor {tensor!r} in the graphs {names}")
        if (
            not isinstance(axis, int)
            or isinstance(axis, bool)
            or not 0 <= axis < len(tensors[tensor].shape)
        ):
            t.fail(
                f"axes.{tensor}",
                f"expected an axis of shape {list(tensors[tensor].shape)}, got {axis!r}",
            )
        length = tensors[tensor].shape[axis]
        for size in sizes:
            if length * size % sizes[-1]:
                t.fail(
                    f"axes.{tensor}",
                    f"{tensor}'s length {length} at {sizes[-1]}{unit} is not a whole number "
                    f"at {size}{unit} ({length} * {size} / {sizes[-1]})",
                )
    for name in names:
        if not any(x.name in axes for x in (*declared[name].inputs, *declared[name].outputs)):
            t.fail(
                "axes",
                f"graph {name!r} has no tensor in axes: it would be the same at every window",
            )
        if declared[name].stream or declared[name].source:
            t.fail(
                "graphs",
                f"graph {name!r} declares a stream or a source; a window is cut from exported "
                "graphs",
            )
    route = t.opt("route", (str, list), "auto")
    if route != "auto" and (
        not isinstance(route, list)
        or not route
        or any(r not in sizes for r in route)
        or sizes[-1] not in route
    ):
        t.fail(
            "route",
            f'expected "auto" or a list of the sizes {sizes} that holds the largest, got {route!r}',
        )
    t.done()
    copies = tuple(
        cut(declared[name], size, sizes[-1], unit, axes) for size in sizes[:-1] for name in names
    )
    for copy in copies:
        if copy.name in declared:
            t.fail("sizes", f"the window copy {copy.name!r} has the name of a declared graph")
    record = Settings(
        {
            "sizes": tuple(sizes),
            "unit": unit,
            "graphs": tuple(names),
            "axes": Settings(axes),
            "route": route if route == "auto" else tuple(sorted(route)),
        }
    )
    return record, copies


def cut(graph: Graph, size: int, largest: int, unit: str, axes: dict) -> Graph:
    """`graph` (declared at the largest window) at window `size`: each tensor in `axes` scaled
    on its axis."""
    def scaled(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return tuple(
            dataclasses.replace(
                x,
                shape=tuple(
                    d * size // largest if i == axes[x.name] else d for i, d in enumerate(x.shape)
                ),
            )
            if x.name in axes
            else x
            for x in tensors
        )

    return dataclasses.replace(
        graph,
        name=graph_name(graph.name, size, unit),
        inputs=scaled(graph.inputs),
        outputs=scaled(graph.outputs),
    )


def graph_name(graph_name: str, size: int, unit: str) -> str:
    return f"{graph_name}_{size}{unit}"


def by_size(windows: Settings) -> dict[int, dict[str, str]]:
    """{window size: {declared graph: the graph that runs it at that size}}, smallest first
    ({} without windows)."""
    if not windows:
        return {}
    sizes, largest = windows["sizes"], windows["sizes"][-1]
    return {
        size: {
            g: g if size == largest else graph_name(g, size, windows["unit"])
            for g in windows["graphs"]
        }
        for size in sizes
    }


def routed(windows: Mapping, task_record: dict | None) -> tuple[list[int], dict[int, str]]:
    """(the sizes the loop may pick, {size: why it is not picked}): route = "auto" reads the
    parity record's task metric ("windows": {size: {"safe": bool, "summary": ...}}, from the
    model code's agree())."""
    sizes, largest = list(windows["sizes"]), windows["sizes"][-1]
    if windows["route"] != "auto":
        return list(windows["route"]), {
            s: "not in the spec's route" for s in sizes if s not in windows["route"]
        }
    rows = (task_record or {}).get("windows") or {}
    why = {}
    for size in sizes[:-1]:
        row = rows.get(f"{size:g}") or rows.get(str(size))
        if row is None:
            why[size] = (
                "no task metric of this window at parity (the model code's agree() records none)"
            )
        elif not row.get("safe"):
            why[size] = (
                f"its outputs differ from the {largest}{windows['unit']} window's: "
                f"{row.get('summary', '')}"
            )
    return [s for s in sizes if s not in why], why
