"""Where a compiled graph departs from the CPU: the first op whose output is off beyond
the verify threshold.

`doit diagnose:<model>@<CHIP>` (on demand; a failed verify names the command). For every graph, on
the same real input verify uses, the graph is cut after one op at a time (onnx's Extractor: graph
inputs -> that op's output), the piece compiled and run by the model's compiler on the simulator
exactly as the whole graph is, and compared with the same piece on the CPU. The search follows the
data: a bisection over the ops the bad tensor is computed from, then the op found is held to its own
feeders (a bad feeder on another branch moves the search there), so a graph of N ops costs about
log2(N) + a few compiles; the op named is then run alone on the CPU's values of its inputs, which
confirms the fault is its own. Reported per graph: op name and type, the tensor where it starts, its
error, the op before it still within the threshold and the lone op's error; in the task's output and
build/<model>/<toolchain>/<chip>/diagnose.json."""
from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, cast

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import read_json, write_json
from toolchain.engine.run.worker import in_process, load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata
from toolchain.shared.iorecord import io_record
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Compiler, Project, named

FLOATS = (1, 10)   # onnx.TensorProto.FLOAT, FLOAT16: the tensors compared (not shapes or indices)
# onnx_model: an onnx.ModelProto (Any: onnx is imported where used)
Piece = Callable[[str], Callable[[dict], dict]]   # compile_piece(path) -> run(feeds) -> outputs


def tasks(project: Project) -> Iterator[dict]:
    for model, chip in project.model_chips():
        compiler = project.compiler(model)
        cut = pieces(model, compiler, chip)
        if not cut:
            # a compiler or precision that cannot compile cut pieces (the task would do nothing)
            continue
        graphs = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        thresholds = {g.name: threshold(model, g) for g in model.graphs}
        out, log = (
            artifacts.diagnosis(model, chip),
            artifacts.diagnosis(model, chip)[: -len(".json")] + ".log",
        )
        kwargs = {
            "module_file": model.module_file,
            "graphs": graphs,
            "data_dir": model.data_dir,
            "clips": list(model.verify.clips),
            "io": {g.name: io_record(g) for g in model.graphs},
            "pieces": cut,
            "thresholds": thresholds,
            "out": out,
            "spec": model.spec_file,
        }
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} on {chip.name}: the first op whose simulator output departs from "
                   "the CPU",
            "file_dep": [
                *model.code_files,
                *graphs.values(),
                *project.data_files(model),
                *compiler.tool_files(chip),
            ],
            "targets": [out, log],
            "clean": True,
            "actions": [(run, (locate, kwargs, log)), (in_process, (summary, out))],
            "uptodate": [
                config_changed(
                    {
                        "thresholds": thresholds,
                        "clips": list(model.verify.clips),
                        **compiler.verify_settings(model, chip, "default"),
                    }
                )
            ],
        }


def pieces(model: Model, compiler: Compiler, chip: Chip) -> dict | None:
    """{graph: [factory, kwargs]} compiling a cut of each graph (compiler.piece_runner), or None
    when the compiler cannot for some graph."""
    found = {g.name: compiler.piece_runner(model, g, chip) for g in model.graphs}
    return {g: list(p) for g, p in found.items() if p} if all(found.values()) else None


def threshold(model: Model, graph: Graph) -> dict:
    """The verify stage's limits for one graph."""
    return {
        "max_rel": graph.precision.max_rel(model.verify),
        "min_cosine": model.verify.min_cosine,
    }


# a failed verify bisects graphs up to this many cut points itself (~log2(N)+1 small compiles)
AUTO_OPS = 300


def after_failure(graphs: dict, failing: list, pieces: dict, thresholds: dict) -> list[str]:
    """For a failed verify: each failing output of a graph small enough, bisected on the spot along
    that output's own ops, on the feeds of the call that failed (its finding joins the failure
    message); a larger graph is left to `doit diagnose:` (the message names it). `failing`:
    [(graph, output, feeds)]."""
    import onnx
    found, done = [], set()
    with tempfile.TemporaryDirectory(prefix="diagnose-") as scratch:
        for name, output, feeds in failing:
            if (name, output) in done:
                continue
            done.add((name, output))
            model = onnx.load(graphs[name])
            if len(cut_points(model, output)) > AUTO_OPS:
                continue
            factory, kwargs = pieces[name]
            try:
                result = bisect(
                    model,
                    feeds,
                    lambda piece: factory(piece=piece, **kwargs),
                    thresholds[name],
                    os.path.join(scratch, f"{name}-{len(done)}"),
                    output,
                )
            # the verify failure stays the message; the bisection is a bonus
            except Exception as err:
                found.append(
                    f"{name}/{output}: not bisected ({type(err).__name__}: {str(err)[:200]})"
                )
                continue
            found.append(f"{name}/{output}: {_line(result)}")
    return found


