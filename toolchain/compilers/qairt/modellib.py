"""QNN graph C++ + weights -> model libs (qnn-model-lib-generator), once per graph,
never per chip."""
from __future__ import annotations

from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.compilers.qairt import tools
from toolchain.engine.run import external
from toolchain.stages import Project, named


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models_of(tools.NAME):
        compiler = project.compiler(model)
        sdk = tools.sdk_of(compiler)
        targets = tools.model_lib_targets(sdk, model.compile["android_libs"])
        for graph in model.graphs:
            cpp, weights = artifacts.qnn_cpp(model, graph), artifacts.qnn_weights(model, graph)
            libs = [artifacts.model_lib(model, graph, t) for t in targets]
            log, record = (artifacts.stage_log(model, graph, "modellib"),
                           artifacts.stage_record(model, graph, "modellib"))
            argv = tools.modellib_argv(
                sdk, cpp, weights, artifacts.model_libs_dir(model, graph), targets
            )
            env = tools.env(sdk, ldflags=True)
            only = "" if tools.ANDROID in targets else f", {tools.HOST} only (no ndk-build)"
            yield {
                **named(model, graph),
                "doc": f"{model.name}/{graph.name}: qnn-model-lib-generator -> lib{graph.name}.so "
                f"({', '.join(targets)}){only} [qairt {sdk.build_id}]",
                "file_dep": [cpp, weights],
                "targets": libs + [record, log],
                "clean": True,
                "actions": [(external.action, (argv, env, log, libs, record))],
                "uptodate": [
                    config_changed(
                        {
                            "argv": argv,
                            "env": env,
                            "sdk": sdk.record(),
                            "targets": targets,
                            "ndk_build": sdk.ndk_build if tools.ANDROID in targets else None,
                        }
                    )
                ],
            }
