"""Context binary -> read-back record: build id, graph name, chip and I/O as the SDK reads
them from the binary (qnn-context-binary-utility, else libQnnSystem through qnnbin), once
per (graph, chip)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.engine.files import read_json, sha256, write_json
from toolchain.engine.run import external
from toolchain.engine.run.worker import in_process
from toolchain.errors import StageFailed
from toolchain.qnn import qnnbin
from toolchain.qnn.layout import layout_permutation
from toolchain.shared.iorecord import io_record
from toolchain.stages import Project, named

KINDS = {
    "FLOAT": "float",
    "INT": "int",
    "UINT": "uint",
    "UFIXED_POINT": "ufixed",
    "SFIXED_POINT": "sfixed",
}


def tasks(project: Project) -> Iterator[dict]:
    for model, graph, chip in project.graph_chips(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        binary, context = (artifacts.context_binary(model, graph, chip, compiler.binary_suffix),
                           artifacts.stage_record(model, graph, "context", chip))
        out, log = (
            artifacts.compile_record(model, graph, chip),
            artifacts.stage_log(model, graph, "readback", chip),
        )
        raw = artifacts.stage_record(model, graph, "binary_info", chip)
        reader = tools.utility_argv(sdk, binary, raw) if sdk.has_utility() else None
        expected = {
            "graph_name": tools.graph_name(artifacts.qnn_cpp(model, graph)),
            "build_id": sdk.build_id,
            "exact_build_id": not sdk.build_id_source.startswith("FALLBACK"),
            "chip": chip.record(),
            "io": io_record(graph),
            "view": compiler.runtime_view(graph),
        }
        kwargs = {
            "binary": binary,
            "context": context,
            "reader": reader,
            "env": tools.env(sdk),
            "lib_dir": f"{sdk.root}/lib/{tools.HOST}",
            "raw": raw,
            "expected": expected,
            "sdk": sdk.record(),
            "out": out,
            "log": log,
        }
        yield {
            **named(model, graph, chip),
            "doc": f"{model.name}/{graph.name} on {chip.name}: read the binary back ("
            f"{'qnn-context-binary-utility' if reader else 'libQnnSystem'}): build id, graph "
            f"'{expected['graph_name']}', chip, I/O [qairt {sdk.build_id}]",
            "file_dep": [binary, context],
            "targets": [out, log] + ([raw] if reader else []),
            "clean": True,
            "actions": [(in_process, (check,), kwargs)],
            "uptodate": [
                config_changed(
                    {"expected": expected, "reader": reader or "qnnbin", "sdk": sdk.record()}
                )
            ],
        }


def check(binary, context, reader, env, lib_dir, raw, expected, sdk, out, log):
    if reader:
        failed = external.run(reader, env, log, [raw])
        if failed:
            return failed
        info = from_utility(read_json(raw))
    else:
        code = ("import json, sys; from toolchain.qnn import qnnbin; "
                "print(json.dumps(qnnbin.binary_info(*sys.argv[1:])))")
        done = subprocess.run(
            [sys.executable, "-c", code, binary, lib_dir], capture_output=True, text=True
        )
        with open(log, "w") as f:
            f.write(f"qnnbin.binary_info({binary}, {lib_dir})\n{done.stdout}{done.stderr}")
        if done.returncode:
            raise StageFailed(
                f"{binary}: libQnnSystem cannot read it; log {log}, last "
                f"lines:\n{external.tail(log)}"
            )
        info = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        # clear-text HTP config string, when the binary has one
        config = qnnbin.config_fields(binary)
    except ValueError:
        config = {}
    problems = readback_problems(info, config, expected)
    with open(log, "a") as f:
        f.write(json.dumps({"info": info, "config": config, "problems": problems}, indent=2) + "\n")
    if problems:
        raise StageFailed(f"{binary}: the binary is not what was asked for: " + "; ".join(problems))
    ran = read_json(context)
    write_json(
        out,
        {
            "binary": binary,
            "sha256": sha256(binary),
            "bytes": os.path.getsize(binary),
            "seconds": ran["seconds"],
            "argv": ran["argv"],
            "context_model": None,
            "config": config,
            "info": info,
            "reader": "qnn-context-binary-utility" if reader else "libQnnSystem (qnnbin)",
            "tool": sdk,
        },
    )


def from_utility(data: dict) -> dict:
    """qnn-context-binary-utility's JSON -> the shape qnnbin.binary_info returns."""
    info = data["info"]

    def tensors(items):
        return [{"name": t["info"]["name"], "dtype": dtype(t["info"]["dataType"]),
                 "shape": list(t["info"]["dimensions"]), **quantization(t["info"])} for t in items]
    return {
        "buildId": info.get("buildId"),
        "socModel": info.get("socModel"),
        "graphs": [
            {
                "name": g["info"]["graphName"],
                "inputs": tensors(g["info"]["graphInputs"]),
                "outputs": tensors(g["info"]["graphOutputs"]),
            }
            for g in info.get("graphs", [])
        ],
    }


