"""ONNX -> QNN graph (the design card's .cpp/.bin node), once per graph: the onnxruntime QNN EP
lowers the graph for the HTP and the wheel's QNN Saver records every QNN API call it makes as a C
program (`<graph>.c`) plus its weights (`<graph>.bin`). The Saver always writes ./saver_output/ in
the working folder, so the session is made in a fresh temp folder of its own, in the step's own
process; no context is requested and nothing runs.

Chip-independent by measurement, not assumption: every shipped graph recorded with each default
chip's options (and SM8350's) gave the same bytes (docs/design-card.md, bench/design_card.py); the
Saver drops the chip's settings anyway (they are put back per chip: context.py). So a graph is
recorded once, with its model's first chip's options, and the chip is not part of this stage's
settings (adding a chip converts nothing)."""
from __future__ import annotations

import collections
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep, families
from toolchain.engine.files import atomic_path, read_json, write_json
from toolchain.engine.run.worker import run
from toolchain.errors import StageFailed
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Project, named, parity

# where the Saver writes, relative to the working folder (no option moves it)
SAVER_DIR = "saver_output"


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models_of(ep.NAME):
        # each QAIRT family records its own lowering (in its own interpreter)
        for family in model.qairt or ("",):
            yield from _tasks(project, model, family)


def _tasks(project: Project, model: Model, family: str) -> Iterator[dict]:
    for graph in model.graphs:
        if not ep.uses_route(graph):
            continue
        src, targets = artifacts.compile_source(model, graph), outputs(model, graph, family)
        log = artifacts.stage_log(model, graph, "convert", family=family)
        options = lowering_options(project.chips[model.chips[0]], model, graph, family)
        # no export
        given = graph.source[-1] if graph.source and graph.source[0] in ("onnx", "archive") else ""
        kwargs = {"src": src, "source_c": targets[0], "weights": targets[1], "record": targets[2],
                  "options": options, "given": given}
        # a family's Saver is in its environment (its record)
        saver = [] if family else [ep.saver_library()]
        yield {
            **named(model, graph, family=family),
            "doc": f"{model.name}/{graph.name}: QNN Saver recording of the EP's HTP lowering -> "
            f"{graph.name}.c + {graph.name}.bin ({graph.precision}"
            f"{f', QAIRT {family}' if family else ''}){last_summary(targets[2])}",
            "file_dep": [
                src,
                artifacts.inspected(model, graph),
                *families.tool_files(family),
                *saver,
            ],
            "task_dep": parity.gate(model, graph),
            "targets": targets + [log],
            "meta": families.step_meta(family),
            "clean": True,
            "actions": [(run, (record, kwargs, log))],
            "uptodate": [
                config_changed(
                    {
                        "graph_options": ep.option_strings(graph.compile.get("ep_options", {})),
                        "precision": graph.precision,
                        "tool": families.tool(family),
                    }
                )
            ],
        }


def last_summary(record: str) -> str:
    """What the last recording held, for `doit list` / `doit info`: '; last: 248 QNN nodes
    (Reshape 67, ...)'."""
    if not os.path.isfile(record):
        return ""
    try:
        r = read_json(record)
        ops = ", ".join(f"{op} {n}" for op, n in list(r["ops"].items())[:4])
        return (
            f"; last: {r['nodes']} QNN nodes ({ops}, ...), {r['weight_bytes'] / 1e6:.1f} MB weights"
        )
    except (OSError, ValueError, KeyError):
        return ""   # a damaged record is the outputs check's business, not the listing's


def outputs(model: Model, graph: Graph, family: str = "") -> list[str]:
    return [artifacts.qnn_source(model, graph, family), artifacts.qnn_weights(model, graph, family),
            artifacts.stage_record(model, graph, "convert", family=family)]


def lowering_options(chip: Chip, model: Model, graph: Graph, family: str = "") -> dict:
    """The EP options the recording session gets: those of the model's first chip (the chip changes
    no byte of the recording, measured) plus the graph's own, and the Saver (a family's: found by
    its step, in its own environment)."""
    found = ep.graph_options(model, graph, chip)
    return found if family else {**found, "qnn_saver_path": ep.saver_library()}


