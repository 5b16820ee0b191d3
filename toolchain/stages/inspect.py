"""Hard check of a simplified ONNX against the spec: static shapes, batch 1, int32, declared names,
and no op the HTP is measured to compute wrong (toolchain/rewrites/known_wrong.toml: the check every
convert and compile waits for)."""
from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import write_json
from toolchain.engine.run.worker import in_process
from toolchain.errors import StageFailed
from toolchain.rewrites import known_wrong
from toolchain.shared.iorecord import io_record
from toolchain.stages import Project, named

if TYPE_CHECKING:   # annotations only: onnx is imported where used
    import onnx

DTYPES = {
    1: "float32",
    10: "float16",
    6: "int32",
    7: "int64",
    3: "int8",
    2: "uint8",
    9: "bool",
    11: "float64",
}
INT8 = {2, 3}   # quantize in QNN, never in the ONNX (the guide)


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models:
        for graph in model.graphs:
            src, out = artifacts.simplified(model, graph), artifacts.inspected(model, graph)
            declared = io_record(graph)
            declared["batch_axes"] = {t.name: t.batch_axis for t in graph.inputs + graph.outputs}
            declared["precision"] = graph.precision
            declared["max_fp16_params"] = model.compile["max_fp16_params"]
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: assert static shapes, batch 1, int32 I/O, "
                       "declared names, "
                f"no op the HTP is known to compute wrong",
                "file_dep": [src, str(known_wrong.TABLE)],
                "targets": [out],
                "clean": True,
                "actions": [(in_process, (check, src, declared, model.spec_file, out, graph.name))],
                "uptodate": [config_changed(declared)],
            }


def _which_side(kind: str, name: str, dims: list, shape: list, graph: str) -> str:
    """Which side of a shape mismatch to change: an output's shape follows from the inputs (the spec
    is wrong); an input's is the interface the app feeds (the export is, unless the app feeds what
    the ONNX takes)."""
    field = f"graphs.{graph}.{kind}s.{name}" if graph else f"{kind}s.{name}"
    if kind == "output":
        return (
            f"an output's shape follows from the inputs, so declare {field} shape = {dims} (or "
            "change the "
            f"graph, if it must make {shape})"
        )
    return (
        "the spec is what the app feeds, so make export() build the graph with an input of "
        f"{shape} (its "
        f"example input's shape), or, if the app feeds {dims}, declare {field} shape = {dims}"
    )


def problems(model: onnx.ModelProto, declared: dict, spec_file: str, graph: str = "") -> list[str]:
    """Every way the ONNX graph breaks the NPU rules or the spec; empty when it is fine."""
    found = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        want = declared[kind + "s"]
        got_names = [v.name for v in values]
        if got_names != [w[0] for w in want]:
            found.append(
                f"{kind}s are {got_names}, {spec_file} declares {[w[0] for w in want]} (same order)"
            )
        want_by_name = {w[0]: w for w in want}
        for v in values:
            t = v.type.tensor_type
            dims = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in t.shape.dim
            ]
            dtype = DTYPES.get(t.elem_type, f"onnx type {t.elem_type}")
            if any(not isinstance(d, int) or d <= 0 for d in dims):
                found.append(f"{kind} '{v.name}': shape {dims} is dynamic; export with fixed sizes")
            if dtype == "int64":
                found.append(
                    f"{kind} '{v.name}': int64; the HTP runtimes take int32 (export int32 inputs)"
                )
            if v.name not in want_by_name:
                continue
            _, shape, want_dtype = want_by_name[v.name]
            if dims != shape:
                found.append(
                    f"{kind} '{v.name}': shape {dims} in the ONNX, {spec_file} declares {shape}: "
                    + _which_side(kind, v.name, dims, shape, graph)
                )
            if dtype != want_dtype:
                found.append(f"{kind} '{v.name}': dtype {dtype}, {spec_file} declares {want_dtype}")
            axis = declared["batch_axes"].get(v.name)
            if axis is not None and axis < len(dims) and dims[axis] != 1:
                found.append(f"{kind} '{v.name}': batch (axis {axis}) is {dims[axis]}, must be 1")
    for init in model.graph.initializer:
        if init.data_type in INT8:
            found.append(
                f"initializer '{init.name}' is {DTYPES[init.data_type]}: no int8 in the ONNX "
                f"(quantize in QNN, not in the export)"
            )
            break
    return found


def check(src: str, declared: dict, spec_file: str, out: str, graph: str = "") -> None:
    import onnx
    model = onnx.load(src, load_external_data=False)
    found = problems(model, declared, spec_file, graph)
    found += [
        known_wrong.message(node, row)
        for node, row in known_wrong.found(model, declared["precision"])
    ]
    if found:
        raise StageFailed(f"{src}: " + "; ".join(found))
    params = sum(int(_numel(i.dims)) for i in model.graph.initializer)
    limit = declared["max_fp16_params"]
    if declared["precision"] == "fp16" and params > limit:
        raise StageFailed(
            f"{src}: {params / 1e6:.1f} M parameters ({2 * params / 2**30:.2f} GiB in fp16) exceed "
            f"the per-context limit of {limit / 1e6:.1f} M ({spec_file}: compile.max_fp16_params): "
            'declare the graph precision = "w8a16" (8-bit weights), or split it into several '
            'graphs'
        )
    write_json(
        out,
        {
            "ops": dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items())),
            "nodes": len(model.graph.node),
            "parameters": params,
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "io": {k: declared[k] for k in ("inputs", "outputs")},
        },
    )


def _numel(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
