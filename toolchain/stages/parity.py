"""ONNX on the CPU (onnxruntime) against the PyTorch original on real inputs, once per model."""
from __future__ import annotations

from importlib import metadata

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import write_json
from toolchain.engine.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata
from toolchain.shared.iorecord import io_record
from toolchain.stages import stream


def tasks(project):
    tool = {"torch": metadata.version("torch"), "onnxruntime": metadata.version("onnxruntime")}
    for model in project.models:
        if not available(model):
            continue
        settings = {**model.parity, "metric": dict(model.metric)}
        onnx_files = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        out = artifacts.parity(model)
        checkpoint = [artifacts.checkpoint(model)] if model.checkpoint else []
        kwargs = {"module_file": model.module_file, "checkpoint": (checkpoint or [None])[0],
                  "onnx_files": onnx_files, "data_dir": model.data_dir, "settings": settings, "out": out,
                  "io": {g.name: io_record(g) for g in model.graphs}, "spec": model.spec_file,
                  "streams": {g.name: {"geometry": dict(g.stream), "state": dict(g.state)}
                              for g in model.graphs if g.stream}}
        yield {"name": model.name,
               "doc": f"{model.name}: ONNX on CPU vs PyTorch on real inputs (max_abs {settings['max_abs']}"
                      f"{', task metric' if model.data_dir else ''})",
               "file_dep": [*checkpoint, *model.code_files, *onnx_files.values(),
                            *modeldata.data_files(model.data_dir)],
               "targets": [out, artifacts.parity_log(model)], "clean": True,
               "actions": [(run, (check, kwargs, artifacts.parity_log(model)))],
               "uptodate": [config_changed({"settings": settings, "tool": tool})]}


def gate(model) -> list[str]:
    """The task_dep of every compile of the model's graphs: the CPU check runs, and passes, first, so a
    model that already fails on the CPU in a minute never costs minutes of compiles (fail fast; the
    inspection of each graph is in the compile's file_dep). An order, not an input: a parity rerun that
    ends the same does not recompile."""
    return [f"parity:{model.name}"] if available(model) else []


def available(model) -> bool:
    """A PyTorch original exists to compare with (not for an ONNX given as a file)."""
    return model.parity["reference"] == "torch"


def check(module_file: str, checkpoint: str | None, onnx_files: dict, data_dir, settings: dict, out: str, io: dict,
          spec: str = "", streams: dict | None = None):
    module = load_module(module_file)
    if not callable(getattr(module, "torch_runner", None)):
        raise StageFailed(f"{module_file}: no torch_runner(checkpoint) function, which the parity stage calls to "
                          f"compare the ONNX with PyTorch; write it, or declare [parity] reference = \"none\" "
                          f"(no PyTorch original)")
    torch_run = modeldata.with_io(module.torch_runner, io)(checkpoint)
    cpu = {g: modeldata.cpu(p) for g, p in onnx_files.items()}

    def onnx_run(graph, feeds):
        return cpu[graph](feeds)

    samples, streams = modeldata.samples(module, data_dir), streams or {}
    feeds = stream.tensor_feeds(module, torch_run, samples[0] if samples else None, io, streams, module_file)
    errors = measures.tensor_errors(torch_run, onnx_run, feeds)
    record = {"tensors": errors, "settings": settings}
    failures = [f"{g}: max abs error {e['max_abs']:.3g} > {settings['max_abs']}"
                for g, e in errors.items() if e["max_abs"] > settings["max_abs"]]
    runs = {}
    if streams and samples:   # the build's own chunk loop, PyTorch and the CPU ONNX each feeding back its state
        bound = {g: {o[0]: {"max_abs": settings["max_abs"]} for o in io[g]["outputs"]} for g in streams}
        where = {g: {o[0]: f"{spec}: parity.max_abs" for o in io[g]["outputs"]} for g in streams}
        record["stream"], lines, _, runs = stream.compare_runs(module, samples, streams, io, torch_run, onnx_run,
                                                               bound, where, module_file)
        failures += lines
    ref, got = stream.task_runs(module, samples, streams, runs, io, torch_run, onnx_run)
    if ref is not None:   # the model's own task metric
        record["task"], task_failures = module.agree(ref, got, {**settings["metric"], "tier": "parity"})
        failures += task_failures
    print(record)
    if failures:
        raise StageFailed(f"parity failed for {', '.join(onnx_files.values())}: " + "; ".join(failures))
    write_json(out, record)
