"""The chunk loop of a stateful graph, run by the build itself (spec: graphs.<g>.state and .stream);
a graph whose stream a host step makes from another graph's outputs (stream.from, stream.step) runs
after it, on each backend's own run of it.

Each backend runs the whole stream feeding back its OWN state outputs, as an app does; the
drift is the per-chunk error of every output between two such runs. fp16 recurrent models fail
by accumulating error over hundreds of chunks, which a per-call check with the reference's
states never sees."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)
if TYPE_CHECKING:
    import numpy as np

INITIAL = "zeros"   # every state input starts as zeros (silero, icefall and sherpa-onnx all do)


def graphs(io: dict, streams: dict) -> list[str]:
    """The graphs that declare a stream, in declaration order."""
    return [g for g in io if streams.get(g)]


def contract(graph) -> dict:
    """What an app needs to drive the graph: which output to feed back where, the initial
    value, the cut."""
    if not graph.stream:
        return {}
    made = (
        f" of the stream the model code's host step {graph.stream['step']}() makes from graph "
        f"{graph.stream['from']}'s outputs of every call (run {graph.stream['from']}'s stream "
        "first, on the same "
        f"backend)"
        if "from" in graph.stream
        else ""
    )
    return {
        "state": dict(graph.state),
        "initial": INITIAL,
        "stream": dict(graph.stream),
        "calls": "call i reads "
                 f"{graph.stream['input']}[{_axis(graph.stream)}i*{graph.stream['hop']} - "
        f"{graph.stream['context']} : i*{graph.stream['hop']} + {graph.stream['chunk']}]{made} "
        "(zeros "
        f"outside the stream)",
    }


def _axis(geometry: dict) -> str:
    return ":, " * geometry["axis"]


def cut(data: np.ndarray, geometry: dict, shape: tuple, dtype: str, where: str) -> list[np.ndarray]:
    """The stream input of every call: [i*hop - context, i*hop + chunk) along
    the axis, zero-padded."""
    import numpy as np
    axis, chunk, hop, context = (geometry[k] for k in ("axis", "chunk", "hop", "context"))
    data = np.asarray(data)
    if data.ndim != len(shape) or any(data.shape[a] != d for a, d in enumerate(shape) if a != axis):
        raise StageFailed(
            f"{where}: stream() returned {data.dtype}{list(data.shape)}; expected the shape of "
            f"{geometry['input']} {list(shape)} with any length on axis {axis}"
        )
    length = data.shape[axis]
    calls = max(1, math.ceil((length - chunk) / hop) + 1)
    pad = [(0, 0)] * data.ndim
    pad[axis] = (context, max(0, (calls - 1) * hop + chunk - length))
    padded = np.pad(data.astype(dtype, copy=False), pad)
    index = [slice(None)] * data.ndim
    pieces = []
    for i in range(calls):
        index[axis] = slice(i * hop, i * hop + context + chunk)
        pieces.append(np.ascontiguousarray(padded[tuple(index)]))
    return pieces


def loop(
    run, graph: str, pieces: list, geometry: dict, pairs: dict, inputs: list
) -> list[tuple[dict, dict]]:
    """(feeds, outputs) of every call, `run` feeding back its own state outputs."""
    import numpy as np
    shapes = {name: (shape, dtype) for name, shape, dtype in inputs}
    state = {fed: np.zeros(*shapes[fed]) for fed in pairs.values()}
    calls = []
    for piece in pieces:
        feeds = {geometry["input"]: piece, **state}
        out = run(graph, feeds)
        calls.append((feeds, out))
        state = {
            fed: np.asarray(out[output]).astype(shapes[fed][1], copy=False)
            for output, fed in pairs.items()
        }
    return calls


def drift(reference: list, candidate: list, checks: dict) -> dict:
    """Per output over the stream: max / p99 abs error, max error of the range, the chunk where the
    check is most exceeded (or the error peaks), the per-chunk max abs error, and whether the
    output's check holds."""
    import numpy as np
    found = {}
    for name in reference[0][1]:
        per_chunk = [measures.element_errors(np.asarray(r[1][name]), np.asarray(c[1][name]))
                     for r, c in zip(reference, candidate)]
        diffs = np.concatenate(
            [
                np.abs(
                    np.asarray(r[1][name], np.float64) - np.asarray(c[1][name], np.float64)
                ).ravel()
                for r, c in zip(reference, candidate)
            ]
        )
        check = checks[name]
        ratios = [measures.excess(e, check) for e in per_chunk]
        abs_per_chunk = [e["max_abs"] for e in per_chunk]
        peak = int(np.argmax(ratios)) if "judged_by" not in check else int(np.argmax(abs_per_chunk))
        found[name] = {"max_abs": max(abs_per_chunk), "p99_abs": float(np.percentile(diffs, 99)),
                       "max_rel": max(e["max_rel"] for e in per_chunk),
                       "min_cosine": min(e["cosine"] for e in per_chunk),
                       "peak_chunk": peak, "peak": per_chunk[peak], "check": dict(check),
                       "passed": None if "judged_by" in check else bool(max(ratios) <= 1.0),
                       "per_chunk_max_abs": [float(f"{v:.4g}") for v in abs_per_chunk]}
    return found


