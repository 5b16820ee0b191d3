"""Simplified ONNX -> QNN graph C++ + weights (qnn-onnx-converter), once per graph; QAIRT models
only. A w8a16 graph is quantized by the converter itself from the calibration set's input list."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.engine.files import atomic_path
from toolchain.engine.run import external, worker
from toolchain.errors import StageFailed
from toolchain.stages import Project, named, parity


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models_of(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        for graph in model.graphs:
            src, cpp, weights = (
                artifacts.simplified(model, graph),
                artifacts.qnn_cpp(model, graph),
                artifacts.qnn_weights(model, graph),
            )
            log, record = (
                artifacts.stage_log(model, graph, "convert"),
                artifacts.stage_record(model, graph, "convert"),
            )
            quantized = graph.precision.quantized
            calibration = [artifacts.calibration_list(model, graph)] + [
                artifacts.calibration_raw(model, graph, i, t.name)
                for i in range(graph.calibration) for t in graph.inputs
            ] if quantized else []
            listed = artifacts.converter_input_list(model, graph) if quantized else None
            argv, env = (
                tools.converter_argv(
                    sdk, src, cpp, listed, graph.compile.get("converter_args", ())
                ),
                tools.env(sdk),
            )
            actions = (
                [(worker.in_process, (converter_list, calibration[0], listed))] if quantized else []
            )
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: qnn-onnx-converter ({graph.precision}) -> "
                       f"{graph.name}.cpp "
                f"+ .bin, QNN graph '{tools.graph_name(cpp)}' [qairt {sdk.build_id}]",
                "file_dep": [src, artifacts.inspected(model, graph), *calibration],
                "task_dep": parity.gate(model, graph),
                "targets": [cpp, weights, record, log] + ([listed] if listed else []),
                "clean": True,
                "actions": actions + [(external.action, (argv, env, log, [cpp, weights], record))],
                "uptodate": [
                    config_changed(
                        {
                            "argv": argv,
                            "env": env,
                            "sdk": sdk.record(),
                            "python": sdk.python_version,
                        }
                    )
                ],
            }


def converter_list(calibration_list: str, out: str) -> None:
    """The calibration list with each raw file named from the project root, where the converter
    runs: the calibrate stage names them relative to the list's own folder (the layout
    onnxruntime's reader uses)."""
    folder = Path(calibration_list).parent
    lines = [" ".join(str(folder / name) for name in line.split())
             for line in Path(calibration_list).read_text().splitlines() if line.strip()]
    missing = [f for line in lines for f in line.split() if not Path(f).is_file()]
    if missing:
        raise StageFailed(f"{calibration_list}: lists {missing[0]}, which does not exist")
    with atomic_path(out) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
