"""The oracle of the design card's route (on demand: `doit oracle`, `doit oracle:<model>/<graph>@<CHIP>`): the EP
compiles the same ONNX with the same options directly, in a fresh process, into a scratch folder; the route's
binary must be byte-identical and its EPContext wrapper must carry the same node and metadata. A difference fails
in one line naming the graph and chip, and the record says what differed: nothing differing ships silently once
the oracle has run (it costs one more compile per graph and chip, so it is not part of a plain `doit`)."""
from __future__ import annotations

import hashlib
import os
import shutil

from doit.tools import config_changed

from toolchain.backends.ort_qnn import ep
from toolchain.engine import paths
from toolchain.engine.files import write_json
from toolchain.engine.worker import StageFailed, run


def record_path(model, graph, chip) -> str:
    return f"{paths.chip_dir(model, chip)}/{graph.name}.oracle.json"


def tasks(project):
    tool = ep.version()
    for model, graph, chip in project.graph_chips(ep.NAME):
        if not ep.uses_route(graph):
            continue
        options = model.backend.options(model, graph, chip)
        src = paths.compile_source(model, graph)
        ctx, binary = paths.context_model(model, graph, chip), paths.context_binary(model, graph, chip)
        record, log = record_path(model, graph, chip), f"{paths.chip_dir(model, chip)}/{graph.name}.oracle.log"
        kwargs = {"src": src, "ctx": ctx, "binary": binary, "options": options, "record": record,
                  "label": f"{model.name}/{graph.name}@{chip.name}"}
        yield {"name": f"{model.name}/{graph.name}@{chip.name}",
               "doc": f"{model.name}/{graph.name}@{chip.name}: the route's binary == the EP's direct compile (md5)",
               "file_dep": [src, ctx, binary, *model.backend.tool_files()],
               "targets": [record, log], "clean": True, "actions": [(run, (check, kwargs, log))],
               "uptodate": [config_changed({"options": options, "tool": tool})]}


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(src: str, ctx: str, binary: str, options: dict, record: str, label: str):
    import onnx
    scratch = os.path.join(os.path.dirname(record), f".oracle-{os.path.basename(binary)}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        direct = ep.compile(src, os.path.join(scratch, os.path.basename(ctx)), options)
        ours, theirs = _md5(binary), _md5(direct["binary"])
        wrapper = [_node(onnx.load(p)) for p in (ctx, os.path.join(scratch, os.path.basename(ctx)))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    found = {"route_md5": ours, "ep_md5": theirs, "identical": ours == theirs, "wrapper_identical": wrapper[0] == wrapper[1],
             "ep_seconds": direct["seconds"], "options": options}
    write_json(record, found)
    if ours != theirs:
        raise StageFailed(f"{label}: the route's binary differs from the EP's direct compile (md5 {ours} != {theirs}); "
                          f"declare route = \"ep\" for this graph until the route reproduces it")
    if wrapper[0] != wrapper[1]:
        raise StageFailed(f"{label}: the route's EPContext wrapper differs from the EP's: {wrapper[0]} != {wrapper[1]}")


def _node(model) -> dict:
    """What a runtime reads of an EPContext model: the node (name, attributes, I/O), I/O types, metadata."""
    from onnx import helper
    node = model.graph.node[0]
    return {"name": node.name, "op": node.op_type, "domain": node.domain, "inputs": list(node.input),
            "outputs": list(node.output), "attributes": {a.name: helper.get_attribute_value(a) for a in node.attribute},
            "io": [str(v.type) for v in [*model.graph.input, *model.graph.output]],
            "metadata": {p.key: p.value for p in model.metadata_props}}
