"""Float ONNX + calibration set -> QDQ ONNX with 8-bit weights and 16-bit activations (w8a16),
once per graph, for the embedded toolchain (onnxruntime's QNN quantization helpers).

Graph I/O stays float32: with CPU fallback disabled the EP compiles the input Quantize and output
Dequantize into the HTP graph (ort-qnn.md §5), so callers feed floats as for fp16 binaries."""
from __future__ import annotations

from importlib import metadata

from doit.tools import config_changed

from toolchain import calibrate, paths
from toolchain.files import atomic_path
from toolchain.worker import run

SETTINGS = {"activation_type": "QUInt16", "weight_type": "QUInt8", "per_channel": False, "io": "float32"}


def tasks(project):
    tool = {"onnxruntime": metadata.version("onnxruntime"), "onnx": metadata.version("onnx")}
    for model in project.models:
        for graph in model.graphs:
            if graph.precision != "w8a16" or model.toolchain != "ort-qnn":   # QAIRT quantizes in its converter
                continue
            src, out, folder = paths.simplified(model, graph), paths.quantized(model, graph), paths.calibration(model, graph)
            inputs = [[t.name, list(t.shape), t.dtype] for t in graph.inputs]
            raws = [f"{folder}/{calibrate.raw_name(i, t[0])}" for i in range(graph.calibration) for t in inputs]
            log = out[:-len(".onnx")] + ".log"
            kwargs = {"src": src, "folder": folder, "inputs": inputs, "out": out}
            yield {"name": f"{model.name}/{graph.name}",
                   "doc": f"{model.name}/{graph.name}: w8a16 QDQ ONNX (uint8 weights, uint16 activations)",
                   "file_dep": [src, f"{folder}/input_list.txt", *raws], "targets": [out, log], "clean": True,
                   "actions": [(run, ("toolchain.quantize:quantize", kwargs, log))],
                   "uptodate": [config_changed({"settings": SETTINGS, "tool": tool})]}


def quantize(src: str, folder: str, inputs: list, out: str):
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantType
    from onnxruntime.quantization import quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

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
        plain, pre = f"{scratch}/float.onnx", f"{scratch}/pre.onnx"
        onnx.save(float_model, plain)
        model = pre if qnn_preprocess_model(plain, pre) else plain
        config = get_qnn_qdq_config(model, Reader(), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8, per_channel=SETTINGS["per_channel"])
        with atomic_path(out) as tmp:
            ort_quantize(model, str(tmp), config)
