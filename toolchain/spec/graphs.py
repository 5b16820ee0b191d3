"""[graphs.<g>]: one graph's tensors (static shapes, batch 1), precision, compiler
options and checks."""
from __future__ import annotations

import math
from pathlib import Path

from toolchain.spec import sources, streams
from toolchain.spec.records import (
    DTYPE_BYTES,
    IO_DTYPES,
    MAX_TENSOR_BYTES,
    NAME,
    OPTION_VALUES,
    PRECISIONS,
    Graph,
    Precision,
    Tensor,
)
from toolchain.spec.table import Settings, Table


def graph(t: Table, name: str, here: Path) -> Graph:
    if not NAME.match(name):
        t.fail("", f"graph name must match {NAME.pattern}")
    precision = Precision(t.opt("precision", str, "fp16", PRECISIONS))
    calibration = t.opt("calibration", int, 0)
    if precision.quantized and calibration < 1:
        t.fail("calibration", "a w8a16 graph needs calibration = <number of real samples> (e.g. 8)")
    if not precision.quantized and "calibration" in t.data:
        t.fail("calibration", f"only w8a16 graphs are calibrated; this graph is {precision}")
    source = sources.source(t.sub("source"), here) if "source" in t.data else None
    # the rule names are checked by project.py (rewrites/library.py)
    rewrite = t.opt("rewrite", (str, list), ())
    compile_options = options(t.sub("compile", required=False))
    inputs = tensors(t.sub("inputs"))
    outputs = tensors(t.sub("outputs"))
    output_checks = streams.checks(t.sub("checks", required=False), outputs)
    pairs = streams.state(t.sub("state", required=False), inputs, outputs)
    geometry = streams.stream(t.sub("stream"), inputs, pairs) if "stream" in t.data else {}
    if pairs and not geometry:
        t.fail("state", "a graph with state pairs declares how a stream is cut into calls: "
                        "stream = { input = \"x\", axis = 1, chunk = 512, hop = 512, context = 0 }")
    t.done()
    return Graph(
        name=name,
        precision=precision,
        calibration=calibration,
        inputs=inputs,
        outputs=outputs,
        source=source,
        compile=compile_options,
        checks=Settings({k: Settings(v) for k, v in output_checks.items()}),
        state=Settings(pairs),
        stream=Settings(geometry),
        rewrite=rewrite if isinstance(rewrite, str) else tuple(rewrite),
    )


def options(t: Table) -> Settings:
    """A graph's compiler options as declared: scalars, lists of scalars or tables of scalars (the
    compiler says which names it knows); read-only, so they can be settings of a task."""
    def plain(key, value, where):
        if isinstance(value, float) and not math.isfinite(value):
            t.fail(where, f"expected a finite number, got {value!r}")
        if isinstance(value, OPTION_VALUES):
            return value
        if isinstance(value, list) and all(isinstance(v, OPTION_VALUES) for v in value):
            return tuple(value)
        if isinstance(value, dict) and where == key:
            return Settings({k: plain(k, v, f"{key}.{k}") for k, v in value.items()})
        t.fail(where, f"expected a string, number, boolean, list or table of them, got {value!r}")
    t.used.update(t.data)
    return Settings({key: plain(key, value, key) for key, value in t.data.items()})


def tensors(t: Table) -> tuple[Tensor, ...]:
    tensors = []
    for name in t.data:
        tt = t.sub(name)
        shape = tt.req("shape", list)
        if not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
        ):
            tt.fail("shape", f"expected a list of positive integers (static shape), got {shape}")
        dtype = tt.req("dtype", str)
        if dtype == "int64":
            tt.fail(
                "dtype",
                "int64 is not allowed at graph I/O (the HTP runtimes take int32): export it as "
                "int32",
            )
        if dtype not in IO_DTYPES:
            tt.fail("dtype", f"expected one of {', '.join(IO_DTYPES)}, got {dtype!r}")
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        if size > MAX_TENSOR_BYTES:
            tt.fail(
                "shape",
                f"{shape} {dtype} is a tensor of {size / 2**30:.1f} GiB, over the "
                f"{MAX_TENSOR_BYTES >> 30} GiB one graph input or output can be: check the shape",
            )
        batch_axis = tt.opt("batch_axis", int, 0)
        batch_axis = None if batch_axis < 0 else batch_axis
        if batch_axis is not None:
            if batch_axis >= len(shape):
                tt.fail("batch_axis", f"{batch_axis} is out of range for shape {shape}")
            if shape[batch_axis] != 1:
                tt.fail("shape", f"batch (axis {batch_axis}) must be 1, got {shape[batch_axis]}; "
                                 f"set batch_axis = -1 if this tensor has no batch axis")
        tt.done()
        tensors.append(Tensor(name=name, shape=tuple(shape), dtype=dtype, batch_axis=batch_axis))
    t.used.update(t.data)
    if not tensors:
        t.fail("", "declare at least one tensor")
    return tuple(tensors)