def locate(
    module_file: str,
    graphs: dict,
    data_dir: str | None,
    clips: list,
    io: dict,
    pieces: dict,
    thresholds: dict,
    out: str,
    spec: str = "",
) -> None:
    import onnx
    module = load_module(module_file)
    cpu = {name: modeldata.cpu(path) for name, path in graphs.items()}
    samples = modeldata.samples(module, data_dir, clips, f"{spec}: verify.clips")
    feeds = modeldata.feeds(module, lambda g, f: cpu[g](f), samples[0] if samples else None, io)
    record = {}
    with tempfile.TemporaryDirectory(prefix="diagnose-") as scratch:
        for name, path in graphs.items():
            factory, kwargs = pieces[name]
            onnx_model = onnx.load(path)
            record[name] = bisect(
                onnx_model,
                feeds[name][0],
                lambda piece: factory(piece=piece, **kwargs),
                thresholds[name],
                os.path.join(scratch, name),
            )
            print(f"{name}: {_line(record[name])}", flush=True)
    write_json(out, measures.finite(record))


def bisect(
    onnx_model: Any,
    feeds: dict,
    compile_piece: Piece,
    limits: dict,
    scratch: str,
    output: str | None = None,
) -> dict:
    """The first op whose output is beyond `limits` on the compiled piece, following the data: a
    bisection over the ops the bad tensor is computed from (graph order is no chain: another
    branch's ops sit between), then the bad op's own feeders asked; a bad feeder moves the search up
    its ancestors, until an op whose feeders are all within. That op is then run alone on the CPU's
    values of its inputs (confirmed, or said to need neighbours). With `output`, among the ops that
    output depends on only (the failing output, not another)."""
    import onnx
    started = time.monotonic()
    points = cut_points(onnx_model, output)
    if not points:
        raise StageFailed("no float tensor produced by an op to cut the graph at")
    checked = {}

    def bad(i: int) -> bool | None:
        if i not in checked:
            checked[i] = measure(
                onnx_model, points[i], feeds, compile_piece, f"{scratch}/{i}", onnx
            )
        result = checked[i]
        if "error" in result:
            return None
        return result["max_rel"] > limits["max_rel"] or result["cosine"] < (
            limits.get("min_cosine") or -1
        )

    last = len(points) - 1
    whole = bad(last)
    found = {"limits": limits, "ops": len(points), "compiles": 0}
    if whole is False:
        found.update(
            first_divergent=None, verdict="every output is within the limits on this input"
        )
    else:
        lo, hi = _follow(onnx_model, points, bad, last)
        found["first_divergent"] = {**points[hi], **checked[hi]}
        found["last_within"] = {**points[lo], **checked[lo]} if lo >= 0 else None
        found["verdict"] = (
            f"op {points[hi]['op']} ({points[hi]['op_type']}) is the first whose output "
            f"{points[hi]['tensor']} departs from the CPU"
        )
        found["alone"] = alone(
            onnx_model, points[hi], feeds, compile_piece, f"{scratch}/alone", onnx
        )
    found["compiles"] = len(checked) + (1 if "alone" in found else 0)
    found["checked"] = [{**points[i], **checked[i]} for i in sorted(checked)]
    found["seconds"] = round(time.monotonic() - started, 1)
    return found


def _follow(
    onnx_model: Any, points: list[dict], bad: Callable[[int], bool | None], hi: int
) -> tuple[int, int]:
    """(last within, first bad) point indices: bisect the bad point's ancestors; while the op
    found has a bad feeder, start again from that feeder (each round searches a strictly smaller
    set of ancestors)."""
    at = {p["index"]: i for i, p in enumerate(points)}
    while True:
        above = _ancestors(onnx_model, points[hi]["tensor"])
        lo, hi = _transition([i for i in range(hi) if points[i]["index"] in above] + [hi], bad)
        node = onnx_model.graph.node[points[hi]["index"]]
        feeders = sorted({at[j] for j in _producers(onnx_model, node) if j in at})
        worse = next((f for f in feeders if bad(f)), None)
        if worse is None:
            return lo, hi
        hi = worse


