"""Simplified ONNX -> HTP context binary, once per (graph, chip), read back and checked."""
from __future__ import annotations

from doit.tools import config_changed

from toolchain.backends.ort_qnn import ep
from toolchain.engine import paths
from toolchain.engine.files import sha256, write_json
from toolchain.engine.worker import StageFailed, run
from toolchain.qnn import qnnbin
from toolchain.stages import parity

MIB = 1 << 20


def tasks(project):
    tool = ep.version()
    for model, graph, chip in project.graph_chips(ep.NAME):
        options = model.backend.options(model, graph, chip)
        src = paths.compile_source(model, graph)
        targets = [paths.context_model(model, graph, chip), paths.context_binary(model, graph, chip),
                   paths.compile_record(model, graph, chip)]
        log = paths.compile_log(model, graph, chip)
        kwargs = {"src": src, "out": targets[0], "record": targets[2], "options": options,
                  "chip": chip.record(), "precision": graph.precision,
                  "io": {"inputs": [[t.name, list(t.shape), t.dtype] for t in graph.inputs],
                         "outputs": [[t.name, list(t.shape), t.dtype] for t in graph.outputs]}}
        yield {"name": f"{model.name}/{graph.name}@{chip.name}",
               "doc": f"{model.name}/{graph.name} -> {chip.name} (v{chip.htp_arch}) context binary, "
                      f"{graph.precision}, no CPU fallback",
               "file_dep": [src, paths.inspected(model, graph), *model.backend.tool_files()],
               "task_dep": parity.gate(model), "targets": targets + [log], "clean": True,
               "actions": [(run, (build, kwargs, log))],
               "uptodate": [config_changed({"options": options, "tool": tool, "chip": chip.record(),
                                            "precision": graph.precision, "io": kwargs["io"]})]}


def build(src: str, out: str, record: str, options: dict, chip: dict, precision: str, io: dict):
    """Compile in this (fresh) process, then prove the binary is what was asked for."""
    result = ep.compile(src, out, options)
    binary = result["binary"]
    cpu = ep.context_ops(out)
    if cpu:
        raise StageFailed(f"{out}: nodes outside the HTP context: " +
                          ", ".join(f"{n or '<unnamed>'} ({op})" for n, op in cpu))
    config = qnnbin.config_fields(binary)
    info = qnnbin.binary_info(binary)
    problems = readback_problems(config, info, chip, precision, io)
    if problems:
        raise StageFailed(f"{binary}: the binary is not what was asked for: " + "; ".join(problems))
    write_json(record, {"binary": binary, "sha256": sha256(binary), "bytes": _size(binary),
                        "context_model": out, "context_model_sha256": sha256(out), "seconds": result["seconds"], "options": options,
                        "config": config, "info": info, "tool": ep.version()})


def readback_problems(config: dict, info: dict, chip: dict, precision: str, io: dict) -> list[str]:
    """Differences between the compiled binary and the request (the EP only warns on bad options)."""
    found = []
    if config.get("soc_type") != chip["name"]:
        found.append(f"soc_type {config.get('soc_type')} != {chip['name']}")
    if config.get("arch") != chip["htp_arch"]:
        found.append(f"arch {config.get('arch')} != {chip['htp_arch']}")
    if config.get("vtcm_size") != chip["vtcm_mb"] * MIB:
        found.append(f"vtcm_size {config.get('vtcm_size')} != {chip['vtcm_mb']} MiB")
    if precision == "fp16" and config.get("relaxed_precision_flag") is not True:
        found.append("relaxed_precision_flag is not set: the graph would run in fp32, not fp16")
    if info.get("socModel") != chip["soc_model"]:
        found.append(f"socModel {info.get('socModel')} != {chip['soc_model']}")
    graphs = info.get("graphs", [])
    if len(graphs) != 1:
        found.append(f"{len(graphs)} graphs in the binary, expected 1 (a split graph means CPU partitions)")
        return found
    for kind in ("inputs", "outputs"):
        found += io_problems(kind, [[t["name"], list(t["shape"]), t["dtype"]] for t in graphs[0][kind]], io[kind])
    return found


def io_problems(kind: str, got: list, want: list) -> list[str]:
    """Each tensor that differs from the declaration (a runtime contract, e.g. sherpa-onnx's, is declared
    in the spec), named with what was expected and what the binary holds."""
    have, found = {t[0]: t for t in got}, []
    for name, shape, dtype in want:
        if name not in have:
            found.append(f"{kind[:-1]} {name}: expected {shape} {dtype}, not in the binary")
        elif have[name][1:] != [shape, dtype]:
            found.append(f"{kind[:-1]} {name}: expected {shape} {dtype}, found {have[name][1]} {have[name][2]}")
    declared = {t[0] for t in want}
    found += [f"{kind[:-1]} {n}: in the binary, not declared" for n in have if n not in declared]
    if not found and [t[0] for t in got] != [t[0] for t in want]:
        found.append(f"{kind} order {[t[0] for t in got]}, declared {[t[0] for t in want]}")
    return found


def _size(path: str) -> int:
    import os
    return os.path.getsize(path)
