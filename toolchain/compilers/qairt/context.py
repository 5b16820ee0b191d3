"""x86_64 model lib + HTP config -> context binary (qnn-context-binary-generator), once
per (graph, chip)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.compilers.qairt.htpconfig import BACKEND_EXTENSIONS, HTP_CONFIG
from toolchain.engine.run import external
from toolchain.stages import Project, named


def tasks(project: Project) -> Iterator[dict]:
    for model, graph, chip in project.graph_chips(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        lib = artifacts.model_lib(model, graph, tools.HOST)
        extensions = artifacts.htp_config(model, graph, chip, BACKEND_EXTENSIONS)
        binary = artifacts.context_binary(model, graph, chip, compiler.binary_suffix)
        log, record = (artifacts.stage_log(model, graph, "context", chip),
                       artifacts.stage_record(model, graph, "context", chip))
        argv = tools.context_argv(sdk, lib, str(Path(binary).parent), Path(binary).stem, extensions)
        env = tools.env(sdk)
        yield {
            **named(model, graph, chip),
            "doc": f"{model.name}/{graph.name} -> {chip.name} (v{chip.htp_arch}) context binary, "
            f"qnn-context-binary-generator [qairt {sdk.build_id}]",
            "file_dep": [
                lib,
                extensions,
                artifacts.htp_config(model, graph, chip, HTP_CONFIG),
                *compiler.tool_files(),
            ],
            "targets": [binary, record, log],
            "clean": True,
            "actions": [(external.action, (argv, env, log, [binary], record))],
            "uptodate": [
                config_changed(
                    {"argv": argv, "env": env, "sdk": sdk.record(), "chip": chip.record()}
                )
            ],
        }
