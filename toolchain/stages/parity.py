"""ONNX on the CPU (onnxruntime) against the model's reference (its PyTorch original, or other code of the model's)
on real inputs, once per model."""
from __future__ import annotations

from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import write_json
from toolchain.engine.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata
from toolchain.shared.iorecord import io_record
from toolchain.spec import REFERENCES
from toolchain.stages import export, stream

if TYPE_CHECKING:   # annotations only: the project imports every stage
    from toolchain.project import Project


def tasks(project: Project):
    tool = {"torch": versions.version("torch"), "onnxruntime": versions.version("onnxruntime")}
    for model in project.models:
        if not available(model):
            continue
        settings = {**model.parity, "metric": dict(model.metric)}
        onnx_files = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        out = artifacts.parity(model)
        checkpoint = [artifacts.checkpoint(model)] if model.checkpoint else []
        kwargs = {"module_file": model.module_file, "checkpoint": checkpoint[0] if checkpoint else None,
                  "onnx_files": onnx_files, "data_dir": model.data_dir, "settings": settings, "out": out,
                  "io": {g.name: io_record(g) for g in model.graphs}, "spec": model.spec_file,
                  "streams": {g.name: {"geometry": dict(g.stream), "state": dict(g.state)}
                              for g in model.graphs if g.stream}}
        yield {"name": model.name,
               "doc": f"{model.name}: ONNX on CPU vs {settings['reference']} reference on real inputs (max_abs "
                      f"{settings['max_abs']}"
                      f"{', task metric' if model.data_dir else ''})",
               "file_dep": [*checkpoint, *model.code_files, *onnx_files.values(),
                            *project.data_files(model)],
               "targets": [out, artifacts.parity_log(model)], "clean": True,
               "actions": [(run, (check, kwargs, artifacts.parity_log(model)))],
               "uptodate": [config_changed({"settings": settings, "tool": tool})]}


def gate(model) -> list[str]:
    """The task_dep of every compile of the model's graphs: the CPU checks run, and pass, first, so a
    model that already fails on the CPU in a minute never costs minutes of compiles (fail fast; the
    inspection of each graph is in the compile's file_dep): parity, and the check of the spec's rewrites. An
    order, not an input: a rerun that ends the same does not recompile."""
    return [f"parity:{model.name}"] * available(model) + [f"rewrite:{model.name}"] * rewritten(model)


def available(model) -> bool:
    """A reference exists to compare with: the model code's PyTorch (or other) runner."""
    return model.parity["reference"] != "none"


def rewritten(model) -> bool:
    """Some graph declares legalizing rewrites (checked against the unrewritten graph: stages/rewrite.py)."""
    return any(g.rewrite for g in model.graphs)


def runner(module, module_file: str, reference: str):
    """The model code's reference runner the spec names: torch_runner or reference_runner (spec.REFERENCES)."""
    name = REFERENCES[reference]
    if not callable(getattr(module, name, None)):
        raise StageFailed(f"{module_file}: no {name}(checkpoint) function, which the parity stage calls to compare "
                          f"the ONNX with the model's reference ([parity] reference = \"{reference}\"); write it, "
                          f"or declare [parity] reference = \"none\" (no reference)")
    return getattr(module, name)


def check(module_file: str, checkpoint: str | None, onnx_files: dict, data_dir, settings: dict, out: str, io: dict,
          spec: str = "", streams: dict | None = None):
    module = load_module(module_file)
    try:
        reference = modeldata.with_io(runner(module, module_file, settings["reference"]), io)(checkpoint)
    except StageFailed:
        raise
    except Exception as err:   # the reference cannot load the checkpoint it is given
        raise export.code_failed(module_file, f"{REFERENCES[settings['reference']]}()", checkpoint, err) from err
    cpu = {g: modeldata.cpu(p) for g, p in onnx_files.items()}

    def onnx_run(graph, feeds):
        return cpu[graph](feeds)

    record, failures = compare(module, module_file, reference, onnx_run, data_dir, io, streams or {}, settings,
                               f"{spec}: parity.max_abs")
    print(record)
    if failures:
        raise StageFailed(f"parity failed for {', '.join(onnx_files.values())}: " + "; ".join(failures))
    write_json(out, record)


def compare(module, module_file: str, reference, candidate, data_dir, io: dict, streams: dict, settings: dict,
            where: str) -> tuple[dict, list[str]]:
    """Two CPU runs of a model's graphs on its own data, held to settings["max_abs"] (`where` names that bound):
    per-call tensors, each stream graph's free-running loop (each run feeding back its own state) and the model's
    task metric; (record, failure lines)."""
    samples = modeldata.samples(module, data_dir)
    feeds = stream.tensor_feeds(module, reference, samples[0] if samples else None, io, streams, module_file)
    errors = measures.tensor_errors(reference, candidate, feeds)
    record = {"tensors": errors, "settings": settings}
    failures = [f"{g}: max abs error {e['max_abs']:.3g} > {settings['max_abs']}"
                for g, e in errors.items() if e["max_abs"] > settings["max_abs"]]
    runs: dict = {}
    if streams and samples:
        bound = {g: {o[0]: {"max_abs": settings["max_abs"]} for o in io[g]["outputs"]} for g in streams}
        sources = {g: {o[0]: where for o in io[g]["outputs"]} for g in streams}
        record["stream"], lines, _, runs = stream.compare_runs(module, samples, streams, io, reference, candidate,
                                                               bound, sources, module_file)
        failures += lines
    ref, got = stream.task_runs(module, samples, streams, runs, io, reference, candidate)
    if ref is not None:   # the model's own task metric
        record["task"], task_failures = module.agree(ref, got, {**settings["metric"], "tier": "parity"})
        failures += task_failures
    return record, failures
