"""The spec's legalizing rewrites proven on the model's own data: every rewritten graph against its
unrewritten self, both on onnxruntime's CPU, with the parity machinery (per-call tensors,
free-running streams, the task metric) and the parity bound; once per model that declares any. A
graph that departs names the rewrite that made it depart."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import read_json, write_json
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.rewrites import library as rewrites
from toolchain.shared import measures, modeldata, stream
from toolchain.shared.iorecord import io_record
from toolchain.stages import Project, named, parity


def tasks(project: Project) -> Iterator[dict]:
    tool = {"onnxruntime": versions.version("onnxruntime")}
    for model in project.models:
        if not parity.rewritten(model):
            continue
        graphs = {g.name: {"rewritten": artifacts.simplified(model, g),
                           "unrewritten": artifacts.unrewritten(model, g) if g.rewrite else "",
                           "applied": artifacts.rewrites_applied(model, g) if g.rewrite else ""}
                  for g in model.graphs}
        settings = {"max_abs": model.parity.max_abs, "metric": dict(model.metric)}
        out, log = artifacts.rewrite_check(model), artifacts.rewrite_check_log(model)
        kwargs = {
            "module_file": model.module_file,
            "graphs": graphs,
            "data_dir": model.data_dir,
            "settings": settings,
            "out": out,
            "io": {g.name: io_record(g) for g in model.graphs},
            "spec": model.spec_file,
            "streams": {
                g.name: {"geometry": dict(g.stream), "state": dict(g.state)}
                for g in model.graphs
                if g.stream
            },
        }
        yield {
            **named(model),
            "doc": f"{model.name}: rewritten graphs vs unrewritten on the CPU, on the model's data "
                   "(max_abs "
            f"{settings['max_abs']})",
            "file_dep": [
                *model.code_files,
                *(p for g in graphs.values() for p in g.values() if p),
                *project.data_files(model),
            ],
            "targets": [out, log],
            "clean": True,
            "actions": [(run, (check, kwargs, log))],
            "uptodate": [config_changed({"settings": settings, "tool": tool})],
        }


def check(
    module_file: str,
    graphs: dict,
    data_dir: str | None,
    settings: dict,
    out: str,
    io: dict,
    spec: str,
    streams: dict,
) -> None:
    module = load_module(module_file)
    applied = {g: read_json(p["applied"])["applied"] for g, p in graphs.items() if p["applied"]}
    before = {g: modeldata.cpu(p["unrewritten"] or p["rewritten"]) for g, p in graphs.items()}
    after = {g: modeldata.cpu(p["rewritten"]) for g, p in graphs.items()}
    record, failures = parity.compare(
        module,
        module_file,
        lambda g, feeds: before[g](feeds),
        lambda g, feeds: after[g](feeds),
        data_dir,
        io,
        streams,
        {**settings, "reference": "unrewritten"},
        f"{spec}: parity.max_abs",
    )
    record["applied"] = applied
    print(record)
    if failures:
        samples = modeldata.samples(module, data_dir)
        feeds = stream.tensor_feeds(
            module,
            lambda g, f: before[g](f),
            samples[0] if samples else None,
            io,
            streams,
            module_file,
        )
        raise StageFailed(
            f"{spec}: the rewrites change what the model computes (CPU, unrewritten vs rewritten): "
            + "; ".join(failures)
            + "; "
            + blame(graphs, applied, feeds, settings)
        )
    write_json(out, record)


def blame(graphs: dict, applied: dict, feeds: dict, settings: dict) -> str:
    """Which rewrite departs: each applied one alone on its unrewritten graph, on
    the per-call feeds."""
    import onnx
    found = []
    for g, rules in applied.items():
        reference = modeldata.cpu(graphs[g]["unrewritten"])
        for rule in rules:
            alone = onnx.load(graphs[g]["unrewritten"])
            rewrites.apply(alone, (rule["rewrite"],))
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "alone.onnx")
                onnx.save(alone, path)
                one = modeldata.cpu(path)
                error = measures.tensor_errors(
                    lambda graph, f: reference(f), lambda graph, f: one(f), {g: feeds[g]}
                )[g]
            if error["max_abs"] > settings["max_abs"]:
                found.append(
                    f"rewrite {rule['rewrite']!r} on graph {g} (nodes {', '.join(rule['nodes'])}): "
                    f"max abs error {error['max_abs']:.3g} alone"
                )
    return "; ".join(found) or "no single rewrite departs alone: their combination does"
