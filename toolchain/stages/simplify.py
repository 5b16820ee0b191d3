"""Exported ONNX -> onnxsim-simplified ONNX, once per graph; then the spec's legalizing
rewrites, if it declares any (toolchain/rewrites: the unrewritten graph is kept beside it, for
the rewrite stage's check)."""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import versions
from toolchain.engine.files import atomic_path, write_json
from toolchain.engine.run.worker import run
from toolchain.engine.state.settings import task_settings
from toolchain.errors import StageFailed
from toolchain.rewrites import library as rewrites
from toolchain.spec.table import plain
from toolchain.stages import Project, named
from toolchain.stages.export import onnx_or_fail

REWRITE_CODE = sorted(
    str(p) for p in Path(rewrites.__file__).parent.glob("*.*") if p.suffix in (".py", ".toml")
)


def tasks(project: Project) -> Iterator[dict]:
    tool = tool_version()
    for model in project.models:
        for graph in model.graphs:
            src, out = artifacts.exported(model, graph), artifacts.simplified(model, graph)
            log = artifacts.simplify_log(model, graph)
            kwargs, deps, targets = {"src": src, "out": out}, [src], [out, log]
            if graph.rewrite:
                extra = [
                    artifacts.unrewritten(model, graph),
                    artifacts.rewrites_applied(model, graph),
                ]
                kwargs.update(rewrite=plain(graph.rewrite), unrewritten=extra[0], record=extra[1])
                deps, targets = deps + REWRITE_CODE, targets + extra
            # a graph without rewrites keeps its settings (nothing rebuilds)
            settings = task_settings(kwargs, ("rewrite",), {"rewrite": ()}, tool=tool)
            yield {**named(model, graph),
                   "doc": f"{model.name}/{graph.name}: onnxsim (constant folding, shape inference)"
                          + (f", rewrites {_shown(graph.rewrite)}" if graph.rewrite else ""),
                   "file_dep": deps, "targets": targets, "clean": True,
                   "actions": [(run, (simplify, kwargs, log))],
                   "uptodate": [config_changed(settings)]}


def _shown(rewrite: str | Sequence[str]) -> str:
    return rewrite if isinstance(rewrite, str) else ", ".join(rewrite)


def tool_version() -> dict:
    return {"onnxsim": versions.version("onnxsim"), "onnx": versions.version("onnx")}


def simplify(
    src: str,
    out: str,
    rewrite: str | Sequence[str] = (),
    unrewritten: str = "",
    record: str = "",
) -> None:
    import onnx
    import onnxsim
    onnx_or_fail(src, f"{src} is")
    started = time.monotonic()
    model, ok = onnxsim.simplify(onnx.load(src))
    # the tool's own time (bench/overhead.py)
    print(f"onnxsim: {time.monotonic() - started:.2f} s")
    if not ok:
        raise StageFailed(f"{src}: onnxsim could not validate the simplified model")
    print(
        f"nodes: {len(onnx.load(src, load_external_data=False).graph.node)} -> "
        f"{len(model.graph.node)}"
    )
    if rewrite:
        with atomic_path(unrewritten) as tmp:
            onnx.save(model, str(tmp))
        applied = rewrites.apply(model, rewrite if isinstance(rewrite, str) else tuple(rewrite))
        for a in applied:
            print(f"rewrite {a['rewrite']}: {len(a['nodes'])} node(s): {', '.join(a['nodes'])}")
        print(
            f"rewrites ({_shown(rewrite)}): {len(applied)} applied; nodes now "
            f"{len(model.graph.node)}"
        )
        write_json(record, {"declared": rewrite, "applied": applied})
    with atomic_path(out) as tmp:
        onnx.save(model, str(tmp))
