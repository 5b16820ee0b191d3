"""ONNX on the CPU (onnxruntime) against the model's reference (its PyTorch original, or other code
of the model's) on real inputs, in two steps so that a graph's compile waits only on the check that
can fail it: `parity:<model>/<group>` compares per call the tensors of the graphs judged together
(groups(): a window's encoder with the decoder that consumes it; without windows, all the model's
graphs) and gates their convert and compile; `parity:<model>` then runs the model's own measures
over all its graphs (each stream graph's free-running loop, the task metric, a window's transcripts
against the largest window's) and writes the model's record, parity.json, from both. It gates the
simulator (verify): a model that fails on the CPU never pays a simulator run."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import read_json, write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import measures, modeldata, stream
from toolchain.shared.iorecord import io_record
from toolchain.spec import REFERENCES, windows
from toolchain.spec.records import Graph, Model
from toolchain.stages import Project, export, named

Run = Callable[[str, dict], dict]   # run(graph name, feeds) -> outputs


def tasks(project: Project) -> Iterator[dict]:
    tool = {"torch": versions.version("torch"), "onnxruntime": versions.version("onnxruntime")}
    for model in project.models:
        if not available(model):
            continue
        settings = {**model.parity.settings(), "metric": dict(model.metric)}
        checkpoint = [artifacts.checkpoint(model)] if model.checkpoint else []
        common = {
            "module_file": model.module_file,
            "checkpoint": checkpoint[0] if checkpoint else None,
            "data_dir": model.data_dir,
            "settings": settings,
            "spec": model.spec_file,
        }
        inputs = [*checkpoint, *model.code_files, *project.data_files(model)]
        records = {}
        for group, graphs in groups(model).items():
            records[group] = out = artifacts.parity_group(model, group)
            log = artifacts.parity_group_log(model, group)
            onnx_group = {g.name: artifacts.simplified(model, g) for g in graphs}
            kwargs = {**common, "onnx_files": onnx_group, "out": out,
                      "io": {g.name: io_record(g) for g in graphs}, "streams": streams(graphs)}
            yield {
                **named(model, group),
                "doc": f"{model.name}/{group}: ONNX on CPU vs {settings['reference']} reference, "
                       "per call "
                f"(max_abs {settings['max_abs']}); gates these graphs' compiles",
                "file_dep": [*inputs, *onnx_group.values()],
                "targets": [out, log],
                "clean": True,
                "actions": [(run, (check_tensors, kwargs, log))],
                "uptodate": [config_changed({"settings": settings, "tool": tool})],
            }
        onnx_files = {g.name: artifacts.simplified(model, g) for g in model.graphs}
        kwargs = {
            **common,
            "onnx_files": onnx_files,
            "out": artifacts.parity(model),
            "tensors": records,
            "io": {g.name: io_record(g) for g in model.graphs},
            "streams": streams(model.graphs),
        }
        yield {
            **named(model),
            "doc": f"{model.name}: ONNX on CPU vs {settings['reference']} reference on real inputs "
                   "(max_abs "
            f"{settings['max_abs']}"
            f"{', task metric' if model.data_dir else ''})",
            "file_dep": [*inputs, *onnx_files.values(), *records.values()],
            "targets": [artifacts.parity(model), artifacts.parity_log(model)],
            "clean": True,
            "actions": [(run, (check, kwargs, artifacts.parity_log(model)))],
            "uptodate": [config_changed({"settings": settings, "tool": tool})],
        }


def streams(graphs: Iterable[Graph]) -> dict:
    return {
        g.name: {"geometry": dict(g.stream), "state": dict(g.state)} for g in graphs if g.stream
    }


def groups(model: Model) -> dict[str, tuple]:
    """The graphs judged together, by the group's name (its graphs' names joined by '+'): each
    window's graphs (a window's encoder with the decoder that consumes it, spec/windows.py), every
    graph not cut per window with the largest window's; without windows, all the model's graphs. A
    stream graph fed by another (stream.from) is in its group."""
    by_name = {g.name: g for g in model.graphs}
    sizes = windows.by_size(model.windows)
    if not sizes:
        parts = [list(by_name)]
    else:
        cut = {name for per_size in sizes.values() for name in per_size.values()}
        parts = [list(per_size.values()) for per_size in sizes.values()]
        parts[-1] += [n for n in by_name if n not in cut]
    return {"+".join(names): tuple(by_name[n] for n in names) for names in parts}


def group_of(model: Model, graph: Graph) -> str:
    return next(name for name, graphs in groups(model).items() if graph in graphs)


def gate(model: Model, graph: Graph | None = None) -> list[str]:
    """The task_dep of a compile (convert, quantize) of `graph` (None: of every graph): its CPU
    checks run, and pass, first, so a graph that already fails on the CPU in a minute never costs
    minutes of compiles (fail fast; the inspection of each graph is in the compile's file_dep): the
    per-call parity of its group, and the check of the spec's rewrites. Never a window or graph it
    is not judged with: those would only delay it. An order, not an input: a rerun that ends the
    same does not recompile."""
    names = list(groups(model)) if graph is None else [group_of(model, graph)]
    return ([f"parity:{model.name}/{n}" for n in names] * available(model)
            + [f"rewrite_check:{model.name}"] * rewritten(model))


def available(model: Model) -> bool:
    """A reference exists to compare with: the model code's PyTorch (or other) runner."""
    return model.parity.reference != "none"


def rewritten(model: Model) -> bool:
    """Some graph declares legalizing rewrites (checked against the unrewritten graph:
    stages/rewrite_check.py)."""
    return any(g.rewrite for g in model.graphs)


def runner(module: ModuleType, module_file: str, reference: str) -> Callable[..., Any]:
    """The model code's reference runner the spec names: torch_runner or
    reference_runner (spec.REFERENCES)."""
    name = REFERENCES[reference]
    if not callable(getattr(module, name, None)):
        raise StageFailed(
            f"{module_file}: no {name}(checkpoint) function, which the parity stage calls to "
            "compare "
            f'the ONNX with the model\'s reference ([parity] reference = "{reference}"); write it, '
            f'or declare [parity] reference = "none" (no reference)'
        )
    return getattr(module, name)


def _runs(
    module_file: str, checkpoint: str | None, onnx_files: dict, settings: dict, io: dict
) -> tuple[ModuleType, Run, Run]:
    """(model code, reference run, CPU ONNX run) of these graphs."""
    module = load_module(module_file)
    try:
        reference = modeldata.with_io(runner(module, module_file, settings["reference"]), io)(
            checkpoint
        )
    except StageFailed:
        raise
    except Exception as err:  # the reference cannot load the checkpoint it is given
        raise export.code_failed(
            module_file, f"{REFERENCES[settings['reference']]}()", checkpoint, err
        ) from err
    cpu: dict = {}   # each graph's session made when first run (the model's step may run none)

    def onnx_run(graph: str, feeds: dict) -> dict:
        if graph not in cpu:
            cpu[graph] = modeldata.cpu(onnx_files[graph])
        return cpu[graph](feeds)
    return module, reference, onnx_run


def check_tensors(
    module_file: str,
    checkpoint: str | None,
    onnx_files: dict,
    data_dir: str | None,
    settings: dict,
    out: str,
    io: dict,
    spec: str = "",
    streams: dict | None = None,
) -> None:
    """parity:<model>/<group>: the group's graphs per call."""
    module, reference, onnx_run = _runs(module_file, checkpoint, onnx_files, settings, io)
    record, failures = compare_tensors(
        module, module_file, reference, onnx_run, data_dir, io, streams or {}, settings
    )
    print(record)
    if failures:
        raise StageFailed(
            f"parity failed for {', '.join(onnx_files.values())}: " + "; ".join(failures)
        )
    write_json(out, record)


def check(
    module_file: str,
    checkpoint: str | None,
    onnx_files: dict,
    data_dir: str | None,
    settings: dict,
    out: str,
    io: dict,
    spec: str = "",
    streams: dict | None = None,
    tensors: dict | None = None,
) -> None:
    """parity:<model>: the model's own measures over all its graphs, and its record with the
    per-call tensors of each group (`tensors`: group -> its record, checked already); without them,
    the per-call check here too."""
    module, reference, onnx_run = _runs(module_file, checkpoint, onnx_files, settings, io)
    errors = {
        g: e for path in (tensors or {}).values() for g, e in read_json(path)["tensors"].items()
    }
    record, failures = compare(
        module,
        module_file,
        reference,
        onnx_run,
        data_dir,
        io,
        streams or {},
        settings,
        f"{spec}: parity.max_abs",
        errors if tensors else None,
    )
    print(record)
    if failures:
        raise StageFailed(
            f"parity failed for {', '.join(onnx_files.values())}: " + "; ".join(failures)
        )
    write_json(out, record)


def compare_tensors(
    module: ModuleType,
    module_file: str,
    reference: Run,
    candidate: Run,
    data_dir: str | None,
    io: dict,
    streams: dict,
    settings: dict,
) -> tuple[dict, list[str]]:
    """Per-call tensors of two CPU runs of a model's graphs on its own data, held
    to settings["max_abs"]."""
    samples = modeldata.samples(module, data_dir)
    feeds = stream.tensor_feeds(
        module, reference, samples[0] if samples else None, io, streams, module_file
    )
    errors = measures.tensor_errors(reference, candidate, feeds)
    failures = [f"{g}: max abs error {e['max_abs']:.3g} > {settings['max_abs']}"
                for g, e in errors.items() if e["max_abs"] > settings["max_abs"]]
    return {
        "tensors": errors,
        "settings": settings,
        "inputs": inputs_used(module, samples, io, streams),
    }, failures


def inputs_used(module: ModuleType, samples: list, io: dict, streams: dict) -> dict:
    """Which inputs each check used, for the record: each graph's per-call feeds, and the samples
    the stream loops and the task metric ran on."""
    return {"tensors": stream.feeds_origin(module, samples[0] if samples else None, io, streams),
            "samples": [s[0] for s in samples]}


def compare(
    module: ModuleType,
    module_file: str,
    reference: Run,
    candidate: Run,
    data_dir: str | None,
    io: dict,
    streams: dict,
    settings: dict,
    where: str,
    errors: dict | None = None,
) -> tuple[dict, list[str]]:
    """Two CPU runs of a model's graphs on its own data, held to settings["max_abs"] (`where` names
    that bound): per-call tensors (unless `errors` gives them, measured and passed), each stream
    graph's free-running loop (each run feeding back its own state) and the model's task metric;
    (record, failure lines)."""
    samples = modeldata.samples(module, data_dir)
    if errors is None:
        record, failures = compare_tensors(
            module, module_file, reference, candidate, data_dir, io, streams, settings
        )
    else:
        record, failures = {"tensors": errors, "settings": settings,
                            "inputs": inputs_used(module, samples, io, streams)}, []
    runs: dict = {}
    if streams and samples:
        bound = {
            g: {o[0]: {"max_abs": settings["max_abs"]} for o in io[g]["outputs"]} for g in streams
        }
        sources = {g: {o[0]: where for o in io[g]["outputs"]} for g in streams}
        record["stream"], lines, _, runs = stream.compare_runs(
            module, samples, streams, io, reference, candidate, bound, sources, module_file
        )
        failures += lines
    ref, got = stream.task_runs(module, samples, streams, runs, io, reference, candidate)
    if ref is not None:  # the model's own task metric
        record["task"], task_failures = module.agree(
            ref, got, {**settings["metric"], "tier": "parity"}
        )
        failures += task_failures
    return record, failures
