"""A model's windows ([windows], spec/windows.py) in one context binary per chip whose weights are
stored once: the EP's own multi-graph compile (session option `ep.share_ep_contexts`, every graph in
one process, the last with `ep.stop_share_ep_contexts`), read back (graph count, each graph's I/O)
and weighed against the graphs' own binaries.

Why the EP and not the design card's route: the QNN Saver's recording drops the context's
weight-sharing setting, so composing recorded graphs into one context would store the weights once
per graph (docs/whisper-windows.md). Why it is not verified here: the x86 HTP simulator refuses a
shared-weights context ("Shared weights buffer isn't supported on this platform", measured); each
window is verified from its own binary instead (verify.py), and this one is read back only. The
graphs' I/O names get a `__<graph>` suffix: one context cannot hold two graphs that both take `mel`
(QNN error 7003, measured)."""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep
from toolchain.engine.files import atomic_dir, read_json, sha256, write_json
from toolchain.engine.run.worker import run
from toolchain.errors import StageFailed
from toolchain.qnn import qnnbin
from toolchain.shared.iorecord import io_record
from toolchain.spec.windows import by_size
from toolchain.stages import Project, named

SUFFIX = "__"   # <input name>__<graph>: unique across the context's graphs


def tasks(project: Project) -> Iterator[dict]:
    for model, chip in project.model_chips(ep.NAME):
        # the build's own QAIRT only (a family's EP is another interpreter)
        if not model.windows or chip.family:
            continue
        graphs = [
            g
            for g in model.graphs
            if any(g.name in pair.values() for pair in by_size(model.windows).values())
        ]
        sources = {g.name: artifacts.compile_source(model, g) for g in graphs}
        options = {g.name: ep.graph_options(model, g, chip) for g in graphs}
        io = {g.name: io_record(g) for g in graphs}
        alone = {g.name: artifacts.compile_record(model, g, chip) for g in graphs}
        out, record = artifacts.shared_dir(model, chip), artifacts.shared_record(model, chip)
        log = artifacts.shared_log(model, chip)
        # the EP names the one binary after the first graph's EPContext model
        outputs = [f"{out}/{graphs[0].name}_qnn.bin", *(f"{out}/{g.name}.onnx" for g in graphs)]
        kwargs = {
            "sources": sources,
            "options": options,
            "io": io,
            "alone": alone,
            "out": out,
            "record": record,
            "chip": chip.record(),
        }
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} -> {chip.name}: its {len(graphs)} window graphs in one context "
                   "binary, weights "
            "stored once (EP share_ep_contexts), read back; not simulated (the simulator cannot "
            "load it)",
            "file_dep": [*sources.values(), *alone.values(), *ep.library_files()],
            "targets": [record, log, *outputs],
            "clean": True,
            "actions": [(run, (build, kwargs, log))],
            "uptodate": [
                config_changed(
                    {"options": options, "io": io, "chip": chip.record(), "tool": ep.version()}
                )
            ],
        }


def renamed(io: dict, graph: str) -> dict:
    """A graph's I/O with the names it has inside the shared context."""
    return {kind: [[f"{name}{SUFFIX}{graph}", shape, dtype] for name, shape, dtype in tensors]
            for kind, tensors in io.items()}


def rename_io(src: str, graph: str, dst: str) -> None:
    """A copy of the ONNX `src` whose graph inputs and outputs end in `__<graph>`."""
    import onnx
    onnx_model = onnx.load(src)
    body = onnx_model.graph
    names = {v.name: f"{v.name}{SUFFIX}{graph}" for v in (*body.input, *body.output)}
    for value in (*body.input, *body.output):
        value.name = names[value.name]
    for node in body.node:
        node.input[:] = [names.get(x, x) for x in node.input]
        node.output[:] = [names.get(x, x) for x in node.output]
    onnx.save(onnx_model, dst)


def build(sources: dict, options: dict, io: dict, alone: dict, out: str, record: str,
          chip: dict) -> None:
    """Compile every window graph in this (fresh) process into one shared context, then
    read it back."""
    started, order = time.monotonic(), list(sources)
    with tempfile.TemporaryDirectory() as scratch, atomic_dir(Path(out)) as tmp:
        for i, graph in enumerate(order):
            src = os.path.join(scratch, f"{graph}.onnx")
            rename_io(sources[graph], graph, src)
            config = {
                "ep.context_enable": "1",
                "ep.context_embed_mode": "0",
                "ep.context_file_path": str(tmp / f"{graph}.onnx"),
                "ep.share_ep_contexts": "1",
            }
            if i == len(order) - 1:
                config["ep.stop_share_ep_contexts"] = "1"
            ep.compile_shared(src, options[graph], config)
        binaries = sorted(p.name for p in tmp.glob("*_qnn.bin"))
        if binaries != [f"{order[0]}_qnn.bin"]:
            raise StageFailed(
                f"{out}: expected one shared context binary, the EP wrote {binaries or 'none'}"
            )
        binary = str(tmp / binaries[0])
        info = qnnbin.binary_info(binary)
        problems = graph_problems(info, {g: renamed(io[g], g) for g in order})
        if problems:
            raise StageFailed(f"{out}/{binaries[0]}: the shared context is not what was asked for: "
                              + "; ".join(problems))
        size, config_fields = os.path.getsize(binary), qnnbin.config_fields(binary)
        if config_fields.get("soc_type") != chip["name"]:
            raise StageFailed(
                f"{out}/{binaries[0]}: soc_type {config_fields.get('soc_type')} != {chip['name']}"
            )
        digest = sha256(binary)
    separate = {g: read_json(alone[g])["bytes"] for g in order}
    write_json(
        record,
        {
            "binary": f"{out}/{binaries[0]}",
            "sha256": digest,
            "bytes": size,
            "context_models": {g: f"{out}/{g}.onnx" for g in order},
            "separate_bytes": separate,
            "separate_total": sum(separate.values()),
            "saved_fraction": round(1 - size / sum(separate.values()), 4),
            "graphs": [
                {
                    "name": g["name"],
                    "inputs": [t["name"] for t in g["inputs"]],
                    "outputs": [t["name"] for t in g["outputs"]],
                }
                for g in info["graphs"]
            ],
            "io_names": "<declared name>__<graph>",
            "seconds": round(time.monotonic() - started, 1),
            "simulated": False,
            "why_not_simulated": "the x86 HTP simulator cannot load a context whose "
            "weights are shared ('Shared weights buffer isn't supported on this platform'); each "
            "window "
            "is verified from its own binary",
            "tool": ep.version(),
        },
    )


def graph_problems(info: dict, wanted: dict) -> list[str]:
    """Differences between the graphs read back and the wanted {graph: renamed io}: count,
    names, shapes, dtypes."""
    found = info.get("graphs", [])
    if len(found) != len(wanted):
        return [f"{len(found)} graphs, expected {len(wanted)}"]
    problems = []
    seen = {tuple(sorted(t["name"] for t in g["inputs"])): g for g in found}
    for graph, io in wanted.items():
        key = tuple(sorted(name for name, _, _ in io["inputs"]))
        if key not in seen:
            problems.append(f"no graph takes {list(key)} ({graph})")
            continue
        got = seen[key]
        for kind in ("inputs", "outputs"):
            have = {t["name"]: list(t["shape"]) for t in got[kind]}
            for name, shape, _ in io[kind]:
                if have.get(name) != shape:
                    problems.append(
                        f"{graph}: {kind[:-1]} {name} is {have.get(name)}, expected {shape}"
                    )
    return problems