def record(src: str, source_c: str, weights: str, record: str, options: dict,
           given: str = "") -> None:
    """Record the lowering in a fresh temp folder (absolute paths: the step then changes
    its working folder)."""
    src, source_c, weights, record = (os.path.abspath(p) for p in (src, source_c, weights, record))
    options = {**options, "qnn_saver_path": options.get("qnn_saver_path") or ep.saver_library()}
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix=".convert.", dir=os.path.dirname(source_c))
    here = os.getcwd()
    try:
        os.chdir(scratch)
        try:
            # raises StageFailed naming the nodes the HTP cannot take
            ep.lower(src, options, given)
        # the record says which and why (the EP's reason), for tools and people
        except ep.OffTheHtp as err:
            write_json(
                record,
                {
                    "status": "failed",
                    "cpu_nodes": [
                        {"node": name, "op_type": op, "reason": why, "rewrite": rule}
                        for name, op, why, rule in err.nodes
                    ],
                },
            )
            raise
        os.chdir(here)
        made = Path(scratch, SAVER_DIR)
        if not (made / "saver_output.c").is_file() or not (made / "params.bin").is_file():
            raise StageFailed(
                f"{src}: the QNN Saver wrote no {SAVER_DIR}/saver_output.c + params.bin"
            )
        for name, target in (("saver_output.c", source_c), ("params.bin", weights)):
            with atomic_path(target) as tmp:
                os.replace(made / name, tmp)
    finally:
        os.chdir(here)
        shutil.rmtree(scratch, ignore_errors=True)
    summary = graph_summary(source_c)
    if summary["graphs"] != 1:
        raise StageFailed(
            f"{source_c}: {summary['graphs']} QNN graphs recorded, expected 1 (a split graph)"
        )
    import onnx
    metadata = {p.key: p.value for p in onnx.load(src, load_external_data=False).metadata_props}
    # no wall time in the record: compile reads it, and the same recording made on another machine
    # (the graph source is code: rebuilt, never restored) must key compile's shared-cache entry the
    # same (the log has it)
    print(f"recorded in {time.monotonic() - started:.3f} s")
    write_json(
        record,
        {
            **summary,
            "weights_file_bytes": os.path.getsize(weights),
            "onnx_metadata": metadata,
            "tool": ep.version(),
            "recorded_with": {k: v for k, v in options.items() if k != "qnn_saver_path"},
        },
    )


_GRAPH = re.compile(r'interface\.graphCreate\(\w+, "([^"]+)"')
_OP = re.compile(r'Qnn_OpConfigV1_t \w+ = \{"[^"]*", "([^"]+)", "([^"]+)"')
_TENSOR = re.compile(r"interface\.tensorCreateGraphTensor\(")
_BUFFER = re.compile(r"_clientBuf = \{\(void\*\)\w+, (\d+)\};")
# id 0: a tensor being created; type 4: static
_CREATED_STATIC = re.compile(r"_v1 = \{0, .*\(Qnn_TensorType_t\)4,")


def graph_summary(source_c: str) -> dict:
    """What the EP made of the graph, read from the recording: QNN graph name, op types with counts,
    tensors, static (weight) bytes."""
    text = Path(source_c).read_text()
    names, weight_bytes, size = _GRAPH.findall(text), 0, 0
    for line in text.splitlines():
        found = _BUFFER.search(line)
        if found:
            size = int(found.group(1))
        elif _CREATED_STATIC.search(line):
            weight_bytes += size
    ops = collections.Counter(
        f"{package}:{op}" if package != "qti.aisw" else op for package, op in _OP.findall(text)
    )
    return {
        "graphs": len(names),
        "qnn_graph": names[0] if names else None,
        "nodes": sum(ops.values()),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "tensors": len(_TENSOR.findall(text)),
        "weight_bytes": weight_bytes,
    }
