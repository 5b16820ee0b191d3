"""The per-chip step: a graph's model library (modellib.py) -> HTP context binary + EPContext ONNX,
once per (graph, chip), read back and checked. A graph that declares `route = "ep"` is compiled from
its ONNX by the EP directly instead (one call per chip, as before the design card's route)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.ort_qnn import context, ep, families, modellib
from toolchain.engine.files import atomic_path, read_json, sha256, write_json
from toolchain.engine.run.worker import run
from toolchain.engine.state.settings import task_settings
from toolchain.errors import StageFailed
from toolchain.qnn import qnnbin
from toolchain.shared.iorecord import io_record
from toolchain.stages import Project, named, parity

if TYPE_CHECKING:   # annotations only
    from collections.abc import Callable


def tasks(project: Project) -> Iterator[dict]:
    for model, graph, chip in project.graph_chips(ep.NAME):
        tool = families.tool(chip.family)
        suffix = project.compiler(model).binary_suffix
        options = ep.graph_options(model, graph, chip)
        targets = [artifacts.context_model(model, graph, chip),
                   artifacts.context_binary(model, graph, chip, suffix),
                   artifacts.compile_record(model, graph, chip)]
        log = artifacts.compile_log(model, graph, chip)
        kwargs = {"out": targets[0], "record": targets[2], "options": options,
                  "chip": chip.record(), "precision": graph.precision,
                  "io": io_record(graph)}
        function: Callable[..., None]
        if ep.uses_route(graph):
            lib = artifacts.model_lib(model, graph, modellib.TARGET, chip.family)
            weights = artifacts.qnn_weights(model, graph, chip.family)
            converted = artifacts.stage_record(model, graph, "convert", family=chip.family)
            function, inputs = build, [lib, weights, converted]
            kwargs.update(model_lib=lib, weights=weights, converted=converted)
            # how this family's libraries and EP differ from the default's (families.toml)
            if chip.family:
                kwargs["family"] = families.table()[chip.family].replay()
            how = "from its model library"
        else:   # the direct EP compile: the settings stay exactly as they were before the route
            src = artifacts.compile_source(model, graph)
            function, inputs = build_direct, [src, artifacts.inspected(model, graph)]
            kwargs["src"] = src
            how = "EP compile (route = \"ep\")"
        yield {
            **named(model, graph, chip),
            "doc": f"{model.name}/{graph.name} -> {chip.name} (v{chip.htp_arch}) context binary, "
            f"{graph.precision}, no CPU fallback, "
            f"{how}{f', QAIRT {chip.family}' if chip.family else ''}",
            "file_dep": [*inputs, *families.tool_files(chip.family)],
            # a cache restore is used only if its binary reads back as this task's (another
            # valid binary under this task's key, e.g. another chip's, must never be
            # restored: restored() below)
            "meta": {
                **families.step_meta(chip.family),
                "restore_check": (
                    restored,
                    {
                        "binary": targets[1],
                        "context": targets[0],
                        "record": targets[2],
                        "chip": chip.record(),
                        "precision": graph.precision,
                        "io": kwargs["io"],
                    },
                ),
            },
            "task_dep": parity.gate(model, graph),
            "targets": targets + [log],
            "clean": True,
            "actions": [(run, (function, kwargs, log))],
            # the direct EP compile's settings stay exactly as they were before the route
            # (no "route" key)
            "uptodate": [
                config_changed(
                    task_settings(
                        kwargs,
                        ("options", "chip", "precision", "io", "family"),
                        {"route": "ep"},
                        tool=tool,
                        route="saver" if ep.uses_route(graph) else "ep",
                    )
                )
            ],
        }


def build(
    model_lib: str,
    weights: str,
    converted: str,
    out: str,
    record: str,
    options: dict,
    chip: dict,
    precision: str,
    io: dict,
    family: dict | None = None,
) -> None:
    """Compose the model library into libQnnHtp.so with the chip's settings (context.py), keep the
    finalized context's binary, wrap it, then prove it is what was asked for."""
    started = time.monotonic()
    replay = context.compose(
        os.path.abspath(model_lib),
        os.path.abspath(weights),
        chip,
        context.graph_settings(options),
        (family or {}).get("device_config_offset", context.DEVICE_CONFIG_OFFSET),
    )
    if replay.errors or replay.binary is None:
        raise StageFailed(f"{model_lib}: no context binary for {chip['name']}: " +
                          "; ".join(replay.errors or ["the library finalized no context"]))
    binary = os.path.join(
        os.path.dirname(out), os.path.splitext(os.path.basename(out))[0] + "_qnn.bin"
    )
    with atomic_path(binary) as tmp:
        tmp.write_bytes(replay.binary)
    info = qnnbin.binary_info(binary)
    graphs = info.get("graphs", [])
    # the EP copies the source model's into its wrapper
    metadata = read_json(converted).get("onnx_metadata", {})
    context.write_context_model(
        out,
        os.path.basename(binary),
        graphs[0]["name"] if graphs else "",
        io,
        chip,
        metadata,
        (family or {}).get("wrapper", context.WRAPPER),
    )
    _check_and_record(
        binary,
        out,
        record,
        options,
        chip,
        precision,
        io,
        info,
        round(time.monotonic() - started, 3),
        {"route": "saver", "model_lib": model_lib},
    )


