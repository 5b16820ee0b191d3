"""Chip table -> htp_backend_extensions.json + htp_config.json (as sherpa-onnx's
scripts/qnn/generate_config.py writes them: docs/qairt.md), once per (graph, chip)."""
from __future__ import annotations

import json
from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.engine.files import atomic_path
from toolchain.engine.run.worker import in_process
from toolchain.qnn.sdk import Sdk
from toolchain.spec.chips import ChipRecord
from toolchain.stages import Project, named

BACKEND_EXTENSIONS, HTP_CONFIG = "htp_backend_extensions.json", "htp_config.json"


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models_of(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        for graph in model.graphs:
            # must equal the converter's graph name
            name = tools.graph_name(artifacts.qnn_cpp(model, graph))
            for chip in (project.chips[c] for c in model.chips):
                files = contents(sdk, chip.record(), name, model.compile["optimization"],
                                 artifacts.htp_config(model, graph, chip, HTP_CONFIG),
                                 artifacts.htp_config(model, graph, chip, BACKEND_EXTENSIONS))
                log = artifacts.stage_log(model, graph, "htpconfig", chip)
                yield {
                    **named(model, graph, chip),
                    "doc": f"{model.name}/{graph.name} on {chip.name}: HTP config (soc_id "
                           f"{chip.soc_model}, "
                    f"v{chip.htp_arch}, {chip.vtcm_mb} MB VTCM) for graph '{name}' [qairt "
                    f"{sdk.build_id}]",
                    "targets": list(files) + [log],
                    "clean": True,
                    "actions": [(in_process, (write, files, log))],
                    "uptodate": [
                        config_changed({"files": files, "sdk": sdk.record(), "chip": chip.record()})
                    ],
                }


def contents(
    sdk: Sdk, chip: ChipRecord, graph_name: str, optimization: int, config: str, extensions: str
) -> dict:
    """{path: text} of the two files, as generate_config.py writes them (indent 4, no trailing
    newline), but config_file_path relative to the project, where the tools run: the script makes it
    absolute, which would make the context step's inputs name this folder and never share a cache
    entry with another layout (relocatable)."""
    extensions_config = {
        "backend_extensions": {
            "shared_library_path": sdk.host_lib("libQnnHtpNetRunExtensions.so"),
            "config_file_path": config,
        }
    }
    htp = {
        "graphs": [{"vtcm_mb": chip["vtcm_mb"], "O": optimization, "graph_names": [graph_name]}],
        "devices": [
            {
                "device_id": 0,
                "soc_id": chip["soc_model"],
                "dsp_arch": f"v{chip['htp_arch']}",
                "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}],
            }
        ],
    }
    return {extensions: json.dumps(extensions_config, indent=4), config: json.dumps(htp, indent=4)}


def write(files: dict, log: str) -> None:
    for path, text in files.items():
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    with atomic_path(log) as tmp:
        tmp.write_text("".join(f"wrote {path}:\n{text}\n" for path, text in files.items()))
