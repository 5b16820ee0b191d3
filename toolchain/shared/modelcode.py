"""A model file (models/<module>.py) checked at load against the model-code protocol, read with ast,
never imported: a top-level function whose name is close to a hook the build calls (a typo would be
ignored, and the build would fall back to generated inputs without a word), a hook the spec's
features need and the file lacks, and a package a top-level import names that is not installed. Each
is one SpecError line naming the file, the field and the fix."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from toolchain.errors import SpecError
from toolchain.shared import modeldata

# Every function the build calls on a model file, in the order of
# toolchain.modelkit.ModelCode (the protocol, which the toolchain does not import:
# tests/test_shared_modelcode.py holds the two equal).
HOOKS = (
    "prepare_checkpoint",
    "export",
    "torch_runner",
    "reference_runner",
    "samples",
    "graph_feeds",
    "calibration_feeds",
    "stream",
    "evaluate_stream",
    "evaluate",
    "agree",
    "write_tokens",
    "graphs",
    "transcribe",
)
# difflib's ratio from which a name is taken for a misspelt hook: graph_feedz
# 0.91, make_checkpoint 0.73
CLOSE = 0.8
DOCS = 'docs/add-a-model.md, "The module"'


def check(model) -> None:
    """Refuse, in one line, what would make the build ignore the model's code or data, or fail
    a step later."""
    source = Path(model.module_file).read_bytes()
    found = modeldata.outline(source)
    if not found.parsed:
        return   # the step that imports the file names the syntax error's file and line
    _misspelt(model, found)
    _missing_packages(model, found)
    if not found.star:   # `from x import *` defines names only an import knows
        _needed(model, found.names)


def _misspelt(model, found: modeldata.Outline) -> None:
    # host steps the spec names
    own = {g.stream["step"] for g in model.graphs if "step" in g.stream}
    for name, line, hook in close_to_hooks(found):
        if name not in own:
            raise SpecError(
                f"{model.module_file}:{line}: {name}() is not a function the build calls, so it "
                "would "
                f"never run; did you mean '{hook}'? (the functions: toolchain.modelkit.ModelCode, "
                f"{DOCS}; a helper of your own: start its name with '_')"
            )


@functools.lru_cache(maxsize=64)
def close_to_hooks(found: modeldata.Outline) -> tuple[tuple[str, int, str], ...]:
    """(name, line, hook) of each public top-level function whose name is close to a hook the file
    does not define; once per source (every model of a file, and every load of the tests, asks)."""
    import difflib
    close = []
    for name, line in found.functions:
        if name in HOOKS or name.startswith("_"):
            continue
        hooks = [
            h
            for h in difflib.get_close_matches(name, HOOKS, n=1, cutoff=CLOSE)
            if h not in found.names
        ]
        close += [(name, line, hooks[0])] if hooks else []
    return tuple(close)


def _missing_packages(model, found: modeldata.Outline) -> None:
    """A top-level import of a package that is not installed: said now, not as a traceback seconds
    into a step. A file or folder beside the module is model code of its own, not a package."""
    here = Path(model.module_file).parent
    for package, line in found.imports:
        if (here / f"{package}.py").exists() or (here / package).is_dir():
            continue
        if not _installed(package):
            raise SpecError(
                f"{model.spec_file}: module: {model.module_file}:{line} imports {package}, and "
                f"{package} is not installed: pip install '{package}', and add it to the spec: "
                f'requires = ["{package}"] (checked at load, recorded in the manifest)'
            )


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):   # a module without a spec (__main__): it is there
        return True


def _needed(model, names: frozenset[str]) -> None:
    """Each hook a feature of the spec needs, present."""
    code, spec = model.module_file, model.spec_file
    for graph in model.graphs:
        if not graph.source and "export" not in names:
            raise SpecError(
                f"{spec}: graphs.{graph.name}: no source, so the model code exports it, but {code} "
                "has "
                f"no export(checkpoint, graph, out, settings) function; write it ({DOCS}), or give "
                "the "
                f"graph a source (an ONNX file or a command)"
            )
        step = graph.stream.get("step", "stream")
        if graph.stream and step not in names:
            what = (
                f"{step}(calls, sample), the host step that makes its stream from graph "
                f"{graph.stream['from']}'s "
                f"calls"
                if "from" in graph.stream
                else "stream(sample), each sample's whole input stream"
            )
            raise SpecError(
                f"{spec}: graphs.{graph.name}.stream: {code} has no {what}; write it ({DOCS})"
            )
    reference = model.parity.reference
    runner = {"torch": "torch_runner", "module": "reference_runner"}.get(reference)
    if runner and runner not in names:
        raise SpecError(
            f'{spec}: parity.reference: "{reference}" compares the ONNX with the model code\'s '
            f"{runner}(checkpoint), which {code} does not define; write it, or declare [parity] "
            f'reference = "none" (no reference)'
        )
    if model.data_dir and "samples" not in names:
        raise SpecError(
            f"{spec}: data: {code} has no samples(data_dir), so nothing would read "
            f"{model.data_dir} and "
            f"every check would run on generated inputs; write samples() ({DOCS}), or drop `data`"
        )
    per_call = [g.name for g in model.graphs if not g.stream]
    if model.data_dir and per_call and "graph_feeds" not in names:
        raise SpecError(
            f"{spec}: data: {code} has samples() but no graph_feeds(run, sample), so the tensor "
            "check of "
            f"{', '.join(per_call)} would run on generated inputs, not on your samples; write "
            f"graph_feeds() ({DOCS})"
        )
    for metric in ("evaluate", "evaluate_stream"):
        if metric in names and "agree" not in names:
            raise SpecError(
                f"{spec}: module: {code} defines {metric}() but no agree(ref, got, settings), "
                "which "
                f"compares two {metric}() results (the reference's and the candidate's); write it "
                f"({DOCS})"
            )
