"""The oracle of the design card's route (on demand: `doit oracle`, `doit
oracle:<model>/<graph>@<CHIP>`): the EP compiles the same ONNX with the same options directly, in a
fresh interpreter, into a scratch folder; the route's binary must be byte-identical and its
EPContext wrapper must carry the same node and metadata. A difference fails in one line naming the
graph and chip, and the record says what differed: nothing differing ships silently once the oracle
has run (it costs one more compile per graph and chip, so it is not part of a plain `doit`).

Measured: the HTP compiler itself is not byte-reproducible for some graphs (Whisper tiny.en's
encoders: two EP compiles of the same ONNX in fresh processes differ in ~500 bytes of an fp16 table;
docs/design-card.md). For those the EP is asked up to TRIES times: the route's bytes equal to one of
them is identity; otherwise the record says "compiler-not-reproducible" with the sizes and byte
counts, and the config string and graph I/O must agree."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import ep, families
from toolchain.engine.files import write_json
from toolchain.engine.run.worker import run
from toolchain.errors import StageFailed
from toolchain.qnn import qnnbin
from toolchain.spec.chips import Chip
from toolchain.spec.records import Graph, Model
from toolchain.stages import Project, named

if TYPE_CHECKING:   # annotations only: onnx is imported where used
    import onnx


def record_path(model: Model, graph: Graph, chip: Chip) -> str:
    return f"{artifacts.chip_dir(model, chip)}/{graph.name}.oracle.json"


def tasks(project: Project) -> Iterator[dict]:
    for model, graph, chip in project.graph_chips(ep.NAME):
        tool = families.tool(chip.family)
        if not ep.uses_route(graph):
            continue
        suffix = project.compiler(model).binary_suffix
        options = ep.graph_options(model, graph, chip)
        src = artifacts.compile_source(model, graph)
        ctx, binary = (
            artifacts.context_model(model, graph, chip),
            artifacts.context_binary(model, graph, chip, suffix),
        )
        record, log = (
            record_path(model, graph, chip),
            f"{artifacts.chip_dir(model, chip)}/{graph.name}.oracle.log",
        )
        kwargs = {"src": src, "ctx": ctx, "binary": binary, "options": options, "record": record,
                  "label": f"{model.name}/{graph.name}@{chip.tag}"}
        yield {
            **named(model, graph, chip),
            "doc": f"{model.name}/{graph.name}@{chip.tag}: the route's binary == the EP's direct "
                   "compile (md5)",
            "file_dep": [src, ctx, binary, *families.tool_files(chip.family)],
            "meta": families.step_meta(chip.family),
            "targets": [record, log],
            "clean": True,
            "actions": [(run, (check, kwargs, log))],
            "uptodate": [config_changed({"options": options, "tool": tool})],
        }


# EP compiles at most, each in a fresh process, before calling the compiler itself unreproducible
TRIES = 3


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _ep_compile(src: str, out: str, options: dict) -> dict:
    """One direct EP compile into `out`, always in a new interpreter: the EP's bytes depend
    on how many sessions its process made before (a step's own process may have made one, a
    test process many)."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, src, out, json.dumps(options)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise StageFailed(
            f"{src}: a repeated EP compile failed: {(done.stderr or done.stdout).strip()[-300:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _agree(binaries: list[str]) -> bool:
    """What must agree even where the compiler is not byte-reproducible: the graph I/O and every
    config-string field all of them carry (not the size: the EP's own compiles of a Whisper
    encoder differ by a few 4 KiB pages; nor a stray `X=...;` the reader finds in the varying
    bytes of one of them)."""
    configs = [qnnbin.config_fields(b) for b in binaries]
    common = set.intersection(*(set(c) for c in configs))
    graphs = [qnnbin.binary_info(b)["graphs"] for b in binaries]
    return all(g == graphs[0] for g in graphs) and all(
        {k: c[k] for k in common} == {k: configs[0][k] for k in common} for c in configs
    )


def _differing(a: str, b: str) -> int | None:
    """Bytes that differ between two files of one size (None: sizes differ)."""
    x, y = Path(a).read_bytes(), Path(b).read_bytes()
    if len(x) != len(y):
        return None
    return sum(1 for i, j in zip(x, y) if i != j) if len(x) < (64 << 20) else int(x != y)