def _transition(order: list[int], bad: Callable[[int], bool | None]) -> tuple[int, int]:
    """Bisect `order` (point indices, the last one known bad) for a good point followed by
    a bad one."""
    # positions: lo last known good (-1: the inputs), hi first known bad
    lo, hi = -1, len(order) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        verdict, probe = bad(order[mid]), mid
        while verdict is None and probe + 1 < hi:   # a piece that does not compile: try the next op
            probe += 1
            verdict = bad(order[probe])
        if verdict is None:
            break
        lo, hi = (probe, hi) if not verdict else (lo, probe)
    return (order[lo] if lo >= 0 else -1), order[hi]


def alone(
    onnx_model: Any, point: dict, feeds: dict, compile_piece: Piece, folder: str, onnx: ModuleType
) -> dict:
    """The op of `point` as a graph of its own, fed the CPU's values of its inputs: its error
    on the compiler against the CPU (the fault is the op's own), or {"error"} when the lone op
    does not compile."""
    os.makedirs(folder, exist_ok=True)
    node = onnx_model.graph.node[point["index"]]
    constants = {t.name: t for t in onnx_model.graph.initializer}
    wanted = [i for i in dict.fromkeys(node.input) if i and i not in constants]
    infos = {v.name: v for v in onnx.shape_inference.infer_shapes(onnx_model).graph.value_info}
    infos.update({v.name: v for v in [*onnx_model.graph.input, *onnx_model.graph.output]})
    untyped = [i for i in [*wanted, point["tensor"]] if i not in infos]
    if untyped:
        return {"error": f"no type inferred for {', '.join(untyped)}"}
    probe = onnx.ModelProto()
    probe.CopyFrom(onnx_model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(infos[i] for i in wanted if i not in known and i not in feeds)
    onnx.save(probe, f"{folder}/inputs.onnx")
    inputs = {i.name: feeds[i.name] for i in onnx_model.graph.input if i.name in feeds}
    values = {**modeldata.cpu(f"{folder}/inputs.onnx")(inputs), **inputs}
    graph = onnx.helper.make_graph(
        [node],
        "alone",
        [infos[i] for i in wanted],
        [infos[point["tensor"]]],
        initializer=[constants[i] for i in node.input if i in constants],
    )
    piece = f"{folder}/alone.onnx"
    onnx.save(
        onnx.helper.make_model(
            graph, opset_imports=onnx_model.opset_import, ir_version=onnx_model.ir_version
        ),
        piece,
    )
    fed = {i: values[i] for i in wanted}
    want = modeldata.cpu(piece)(fed)[point["tensor"]]
    try:
        got = compile_piece(piece)(fed)[point["tensor"]]
    except Exception as err:   # a lone op the compiler refuses: said, never the finding's failure
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    errors = measures.element_errors(want, got)
    return _rounded(errors)


def cut_points(onnx_model: Any, output: str | None = None) -> list[dict]:
    """Each op's first float output that depends on a graph input, in graph (topological)
    order; with `output`, only the ops that output is computed from (ending with the op
    that produces it)."""
    import onnx
    needed = _ancestors(onnx_model, output) if output else None
    inferred = onnx.shape_inference.infer_shapes(onnx_model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    live = {i.name for i in onnx_model.graph.input} - {t.name for t in onnx_model.graph.initializer}
    points = []
    for index, node in enumerate(onnx_model.graph.node):
        if not any(i in live for i in node.input):
            continue   # computed from constants only (folded by onnxsim; nothing to compare)
        live.update(o for o in node.output if o)
        if needed is not None and index not in needed:
            continue
        tensor = (output if output in node.output
                  else next((o for o in node.output if o and types.get(o) in FLOATS), None))
        if tensor:
            points.append(
                {
                    "index": index,
                    "op": node.name or f"#{index}",
                    "op_type": node.op_type,
                    "tensor": tensor,
                }
            )
    return points


def measure(
    onnx_model: Any, point: dict, feeds: dict, compile_piece: Piece, folder: str, onnx: ModuleType
) -> dict:
    """The piece ending at `point`: compiled and run, against the CPU on the same feeds."""
    os.makedirs(folder, exist_ok=True)
    needed = _inputs_of(onnx_model, point["tensor"])
    piece_path = f"{folder}/piece.onnx"
    piece = onnx.utils.Extractor(onnx_model).extract_model(needed, [point["tensor"]])
    onnx.save(piece, piece_path)
    inputs = {k: v for k, v in feeds.items() if k in needed}
    want = modeldata.cpu(piece_path)(inputs)[point["tensor"]]
    try:
        got = compile_piece(piece_path)(inputs)[point["tensor"]]
    except StageFailed as err:   # e.g. a cut that leaves a piece the compiler refuses
        return {"error": str(err)[:300]}
    errors = measures.element_errors(want, got)
    return _rounded(errors)


def _ancestors(onnx_model: Any, tensor: str) -> set[int]:
    """Indices of the nodes `tensor` is computed from (itself included)."""
    producer = {o: i for i, n in enumerate(onnx_model.graph.node) for o in n.output}
    seen, stack = set(), [tensor]
    while stack:
        name = stack.pop()
        if name in producer and producer[name] not in seen:
            seen.add(producer[name])
            stack.extend(i for i in onnx_model.graph.node[producer[name]].input if i)
    return seen


def _producers(onnx_model: Any, node: Any) -> set[int]:
    """Indices of the nodes whose outputs `node` reads."""
    producer = {o: i for i, n in enumerate(onnx_model.graph.node) for o in n.output}
    return {producer[i] for i in node.input if i in producer}


def _inputs_of(onnx_model: Any, tensor: str) -> list[str]:
    """The graph inputs `tensor` depends on."""
    producer = {o: n for n in onnx_model.graph.node for o in n.output}
    graph_inputs = {i.name for i in onnx_model.graph.input} - {
        t.name for t in onnx_model.graph.initializer
    }
    seen, stack, found = set(), [tensor], []
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in graph_inputs:
            found.append(name)
        elif name in producer:
            stack.extend(i for i in producer[name].input if i)
    return [i.name for i in onnx_model.graph.input if i.name in found]


def _rounded(errors: measures.TensorErrors) -> dict[str, float]:
    return {
        k: (round(v, 6) if math.isfinite(v) else v)
        for k, v in cast(dict[str, float], errors).items()
    }


def _line(found: dict) -> str:
    first = found.get("first_divergent")
    if not first:
        return found["verdict"]
    tail = ("" if "max_rel" not in first
            else f": max error {first['max_rel']:.3g} of the range, cosine {first['cosine']:.5f}")
    within = found.get("last_within")
    before = f"; the op before it, {within['op']} ({within['op_type']}), is within" if within else \
        "; it is the first op on the input"
    # diagnose cuts fp16 graphs only (pieces()): a limit below fp16's step is said before any
    # op is named
    tight = measures.beyond_precision({"max_rel": found["limits"]["max_rel"]}, "fp16")
    return (
        f"{tight + '; then: ' if tight else ''}{found['verdict']}{tail} (limit "
        f"{found['limits']['max_rel']})"
        f"{before}{_alone(found, bool(tight))} [{found['compiles']} compiles]"
    )


def _alone(found: dict, tight: bool = False) -> str:
    """What the op did on its own, fed the CPU's values of its inputs (`tight`: the limit is below
    fp16's step, so an op off alone is fp16's rounding, not the op's fault)."""
    lone = found.get("alone")
    if not lone:
        return ""
    if "error" in lone:
        return f"; alone it does not compile ({lone['error'][:120]})"
    wrong = float(lone["max_rel"]) > found["limits"]["max_rel"] or \
        float(lone["cosine"]) < (found["limits"].get("min_cosine") or -1)
    if wrong and tight:
        return (
            "; alone, fed the CPU's inputs, it is off too (max error "
            f"{float(lone['max_rel']):.3g}): fp16's own "
            "rounding, which the limit does not allow for"
        )
    return (
        f"; alone, fed the CPU's inputs, it is wrong too (max error {float(lone['max_rel']):.3g}): "
        "the op's own "
        "fault"
        if wrong
        else "; alone, fed the CPU's inputs, it is within: the fault needs its neighbours"
    )


def summary(out: str) -> None:
    """Print each graph's finding in doit's output (the step's own output is in its log)."""
    for graph, found in read_json(out).items():
        first = found.get("first_divergent")
        if first and isinstance(first.get("max_rel"), str):   # inf/NaN were stored as strings
            first = {**first, "max_rel": float(first["max_rel"]), "cosine": float(first["cosine"])}
        print(f"{graph}: {_line({**found, 'first_divergent': first})}")
