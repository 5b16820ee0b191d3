"""A graph's per-output checks, its state pairs and its stream geometry, read from [graphs.<g>].

  checks.<output> = { max_abs = 0.05 }                       absolute tolerance (a probability)
  checks.<output> = { max_rel = 0.02, min_cosine = 0.999 }   relative to the output's range, and/or
  direction checks.<output> = { judged_by = "metric", reason = "..." } no tensor bound: the task
  metric decides state = { new_state = "state" }                            output -> the input it
  feeds on the next call
  stream = { input = "x", axis = 1, chunk = 512, hop = 512, context = 64 }
  stream = { from = "g1", step = "to_time", input = "y", ... }   the stream is the model
  code's host step
                                                               to_time(calls of g1, sample)
                                                               on g1's outputs

An output without checks keeps the model's [verify] bounds (nothing about it changes)."""
from __future__ import annotations

from toolchain.spec.records import Tensor
from toolchain.spec.table import Table

CHECK_BOUNDS = ("max_abs", "max_rel", "min_cosine")
JUDGES = ("metric",)


def checks(t: Table, outputs: tuple[Tensor, ...]) -> dict:
    """{output: {bound: value} or {"judged_by": "metric", "reason": ...}} for the
    outputs given checks."""
    names = [o.name for o in outputs]
    found = {}
    for name in t.data:
        if name not in names:
            t.fail(name, f"no output {name!r} in this graph (outputs: {', '.join(names)})")
        c = t.sub(name)
        c.used.update((*CHECK_BOUNDS, "judged_by", "reason"))
        c.done()   # a typo first: "did you mean"
        c.used.clear()
        if "judged_by" in c.data:
            judge = c.req("judged_by", str, JUDGES)
            reason = c.req("reason", str)
            if not reason.strip():
                c.fail("reason", "say why the tensor is not checked (it goes into the manifest)")
            bounds = [k for k in CHECK_BOUNDS if k in c.data]
            if bounds:
                c.fail(
                    bounds[0],
                    f'judged_by = "{judge}" and a bound exclude each other: the output is '
                    f"either checked as a tensor or by the metric",
                )
            found[name] = {"judged_by": judge, "reason": reason}
        else:
            entry = {}
            for key in CHECK_BOUNDS:
                if key in c.data:
                    entry[key] = c.number(key, 0.0)
            if not entry:
                c.fail(
                    "",
                    "give max_abs, max_rel and/or min_cosine, "
                    'or judged_by = "metric" with a reason',
                )
            if entry.get("min_cosine", 0) > 1:
                c.fail("min_cosine", f"a cosine similarity is at most 1, got {entry['min_cosine']}")
            found[name] = entry
        c.done()
    t.used.update(t.data)
    return found


def state(t: Table, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]) -> dict:
    """{output: input}: each pair the same shape and dtype, each input fed by one output."""
    ins, outs = {i.name: i for i in inputs}, {o.name: o for o in outputs}
    pairs: dict[str, str] = {}
    for out, fed in t.data.items():
        if out not in outs:
            t.fail(out, f"no output {out!r} in this graph (outputs: {', '.join(outs)})")
        if not isinstance(fed, str) or fed not in ins:
            t.fail(
                out,
                f"expected the name of the input it feeds, one of {', '.join(ins)}; got {fed!r}",
            )
        if fed in pairs.values():
            t.fail(out, f"input {fed!r} is fed by two outputs")
        a, b = outs[out], ins[fed]
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            t.fail(
                out,
                f"output {out} {list(a.shape)} {a.dtype} cannot feed input {fed} {list(b.shape)} "
                f"{b.dtype}: "
                f"a state pair has one shape and dtype",
            )
        pairs[out] = fed
    t.used.update(t.data)
    return pairs


def stream(t: Table, inputs: tuple[Tensor, ...], pairs: dict) -> dict:
    """How a stream is cut into calls: call i reads [i*hop - context, i*hop + chunk) along `axis` of
    the stream input (zeros outside the stream); every other input is a state."""
    ins = {i.name: i for i in inputs}
    name = t.req("input", str)
    if name not in ins:
        t.fail("input", f"no input {name!r} in this graph (inputs: {', '.join(ins)})")
    if name in pairs.values():
        t.fail(
            "input", f"{name!r} is a state input (fed by an output); the stream input is the data"
        )
    shape = ins[name].shape
    axis = t.req("axis", int)
    if not 0 <= axis < len(shape):
        t.fail("axis", f"{axis} is out of range for {name} {list(shape)}")
    geometry = {"input": name, "axis": axis}
    for key, minimum in (("chunk", 1), ("hop", 1), ("context", 0)):
        value = t.opt(key, int, 0 if key == "context" else None)
        if value is None:
            t.fail(key, "missing required field")
        if isinstance(value, bool) or value < minimum:
            t.fail(key, f"expected an integer >= {minimum}, got {value!r}")
        geometry[key] = value
    if geometry["context"] + geometry["chunk"] != shape[axis]:
        t.fail(
            "chunk",
            f"context {geometry['context']} + chunk {geometry['chunk']} must be the size of "
            f"{name} on axis {axis} ({shape[axis]})",
        )
    # another graph's outputs, through a host step (checked across graphs
    if "from" in t.data or "step" in t.data:
        upstream, step = t.req("from", str), t.req("step", str)   # by spec/__init__.py)
        if not step.isidentifier():
            t.fail("step", f"{step!r}: the name of a function in the model's module")
        geometry.update({"from": upstream, "step": step})
    others = [i for i in ins if i != name and i not in pairs.values()]
    if others:
        t.fail(
            "input",
            f"input(s) {', '.join(others)} are neither the stream nor fed by a state output: "
            f'declare them in state = {{ <output> = "<input>" }}',
        )
    t.done()
    return geometry