def quantization(tensor: dict) -> dict:
    """{"scale", "offset"} of a scale/offset-quantized tensor (UFIXED_POINT_16 I/O of
    a calibrated graph)."""
    params = tensor.get("quantizeParams") or {}
    so = params.get("scaleOffset") or params.get("bwScaleOffset")
    if "DEFINED" not in str(params.get("definition", "")).replace("UNDEFINED", "") or not so:
        return {}
    return {"scale": float("%.9g" % so["scale"]), "offset": int(so["offset"])}


def dtype(value: int | str) -> str:
    """'QNN_DATATYPE_FLOAT_32' (or the numeric Qnn_DataType_t) -> 'float32'."""
    if isinstance(value, int):
        return qnnbin.DTYPES.get(value, "0x%04x" % value)
    m = re.fullmatch(r"QNN_DATATYPE_([A-Z_]+?)_(\d+)", value)
    return f"{KINDS.get(m.group(1), m.group(1).lower())}{m.group(2)}" if m else value.lower()


def readback_problems(info: dict, config: dict, expected: dict) -> list[str]:
    """Differences between what the binary says and what was asked for; empty when it matches."""
    found, chip = [], expected["chip"]
    got_id, want_id = info.get("buildId") or "", expected["build_id"]
    if (got_id != want_id) if expected["exact_build_id"] else (want_id not in got_id):
        found.append(f"build id {got_id!r} is not the SDK's {want_id!r}: built by another SDK")
    names = [g["name"] for g in info.get("graphs", [])]
    if names != [expected["graph_name"]]:
        found.append(
            f"graphs {names}, expected ['{expected['graph_name']}'] (the converter's name for it)"
        )
    found += qnnbin.chip_problems(config, info, chip, given_only=True)
    for graph in info.get("graphs", [])[:1]:
        for kind in ("inputs", "outputs"):
            # names and dtypes as the runtime sees them (the converter's); shapes in any layout
            # it may give
            for got, (_, shape, _), (name, _, dt) in zip(
                graph[kind], expected["io"][kind], expected["view"][kind]
            ):
                if (
                    got["name"] != name
                    or got["dtype"] != dt
                    or layout_permutation(shape, got["shape"]) is None
                ):
                    found.append(
                        f"{kind[:-1]} {got['name']} {got['shape']} {got['dtype']} != expected "
                        f"{name} {shape} "
                        f"{dt} (or that shape in the converter's layout)"
                    )
                elif dt.startswith(("ufixed", "sfixed")) and "scale" not in got:
                    found.append(
                        f"{kind[:-1]} {name}: {dt} without a scale and offset: an app could not "
                        "read it"
                    )
            if len(graph[kind]) != len(expected["io"][kind]):
                found.append(f"{len(graph[kind])} {kind}, declared {len(expected['io'][kind])}")
    return found
