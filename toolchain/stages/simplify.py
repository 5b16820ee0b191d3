"""Exported ONNX -> onnxsim-simplified ONNX, once per graph."""
from __future__ import annotations

import time
from importlib import metadata

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import atomic_path
from toolchain.engine.worker import run
from toolchain.errors import StageFailed
from toolchain.stages.export import onnx_or_fail


def tasks(project):
    tool = tool_version()
    for model in project.models:
        for graph in model.graphs:
            src, out = artifacts.exported(model, graph), artifacts.simplified(model, graph)
            log = artifacts.simplify_log(model, graph)
            yield {"name": f"{model.name}/{graph.name}",
                   "doc": f"{model.name}/{graph.name}: onnxsim (constant folding, shape inference)",
                   "file_dep": [src], "targets": [out, log], "clean": True,
                   "actions": [(run, (simplify, {"src": src, "out": out}, log))],
                   "uptodate": [config_changed({"tool": tool})]}


def tool_version() -> dict:
    return {"onnxsim": metadata.version("onnxsim"), "onnx": metadata.version("onnx")}


def simplify(src: str, out: str):
    import onnx
    import onnxsim
    onnx_or_fail(src, f"{src} is")
    started = time.monotonic()
    model, ok = onnxsim.simplify(onnx.load(src))
    print(f"onnxsim: {time.monotonic() - started:.2f} s")   # the tool's own time (bench/overhead.py)
    if not ok:
        raise StageFailed(f"{src}: onnxsim could not validate the simplified model")
    print(f"nodes: {len(onnx.load(src, load_external_data=False).graph.node)} -> {len(model.graph.node)}")
    with atomic_path(out) as tmp:
        onnx.save(model, str(tmp))