def build_direct(
    src: str, out: str, record: str, options: dict, chip: dict, precision: str, io: dict
) -> None:
    """Compile in this (fresh) process with the EP, then prove the binary is what was asked for."""
    result = ep.compile(src, out, options)
    binary = result["binary"]
    _check_and_record(binary, out, record, options, chip, precision, io, qnnbin.binary_info(binary),
                      result["seconds"], {"route": "ep"})


def _check_and_record(binary, out, record, options, chip, precision, io, info, seconds, how):
    cpu = ep.context_ops(out)
    if cpu:
        raise StageFailed(f"{out}: nodes outside the HTP context: " +
                          ", ".join(f"{n or '<unnamed>'} ({op})" for n, op in cpu))
    config = qnnbin.config_fields(binary)
    problems = readback_problems(config, info, chip, precision, io)
    if problems:
        raise StageFailed(f"{binary}: the binary is not what was asked for: " + "; ".join(problems))
    write_json(
        record,
        {
            "binary": binary,
            "sha256": sha256(binary),
            "bytes": os.path.getsize(binary),
            "context_model": out,
            "context_model_sha256": sha256(out),
            "seconds": seconds,
            "options": options,
            **how,
            "config": config,
            "info": info,
            "tool": ep.version(),
        },
    )


def restored(
    staged: dict, binary: str, context: str, record: str, chip: dict, precision: str, io: dict
) -> list[str]:
    """Why restored outputs (`staged`: target -> the restored file, not yet in place) are not this
    task's: the record must name this binary and the sha256 of the binary and wrapper restored with
    it, and the binary must read back as this chip's, precision's and I/O's (as after a compile)."""
    rec = read_json(staged[record])
    found = (
        []
        if rec.get("binary") == binary
        else [f"its record is for {rec.get('binary')}, not {binary}"]
    )
    for target, field in ((binary, "sha256"), (context, "context_model_sha256")):
        if sha256(staged[target]) != rec.get(field):
            found.append(
                f"{target} has sha256 {sha256(staged[target])}, its record says {rec.get(field)}"
            )
    try:
        info = qnnbin.binary_info(staged[binary])
    except Exception as err:   # not a context binary at all
        return found + [f"{binary} does not read back ({type(err).__name__}: {err})"]
    return found + [
        f"{binary}: {p}"
        for p in readback_problems(qnnbin.config_fields(staged[binary]), info, chip, precision, io)
    ]


def readback_problems(config: dict, info: dict, chip: dict, precision: str, io: dict) -> list[str]:
    """Differences between the compiled binary and the request (the EP only warns
    on bad options)."""
    found = []
    if config.get("soc_type") != chip["name"]:
        found.append(f"soc_type {config.get('soc_type')} != {chip['name']}")
    found += qnnbin.chip_problems(config, info, chip)
    if precision == "fp16" and config.get("relaxed_precision_flag") is not True:
        found.append("relaxed_precision_flag is not set: the graph would run in fp32, not fp16")
    graphs = info.get("graphs", [])
    if len(graphs) != 1:
        found.append(
            f"{len(graphs)} graphs in the binary, expected 1 (a split graph means CPU partitions)"
        )
        return found
    for kind in ("inputs", "outputs"):
        found += io_problems(
            kind, [[t["name"], list(t["shape"]), t["dtype"]] for t in graphs[0][kind]], io[kind]
        )
    return found


def io_problems(kind: str, got: list, want: list) -> list[str]:
    """Each tensor that differs from the declaration (a runtime contract, e.g. sherpa-onnx's, is
    declared in the spec), named with what was expected and what the binary holds."""
    have, found = {t[0]: t for t in got}, []
    for name, shape, dtype in want:
        if name not in have:
            found.append(f"{kind[:-1]} {name}: expected {shape} {dtype}, not in the binary")
        elif have[name][1:] != [shape, dtype]:
            found.append(
                f"{kind[:-1]} {name}: expected {shape} {dtype}, found {have[name][1]} "
                f"{have[name][2]}"
            )
    declared = {t[0] for t in want}
    found += [f"{kind[:-1]} {n}: in the binary, not declared" for n in have if n not in declared]
    if not found and [t[0] for t in got] != [t[0] for t in want]:
        found.append(f"{kind} order {[t[0] for t in got]}, declared {[t[0] for t in want]}")
    return found