def pieces(
    module, sample, geometry: dict, io: dict, where: str, upstream: list | None = None
) -> list[np.ndarray]:
    """The stream input of every call for one sample, cut: the model code's stream(sample), or for a
    graph whose stream is made from another graph's (`from`), its host step on `upstream`, that
    graph's [(feeds, outputs)] of every call as the same backend ran them."""
    name = geometry.get("step", "stream")
    if not callable(getattr(module, name, None)):
        what = (
            f"{name}(calls, sample) function, which makes this graph's stream from graph "
            f"{geometry['from']}'s "
            f"calls"
            if "from" in geometry
            else "stream(sample) function: a graph declaring `stream` needs the "
            "model code to return each sample's whole input stream (the build cuts it into calls)"
        )
        raise StageFailed(f"{where}: no {what}")
    _, shape, dtype = next(t for t in io["inputs"] if t[0] == geometry["input"])
    if "from" in geometry:
        return cut(getattr(module, name)(upstream, sample), geometry, tuple(shape), dtype,
                   f"{where}: {name}(calls of {geometry['from']}, {sample[0]!r})")
    return cut(
        module.stream(sample), geometry, tuple(shape), dtype, f"{where}: stream({sample[0]!r})"
    )


def compare_runs(module, samples: list, streams: dict, io: dict, reference, candidate, checks: dict,
                 sources: dict, where: str) -> tuple[dict, list[str], list, dict]:
    """Every stream graph over every sample, run by `reference` and by `candidate` each feeding back
    its own state: ({graph: {clip: drift}}, failure lines, [(graph, output, feeds of the worst
    call)], {"reference"|"candidate": {clip: {graph: calls}}})."""
    record: dict = {}
    failures: list[str] = []
    failing: list = []
    calls: dict[str, dict] = {"reference": {}, "candidate": {}}
    # declaration order: a graph fed by another's stream comes after it
    for g, declared in streams.items():
        record[g] = {}
        geometry, upstream = declared["geometry"], declared["geometry"].get("from")
        for sample in samples:
            ran = {}
            for side, run in (("reference", reference), ("candidate", candidate)):
                # this backend's own upstream run
                made = calls[side][sample[0]][upstream] if upstream else None
                if side == "reference" or upstream:
                    cut_calls = pieces(module, sample, geometry, io[g], where, made)
                ran[side] = loop(run, g, cut_calls, geometry, declared["state"], io[g]["inputs"])
                calls[side].setdefault(sample[0], {})[g] = ran[side]
            ref, got = ran["reference"], ran["candidate"]
            if len(ref) != len(got):
                raise StageFailed(
                    f"{where}: {geometry['step']}() made streams of {len(ref)} and {len(got)} "
                    "calls "
                    f"of graph {g} from the two backends' runs of {upstream}: the same length "
                    "expected"
                )
            found = drift(ref, got, checks[g])
            record[g][sample[0]] = {"calls": len(ref), "outputs": found}
            for o, d in found.items():
                if d["passed"] is False:
                    p = d["peak"]
                    failures.append(
                        f"{g}/{o}: free-running stream of clip {sample[0]}, chunk "
                        f"{d['peak_chunk']} of "
                        f"{len(ref)} (each backend feeding back its own state): max |error| "
                        f"{p['max_abs']:.3g}, {p['max_rel']:.3g} of the range, cosine "
                        f"{p['cosine']:.5f} "
                        f"({measures.RANGE}: {p['range']:.3g}); allowed "
                        f"{measures.allowed(d['check'], sources[g][o])}"
                    )
                    failing.append((g, o, ref[d["peak_chunk"]][0]))
    return record, failures, failing, calls


