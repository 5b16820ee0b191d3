"""Checkpoint -> one static-shape ONNX per graph, by the model's own export code."""
from __future__ import annotations

import subprocess
import time
from importlib import metadata

from doit.tools import config_changed

from toolchain import paths
from toolchain.files import atomic_path, write_json
from toolchain.worker import load_module, run


def tool_version() -> dict:
    return {"torch": metadata.version("torch"), "onnxscript": metadata.version("onnxscript")}


def io_record(graph) -> dict:
    """The declared graph interface, as plain JSON."""
    def tensors(ts):
        return [[t.name, list(t.shape), t.dtype] for t in ts]
    return {"inputs": tensors(graph.inputs), "outputs": tensors(graph.outputs)}


def tasks(project):
    for model in project.models:
        settings_export = dict(model.export)
        for graph in model.graphs:
            out, record = paths.exported(model, graph), paths.export_record(model, graph)
            log = out[:-len(".onnx")] + ".log"
            settings = {"export": settings_export, "io": io_record(graph), "tool": tool_version()}
            kwargs = {"module_file": model.module_file, "checkpoint": paths.checkpoint(model),
                      "graph": graph.name, "settings": settings_export, "out": out, "record": record}
            yield {"name": f"{model.name}/{graph.name}",
                   "doc": f"{model.name}/{graph.name}: checkpoint -> ONNX ({settings_export['exporter']}, "
                          f"opset {settings_export['opset']}), batch 1, static shapes",
                   "file_dep": [paths.checkpoint(model), model.module_file],
                   "targets": [out, record, log], "clean": True,
                   "actions": [(run, ("toolchain.export:export", kwargs, log))],
                   "uptodate": [config_changed(settings)]}


def export(module_file: str, checkpoint: str, graph: str, settings: dict, out: str, record: str):
    module = load_module(module_file)
    started = time.monotonic()
    with atomic_path(out) as tmp:
        module.export(checkpoint, graph, str(tmp), settings)
    write_json(record, {"seconds": round(time.monotonic() - started, 2), "settings": settings,
                        "tool": tool_version(), "commit": repo_commit()})


def repo_commit() -> str:
    """This repository's commit (with '-dirty' for uncommitted changes): the export's provenance."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
