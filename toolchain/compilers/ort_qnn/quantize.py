"""Float ONNX + calibration set -> QDQ ONNX with 8-bit weights and 16-bit activations (w8a16),
once per graph, for the embedded toolchain (onnxruntime's QNN quantization helpers).

Graph I/O stays float32: with CPU fallback disabled the EP compiles the input Quantize and
output Dequantize into the HTP graph (docs/precision.md, w8a16), so callers feed floats as
for fp16 binaries.

Two rewrites keep the weights 8-bit in the binary (`place_weights`; measured on a 16000x384 table,
SM8750, docs/precision.md): the HTP keeps a MatMul constant in 8 bits only as its second input (a
constant first input, as in Whisper's tied `W_emb @ x^T`, is stored as 16 bits), and the quantizer
treats a Gather's table as an activation (16 bits) unless told it is a weight.

Weights are quantized per output channel: per tensor, all-MiniLM-L6-v2 reached a cosine of only
0.983 to its float embeddings (CPU emulation of the QDQ graph; 0.982 on the HTP simulator), per
channel 0.997 at the same size (measured on the default verification sentences)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep
from toolchain.engine import versions
from toolchain.engine.files import atomic_path
from toolchain.engine.run.worker import run
from toolchain.stages import Project, calibrate, named, parity

if TYPE_CHECKING:   # annotations only: onnx is imported where used
    import onnx

SETTINGS = {
    "activation_type": "QUInt16",
    "weight_type": "QUInt8",
    "per_channel": True,
    "io": "float32",
    "rewrites": ["matmul-constant-second", "gather-table-uint8"],
}


def tasks(project: Project) -> Iterator[dict]:
    tool = {"onnxruntime": versions.version("onnxruntime"), "onnx": versions.version("onnx")}
    for model in project.models_of(ep.NAME):
        for graph in model.graphs:
            if not graph.precision.quantized:
                continue
            src, out, folder = (
                artifacts.simplified(model, graph),
                artifacts.quantized(model, graph),
                artifacts.calibration(model, graph),
            )
            inputs = [[t.name, list(t.shape), t.dtype] for t in graph.inputs]
            raws = [
                artifacts.calibration_raw(model, graph, i, t.name)
                for i in range(graph.calibration)
                for t in graph.inputs
            ]
            log = artifacts.quantize_log(model, graph)
            kwargs = {"src": src, "folder": folder, "inputs": inputs, "out": out}
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: w8a16 QDQ ONNX (uint8 weights, uint16 "
                       "activations)",
                "file_dep": [src, artifacts.calibration_list(model, graph), *raws],
                "task_dep": parity.gate(model, graph),
                "targets": [out, log],
                "clean": True,
                "actions": [(run, (quantize, kwargs, log))],
                "uptodate": [config_changed({"settings": SETTINGS, "tool": tool})],
            }


def quantize(src: str, folder: str, inputs: list, out: str) -> None:
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantType
    from onnxruntime.quantization import quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(calibrate.read(folder, inputs))

        def get_next(self):
            return next(self.feeds, None)

    import onnx
    with tempfile.TemporaryDirectory() as scratch:
        # qnn_preprocess_model (onnxruntime 1.32) fails on models with metadata_props under onnx
        # 1.23 ("cannot convert dictionary update sequence"): quantize a copy without them.
        float_model = onnx.load(src)
        del float_model.metadata_props[:]
        tables = place_weights(float_model)
        plain, pre = f"{scratch}/float.onnx", f"{scratch}/pre.onnx"
        onnx.save(float_model, plain, save_as_external_data=float_model.ByteSize() > 2**31 - 2**26)
        model = pre if qnn_preprocess_model(plain, pre) else plain
        config = get_qnn_qdq_config(
            model,
            Reader(),
            activation_type=QuantType.QUInt16,
            weight_type=QuantType.QUInt8,
            per_channel=SETTINGS["per_channel"],
            init_overrides={t: [{"quant_type": QuantType.QUInt8}] for t in tables},
        )
        with atomic_path(out) as tmp:
            ort_quantize(model, str(tmp), config)


def place_weights(model: onnx.ModelProto) -> list[str]:
    """Rewrite `model` in place so every constant weight can be stored in 8 bits on the HTP;
    returns the Gather tables to quantize as uint8 weights. MatMul(W, X) with a constant 2-D W
    becomes Transpose(MatMul(Transpose(X), W^T)): the same product (float rounding aside), W^T
    a new constant."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    inits = {t.name: t for t in model.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*shape_inference.infer_shapes(model).graph.value_info, *model.graph.input]}
    nodes = []
    for node in model.graph.node:
        w, x = (list(node.input) + ["", ""])[:2]
        if (
            node.op_type != "MatMul"
            or w not in inits
            or x in inits
            or len(inits[w].dims) != 2
            or ranks.get(x, 0) < 2
        ):
            nodes.append(node)
            continue
        perm = [*range(ranks[x] - 2), ranks[x] - 1, ranks[x] - 2]     # swap the last two axes
        wt = f"{w}_transposed"
        if wt not in inits:
            inits[wt] = numpy_helper.from_array(
                np.ascontiguousarray(numpy_helper.to_array(inits[w]).T), wt
            )
            model.graph.initializer.append(inits[wt])
        y = node.output[0]
        nodes += [
            helper.make_node("Transpose", [x], [f"{y}_xt"], perm=perm, name=f"{node.name}_xt"),
            helper.make_node("MatMul", [f"{y}_xt", wt], [f"{y}_yt"], name=node.name),
            helper.make_node("Transpose", [f"{y}_yt"], [y], perm=perm, name=f"{node.name}_yt"),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for n in model.graph.node for i in n.input}
    unused = [t for t in model.graph.initializer if t.name not in used]
    for t in unused:
        model.graph.initializer.remove(t)
    return sorted(
        {
            n.input[0]
            for n in model.graph.node
            if n.op_type == "Gather"
            and n.input[0] in inits
            and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT
        }
    )