def check(src: str, ctx: str, binary: str, options: dict, record: str, label: str) -> None:
    """The route's binary must equal one of the EP's. The EP is asked again (fresh processes, up to
    TRIES) while its compiles differ from the route's; when the EP's own compiles differ among
    themselves the compiler is not byte-reproducible for this graph, and then size, config string
    and graph I/O must still agree."""
    import onnx
    scratch = os.path.join(os.path.dirname(record), f".oracle-{os.path.basename(binary)}")
    shutil.rmtree(scratch, ignore_errors=True)
    ours, started = _md5(binary), time.monotonic()
    ep_md5s, seconds, kept = [], [], []
    try:
        for attempt in range(TRIES):
            out = os.path.join(scratch, str(attempt), os.path.basename(ctx))
            direct = _ep_compile(src, out, options)
            ep_md5s.append(_md5(direct["binary"]))
            seconds.append(direct["seconds"])
            kept.append(direct["binary"])
            if attempt == 0:
                wrapper = [_node(onnx.load(p)) for p in (ctx, out)]
            if ep_md5s[-1] == ours or (len(ep_md5s) > 1 and len(set(ep_md5s)) == 1):
                break   # found, or the EP reproduces itself (and not the route)
        identical = ours in ep_md5s
        reproducible = len(set(ep_md5s)) == 1
        status = (
            "identical"
            if identical
            else ("differs" if reproducible else "compiler-not-reproducible")
        )
        found = {
            "route_md5": ours,
            "ep_md5": ep_md5s[0],
            "ep_md5s": ep_md5s,
            "identical": identical,
            "status": status,
            "wrapper_identical": wrapper[0] == wrapper[1],
            "ep_seconds": seconds[0],
            "options": options,
        }
        if status == "compiler-not-reproducible":
            found["bytes_differing"] = {"route_vs_ep": _differing(binary, kept[0]),
                                        "ep_vs_ep": _differing(kept[0], kept[1])}
            found["sizes"] = {
                "route": os.path.getsize(binary),
                "ep": [os.path.getsize(k) for k in kept],
            }
            found["same_config_and_io"] = _agree([binary, *kept])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    found["seconds"] = round(time.monotonic() - started, 3)
    write_json(record, found)
    if status == "differs":
        raise StageFailed(
            f"{label}: the route's binary differs from the EP's direct compile (md5 {ours} != "
            f'{ep_md5s[0]}, which the EP reproduces); declare route = "ep" for this graph until '
            'the '
            f"route reproduces it"
        )
    if status == "compiler-not-reproducible" and not found["same_config_and_io"]:
        raise StageFailed(
            f"{label}: the route's binary differs from {len(ep_md5s)} EP compiles (which differ "
            "among "
            f"themselves too) in its config string or graph I/O"
        )
    if not found["wrapper_identical"]:
        differ = sorted(k for k in wrapper[0] if wrapper[0][k] != wrapper[1][k])
        raise StageFailed(
            f"{label}: the route's EPContext wrapper differs from the EP's in {', '.join(differ)}: "
            + "; ".join(_differences(wrapper[0], wrapper[1]))
        )


def _differences(ours: dict, theirs: dict, where: str = "") -> list[str]:
    """'metadata.ep_compatibility_info...: route 'v2:...' != EP '6:...'' for every
    field that differs."""
    found = []
    for k in sorted(set(ours) | set(theirs)):
        a, b = ours.get(k, "(absent)"), theirs.get(k, "(absent)")
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{where}{k}.")
        elif a != b:
            found.append(f"{where}{k}: route {a!r} != EP {b!r}")
    return found


def _node(model: onnx.ModelProto) -> dict:
    """What a runtime reads of an EPContext model: the node (name, attributes, I/O),
    I/O types, metadata."""
    from onnx import helper
    node = model.graph.node[0]
    return {
        "name": node.name,
        "op": node.op_type,
        "domain": node.domain,
        "inputs": list(node.input),
        "outputs": list(node.output),
        "attributes": {a.name: helper.get_attribute_value(a) for a in node.attribute},
        "io": [str(v.type) for v in [*model.graph.input, *model.graph.output]],
        "metadata": {p.key: p.value for p in model.metadata_props},
    }


# one more EP compile in a fresh interpreter: src out options-json -> {"binary", "seconds"}
if __name__ == "__main__":
    print(json.dumps(ep.compile(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