def evaluate(module, run, sample, calls: dict, io: dict):
    """The model code's metric on one backend's loop: evaluate_stream(run, sample, calls),
    `calls` the [(feeds, outputs)] of the stream graph (a {graph: calls} dict when several
    graphs stream); `run` drives the model's other graphs (a transducer's decoder and joiner) on
    the same backend."""
    given = next(iter(calls.values())) if len(calls) == 1 else calls
    return modeldata.with_io(module.evaluate_stream, io)(run, sample, given)


def task_runs(
    module, samples: list, streams: dict, runs: dict, io: dict, reference, candidate
) -> tuple:
    """(reference, candidate) results of the model's metric: evaluate_stream on the build's own loop
    (`runs` from compare_runs) for a streaming model, else the model code's evaluate(run, samples)
    over its own runs; (None, None) without samples or either function."""
    if samples and streams and hasattr(module, "evaluate_stream"):
        return tuple({s[0]: evaluate(module, run, s, runs[side][s[0]], io) for s in samples}
                     for side, run in (("reference", reference), ("candidate", candidate)))
    if samples and hasattr(module, "evaluate"):
        evaluate_all = modeldata.with_io(module.evaluate, io)
        return evaluate_all(reference, samples), evaluate_all(candidate, samples)
    return None, None


def feeds_origin(module, sample, io: dict, streams: dict) -> dict[str, str]:
    """Which inputs tensor_feeds() gives each graph, in words for a record and a failure message."""
    if hasattr(module, "graph_feeds"):
        said = f"clip {sample[0]} (graph_feeds())" if sample else "graph_feeds() without a sample"
        return {g: said for g in io}
    return {
        g: f"clip {sample[0]} (calls of its stream)"
        if sample and g in streams
        else "generated inputs"
        for g in io
    }


def tensor_feeds(module, run, sample, io: dict, streams: dict, where: str, count: int = 6) -> dict:
    """Feeds of the per-call tensor check: the model code's graph_feeds(); else, for a stream
    graph, `count` calls spread over the sample's CPU loop (states as that loop fed them),
    the rest generated."""
    feeds = modeldata.feeds(module, run, sample, io)
    if hasattr(module, "graph_feeds") or sample is None:
        return feeds
    ran: dict = {}
    for g, declared in streams.items():
        upstream = ran.get(declared["geometry"].get("from"))
        done = ran[g] = loop(
            run,
            g,
            pieces(module, sample, declared["geometry"], io[g], where, upstream),
            declared["geometry"],
            declared["state"],
            io[g]["inputs"],
        )
        picks = sorted(
            {round(i * (len(done) - 1) / max(count - 1, 1)) for i in range(min(count, len(done)))}
        )
        feeds[g] = [done[i][0] for i in picks]
    return feeds
