"""A model's data on the CPU: the files a check reads, the model code's labelled samples, the feeds
per graph and onnxruntime's CPU run of a graph (the reference every compiler is held to)."""
from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

from toolchain.errors import StageFailed

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)


def defines(module_file: str, name: str) -> bool:
    """Whether a model file defines `name` at its top level (a function, an assignment or an
    import), read with ast: doit's own process decides a task's shape from it without importing the
    model's code. A file that does not parse defines nothing here: the step that imports it names
    the file and line of the syntax error."""
    source = Path(module_file).read_bytes()
    # a name it never spells: no parse
    return name.encode() in source and name in outline(source).names


@dataclass(frozen=True)
class Outline:
    """What a model file's source holds at its top level, read with ast (never imported)."""
    # False: a syntax error (the step that imports it names file and line)
    parsed: bool
    # every name it defines: functions, assignments, imported names
    names: frozenset[str]
    functions: tuple[tuple[str, int], ...]   # (name, line) of each top-level def
    # (top-level package, line) of each absolute import at top level
    imports: tuple[tuple[str, int], ...]
    # a `from x import *`: its names are unknown without importing it
    star: bool


@functools.lru_cache(maxsize=64)
def outline(source: bytes) -> Outline:
    """A model file's top level, parsed once per source (tasks ask per model and chip: 80 parses
    were a third of a no-op `doit` of the shipped models)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Outline(False, frozenset(), (), (), False)
    functions = tuple((node.name, node.lineno) for node in tree.body
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    names = [name for name, _ in functions]
    imports: list[tuple[str, int]] = []
    star = False
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names += [
                n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)
            ]
        elif isinstance(node, ast.ImportFrom):
            names += [alias.asname or alias.name for alias in node.names]
            star = star or any(alias.name == "*" for alias in node.names)
            if node.level == 0 and node.module:
                imports.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Import):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
            imports += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
    return Outline(True, frozenset(names), functions, tuple(imports), star)


def data_files(data_dir: str | None) -> list[str]:
    """Every file of a model's data folder (a check depends on all of them)."""
    if not data_dir:
        return []
    return sorted(str(p) for p in Path(data_dir).rglob("*") if p.is_file())


def samples(module, data_dir: str | None, wanted=(), field: str = "") -> list:
    """The model's labelled samples (all, or the `wanted` ids in the declared order); item[0] is the
    id. `field` names where the ids were asked for ('models/m.toml: verify.clips')."""
    if not data_dir or not hasattr(module, "samples"):
        return []
    every = module.samples(data_dir)
    if not wanted:
        return every
    by_id = {c[0]: c for c in every}
    missing = [w for w in wanted if w not in by_id]
    if missing:
        raise StageFailed(
            f"{field or data_dir}: no sample(s) {missing} in {data_dir}; known: {sorted(by_id)}"
        )
    return [by_id[w] for w in wanted]


def feeds(module, run, sample, io: dict, count: int = 3) -> dict:
    """Inputs per graph for tensor comparisons: the model code's graph_feeds(), or, for a module
    without one, `count` seeded random feeds of the declared shapes (int32 inputs in [0, 10))."""
    import numpy as np
    if hasattr(module, "graph_feeds"):
        found = with_io(module.graph_feeds, io)(run, sample)
        missing = [g for g in io if not found.get(g)]
        if missing:  # else that graph would get no per-call check at all, silently
            raise StageFailed(
                f"{module.__file__}: graph_feeds() returned no feeds for graph(s) "
                f"{', '.join(missing)}: "
                "every graph is checked per call, so return a few calls' feeds for each (for a "
                "stream "
                f"graph: calls of its stream), or drop graph_feeds() to let the build make them"
            )
        return found
    rng = np.random.default_rng(0)

    def one(name, shape, dtype):
        if dtype == "int32":
            return rng.integers(0, 10, size=shape, dtype=np.int32)
        return rng.standard_normal(shape).astype(dtype)

    return {
        g: [{n: one(n, s, d) for n, s, d in spec["inputs"]} for _ in range(count)]
        for g, spec in io.items()
    }


def with_io(function, io: dict):
    """The model code's function, given the declared graph interface (`io`) when it asks for it by
    name: code whose tensor names come from the spec (sherpa-onnx's '<prefix>_mel') needs them."""
    if "io" in inspect.signature(function).parameters:
        return lambda *args: function(*args, io=io)
    return function


def cpu(onnx_model: str):
    """Run(feeds) for an ONNX model on onnxruntime's CPU provider: the reference every compiler
    is held to."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(onnx_model, sess_options=so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))
