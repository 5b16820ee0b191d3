"""Per (model, chip): one JSON record of what was built and measured, next to the binaries."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine.files import read_json, write_json
from toolchain.engine.run.worker import in_process
from toolchain.errors import StageFailed
from toolchain.qnn import compat
from toolchain.shared import stream
from toolchain.spec.chips import Chip
from toolchain.spec.records import Model
from toolchain.spec.table import plain
from toolchain.spec.windows import by_size
from toolchain.stages import Project, named, parity, simplify

# What the binary's own config string says about the request (the full string is in *.compile.json).
CONFIG_KEYS = ("soc_type", "arch", "vtcm_size", "relaxed_precision_flag", "OpO", "hvx_threads")
# the records every compiler's manifest reads
SECTIONS = {"parity", "exports", "inspect", "compile", "verify"}


def tasks(project: Project) -> Iterator[dict]:
    for model, chip in project.model_chips():
        sources = _sources(project, model, chip)
        meta: dict[str, Any] = {
            "model": model.name,
            "description": model.description,
            "license": dict(model.license),
            "checkpoint": {
                "origin": model.checkpoint.origin,
                "sha256": model.checkpoint.sha256,
                "format": model.checkpoint.format,
            }
            if model.checkpoint
            else {
                "origin": "the graphs' declared sources",
                "sources": {g.name: list(g.source or ()) for g in model.graphs},
            },
            "chip": {**chip.record(), "marketing": chip.marketing},
            "toolchain": model.compiler,
            "precision": {g.name: g.precision for g in model.graphs},
            "tools": {
                "simplify": simplify.tool_version(),
                "compiler": project.compiler(model).identity(chip),
            },
            "runtime_libraries": project.compiler(model).runtime_libraries(chip),
        }
        own = {g.name: plain(g.compile) for g in model.graphs if g.compile}
        # declared only: a model without them keeps its manifest (and bundles) as they were
        if own:
            meta["compile_options"] = own
        if model.requires:
            meta["tools"]["model_code"] = dict(model.requires)
        streaming = {g.name: stream.contract(g) for g in model.graphs if g.stream}
        if streaming:   # the state contract an app drives the graph with
            meta["state_contract"] = streaming
        checks = {g.name: plain(g.checks) for g in model.graphs if g.checks}
        # per-output checks as declared, with the reason an output is judged by the metric
        if checks:
            meta["output_checks"] = checks
        # which graphs run each input length, for the bundle's loop and the report
        if model.windows:
            meta["windows"] = {
                "unit": model.windows["unit"],
                "route": plain(model.windows["route"]),
                "graphs": {str(s): g for s, g in by_size(model.windows).items()},
            }
        out = artifacts.manifest(model, chip)
        yield {
            **named(model, chip=chip),
            "doc": f"{model.name} on {chip.tag}: manifest (chip, SDK build id, checksums, numbers)",
            "file_dep": [
                p
                for group in sources.values()
                for p in (group.values() if isinstance(group, dict) else [group])
            ],
            "targets": [out],
            "clean": True,
            "actions": [(in_process, (write, meta, sources, out))],
            "uptodate": [config_changed(meta)],
        }


def _sources(project: Project, model: Model, chip: Chip) -> dict:
    sources: dict = {"parity": artifacts.parity(model) if parity.available(model) else {},
               "exports": {g.name: artifacts.export_record(model, g) for g in model.graphs},
               "inspect": {g.name: artifacts.inspected(model, g) for g in model.graphs},
               "compile": {g.name: artifacts.compile_record(model, g, chip) for g in model.graphs},
               "verify": {"default": artifacts.verified(model, chip)}}
    # the rewrites applied, the nodes they replaced, and their check on the CPU
    if parity.rewritten(model):
        sources["rewrites"] = {
            g.name: artifacts.rewrites_applied(model, g) for g in model.graphs if g.rewrite
        }
        sources["rewrite_check"] = {"cpu": artifacts.rewrite_check(model)}
    # else: sherpa_full
    if project.wants_full_tier(model, chip) and not project.runtime_gate(model):
        sources["verify"]["full"] = artifacts.verified(model, chip, "full")
    # e.g. QAIRT's model-lib records
    return {**sources, **project.compiler(model).manifest_sources(model, chip)}


def write(meta: dict, sources: dict, out: str) -> None:
    # a failed verify's record is the user's, not a release's
    for tier, path in sources["verify"].items():
        if read_json(path).get("status") == "failed":
            raise StageFailed(
                f"{path}: verify ({tier} tier) failed; its record says why (failures); no manifest "
                f"is written for binaries that did not pass"
            )
    compiled = {g: read_json(p) for g, p in sources["compile"].items()}
    exports = {g: read_json(p) for g, p in sources["exports"].items()}
    first = next(iter(compiled.values()))
    record = {
        **meta,
        "soc_id": meta["chip"]["soc_model"],
        "htp_arch": f"v{meta['chip']['htp_arch']}",
        "sdk": {
            "build_id": first["info"].get("buildId"),
            "core_api": first["info"].get("coreApi"),
            "backend_api": first["info"].get("backendApi"),
            "tool": first["tool"],
        },
        "export": {
            g: {"commit": e["commit"], "settings": e["settings"], "tool": e["tool"]}
            for g, e in exports.items()
        },
        "binaries": {
            g: {
                "file": c["binary"],
                "context_model": c["context_model"],
                "sha256": c["sha256"],
                "bytes": c["bytes"],
                "compile_seconds": c["seconds"],
                "graph_name": c["info"]["graphs"][0]["name"],
                "options": c.get("options"),
                "config": {k: c["config"].get(k) for k in CONFIG_KEYS},
                "io": binary_io(c["info"]),
            }
            for g, c in compiled.items()
        },
        "graphs": {g: read_json(p) for g, p in sources["inspect"].items()},
        "parity": read_json(sources["parity"])
        if sources["parity"]
        else {"skipped": 'no PyTorch original ([parity] reference = "none")', "tensors": {}},
        "verify": {tier: read_json(p) for tier, p in sources["verify"].items()},
    }
    # What an app copies in and out per call (sherpa-onnx's QnnModel copies every tensor every call)
    record["cost"] = {
        "io_bytes_per_call": {g: io_bytes(i["io"]) for g, i in record["graphs"].items()},
        "binary_bytes": {g: b["bytes"] for g, b in record["binaries"].items()},
    }
    # a compiler's own records (Backend.manifest_sources)
    for section in sources.keys() - SECTIONS:
        record[section] = {g: read_json(p) for g, p in sources[section].items()}
    # first what a deployer needs: the build id and the QNN runtime that loads these binaries
    # (the rest sorted)
    lead = {"qnn_runtime": compat.requirement(record["sdk"]["build_id"])}
    write_json(out, {**lead, **_sorted(record)}, sort_keys=False)


def _sorted(value):
    return {k: _sorted(value[k]) for k in sorted(value)} if isinstance(value, dict) else value


def binary_io(info: dict) -> dict:
    """The compiled graph's I/O as read back from the binary: name, shape, dtype, and the scale and
    offset of a quantized (e.g. UFIXED_POINT_16) tensor, which an app must apply itself."""
    graph = info["graphs"][0]
    return {
        kind: [
            {k: t[k] for k in ("name", "shape", "dtype", "scale", "offset") if k in t}
            for t in graph[kind]
        ]
        for kind in ("inputs", "outputs")
    }


def io_bytes(interface: dict) -> int:
    """Bytes of one call's declared inputs and outputs."""
    size = {"float32": 4, "int32": 4, "float16": 2, "int64": 8, "uint8": 1, "int8": 1, "uint16": 2}
    total = 0
    for _, shape, dtype in interface["inputs"] + interface["outputs"]:
        n = 1
        for d in shape:
            n *= d
        total += n * size.get(dtype, 4)
    return total
