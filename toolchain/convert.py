"""Simplified ONNX -> QNN graph C++ + weights (qnn-onnx-converter), once per graph; QAIRT models only.
A w8a16 graph is quantized by the converter itself from the calibration set's input list (§1 S4)."""
from __future__ import annotations

from doit.tools import config_changed

from toolchain import external, paths, qairt


def tasks(project):
    sdk = project.qairt_sdk
    for model in project.toolchain_models(qairt.NAME):
        for graph in model.graphs:
            src, cpp, weights = paths.simplified(model, graph), paths.qnn_cpp(model, graph), paths.qnn_weights(model, graph)
            log, record = paths.stage_log(model, graph, "convert"), paths.stage_record(model, graph, "convert")
            calibration = f"{paths.calibration(model, graph)}/input_list.txt" if graph.precision == "w8a16" else None
            argv, env = qairt.converter_argv(sdk, src, cpp, calibration), qairt.env(sdk)
            yield {"name": f"{model.name}/{graph.name}",
                   "doc": f"{model.name}/{graph.name}: qnn-onnx-converter ({graph.precision}) -> {graph.name}.cpp "
                          f"+ .bin, QNN graph '{qairt.graph_name(cpp)}' [qairt {sdk.build_id}]",
                   "file_dep": [src, paths.inspected(model, graph)] + ([calibration] if calibration else []),
                   "targets": [cpp, weights, record, log], "clean": True,
                   "actions": [(external.action, (argv, env, log, [cpp, weights], record))],
                   "uptodate": [config_changed({"argv": argv, "env": env, "sdk": sdk.record(),
                                                "python": sdk.python_version})]}
