"""Measure the shape of toolchain/: import cycles, imports that go up between wings, imports hidden
in functions, functions named by strings, branches on a compiler's name, places that list the
stages, an engine that reads something of a model or QNN, a compiler imported by name outside
compilers/, import hooks, and the model-code API imported by the toolchain itself, and loads that
would unpickle (run) what a file says: torch.load without weights_only=True, numpy.load with
allow_pickle=True, pickle/dill/joblib loads (in toolchain/ and models/: anything a step loads may
come from a shared cache; docs/scale.md, "Trust"); functions called on a model file that
modelkit.ModelCode does not list, model code (models/, test fixtures) importing more of the
toolchain than modelkit, re-export shims, and private names (a leading underscore) one toolchain
module takes from another.

    python tests/architecture.py [ROOT]    # prints the counts as JSON (ROOT: a checkout,
    default this one)

tests/test_architecture.py asserts them; it also runs on the flat tree of older
commits (the "before")."""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

COMPILERS = ("ort-qnn", "qairt")
STAGES = (
    "checkpoint",
    "export",
    "simplify",
    "inspect",
    "parity",
    "calibrate",
    "quantize",
    "convert",
    "modellib",
    "pagesize",
    "htpconfig",
    "context",
    "readback",
    "compile",
    "verify",
    "verify_full",
    "manifest",
    "runtime",
    "bundle",
    "sherpa",
    "sherpa_full",
    "report",
    "chip_index",
    "device",
    "step0",
)
LISTS_STAGES = 8   # a file naming this many stages is a list of them
# Wing -> the wings it may import (lower layers only). The top-level modules (pipeline,
# project) join them.
MAY_IMPORT = {
    "spec": set(),
    "engine": set(),
    "qnn": {"engine"},
    "rewrites": set(),
    "shared": {"spec", "engine"},
    "stages": {"spec", "engine", "qnn", "shared", "rewrites"},
    "compilers": {"spec", "engine", "qnn", "shared", "stages", "rewrites"},
    "deploy": {"spec", "engine", "qnn", "shared", "stages", "rewrites"},
    "phone": {"spec", "engine", "qnn", "shared", "stages", "compilers", "deploy", "rewrites"},
}
ENGINE_MAY_USE = {"toolchain.errors"}   # outside engine/: the exception types only
# What a model or QNN is made of: packages the engine must not import, words its strings must not
# say (docstrings and comments may explain; $QNN_* variables are the project's name, not QNN's).
MODEL_PACKAGES = (
    "onnx",
    "onnxruntime",
    "onnxruntime_qnn",
    "torch",
    "onnxsim",
    "onnxscript",
    "numpy",
)
QNN_WORDS = re.compile(r"(?i)qnn|htp|onnx|torch|qairt|hexagon|snapdragon|\bsoc\b")
PROJECT_VARIABLE = re.compile(r"^QNN_[A-Z_]+$")
# The compilers' own code: no module outside compilers/ (but the registry's users) imports
# one by name.
REGISTRY_USERS = {"toolchain.pipeline", "toolchain.project", "toolchain.options"}
# for models/*.py (and only this): the toolchain itself never imports it
MODEL_API = {"toolchain.modelkit"}
FUNCTION_STRING = re.compile(r"^toolchain(\.\w+)+:\w+$")


def named_by_fstring(node: ast.JoinedStr) -> bool:
    """f"{__name__}:restored": a function named by a string built at run time from
    its module's name."""
    parts = node.values
    return any(
        isinstance(a, ast.FormattedValue)
        and ast.unparse(a.value) == "__name__"
        and isinstance(b, ast.Constant)
        and isinstance(b.value, str)
        and re.fullmatch(r":\w+", b.value)
        for a, b in zip(parts, parts[1:])
    )


def modules(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of the toolchain package."""
    found = {}
    for path in sorted((root / "toolchain").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> list[tuple[str, bool]]:
    """(imported toolchain module, inside a function?) for every import in one module, one under `if
    TYPE_CHECKING:` included: a tie a type needs is a tie of the house (a stage's `project: Project`
    is imported from the stage contract below it, at run time)."""
    tree = ast.parse(path.read_text())
    in_function = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(f)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "toolchain"
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub if sub in known else node.module, id(node) in in_function))
        elif isinstance(node, ast.Import):
            found += [
                (a.name, id(node) in in_function)
                for a in node.names
                if a.name.split(".")[0] == "toolchain"
            ]
    return [(target, hidden) for target, hidden in found if target in known and target != name]


def package_imports(path: Path) -> set[str]:
    """Top-level names of the packages outside the toolchain a module imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found - {"toolchain"}


def strings_naming_qnn(path: Path) -> list[int]:
    """Lines of string constants (not docstrings, not $QNN_* names) that say a QNN or model word."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and QNN_WORDS.search(n.value)
        and not PROJECT_VARIABLE.match(n.value)
    ]


def import_hooks(path: Path) -> bool:
    """Whether a module changes how imports resolve (a sys.meta_path / sys.path_hooks finder)."""
    return any(isinstance(n, ast.Attribute) and n.attr in ("meta_path", "path_hooks")
               for n in ast.walk(ast.parse(path.read_text())))


def cycles(graph: dict[str, set]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else None


def compiler_branches(path: Path) -> list[int]:
    """Lines comparing something with a compiler's name ("qairt", ort_qnn.NAME, ...)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any((isinstance(o, ast.Constant) and o.value in COMPILERS) or
                   (isinstance(o, ast.Attribute) and o.attr == "NAME") for o in operands):
                lines.append(node.lineno)
    return lines


def stages_named(path: Path) -> set[str]:
    """Stage names a file spells out: as strings, or as doit task creators (def task_<stage>)."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in STAGES:
            named.add(node.value)
        elif (
            isinstance(node, ast.FunctionDef)
            and node.name.startswith("task_")
            and node.name[5:] in STAGES
        ):
            named.add(node.name[5:])
    return named


# the separators of a task name: `<model>/<graph>@<CHIP>+qairt<family>`
NAME_SEPARATORS = ("@", "+", "+qairt")


def names_parsed(path: Path) -> list[int]:
    """Lines that cut a string at a task name's chip or family separator (`name.partition("@")`):
    whom a task is for is its owner (stages.named, task meta), never read back out of its name."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("partition", "rpartition", "split", "rsplit")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in NAME_SEPARATORS
    ]


UNPICKLERS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("joblib", "load"),
    ("cloudpickle", "load"),
    ("cloudpickle", "loads"),
    ("pickle", "Unpickler"),
}


def unsafe_loads(path: Path) -> list[int]:
    """Lines that load a file in a way that can run code it holds."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)):
            continue
        owner, name = node.func.value.id, node.func.attr
        keywords = {k.arg: k.value for k in node.keywords}

        def says(key, value):
            return isinstance(keywords.get(key), ast.Constant) and keywords[key].value is value
        if (owner, name) == ("torch", "load") and not says("weights_only", True):
            found.append(node.lineno)
        elif (
            owner in ("np", "numpy")
            and name == "load"
            and "allow_pickle" in keywords
            and not says("allow_pickle", False)
        ):
            found.append(node.lineno)
        elif (owner, name) in UNPICKLERS:
            found.append(node.lineno)
    return found


def model_hooks(root: Path) -> set[str]:
    """The members of modelkit.ModelCode: every function of a model file the build may call
    (read with ast)."""
    path = root / "toolchain" / "modelkit.py"
    tree = ast.parse(path.read_text()) if path.is_file() else ast.Module(body=[], type_ignores=[])
    return {f.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "ModelCode"
            for f in c.body if isinstance(f, ast.FunctionDef)}


def hooks_called(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each function the module calls on a model file: `module.<name>`,
    `load_module(...).<name>`, hasattr/getattr(module, "<name>"), in a module that loads
    model code (load_module)."""
    text = path.read_text()
    if "load_module(" not in text:
        return []
    found = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Attribute)
            and not node.attr.startswith("__")
            and (
                (isinstance(node.value, ast.Name) and node.value.id == "module")
                or (
                    isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", "") == "load_module"
                )
            )
        ):
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "module"
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def imports_beyond_modelkit(path: Path) -> list[str]:
    """The toolchain modules a model file (or a test fixture) imports besides toolchain.modelkit."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.ImportFrom) and node.module == "toolchain":
            names = [f"toolchain.{a.name}" for a in node.names]
        found += [n for n in names if n.split(".")[0] == "toolchain" and n != "toolchain.modelkit"]
    return found


def is_shim(path: Path) -> bool:
    """A module that only re-exports other modules' names: imports and an __all__ naming
    them, nothing else."""
    body = ast.parse(path.read_text()).body
    plain = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    exports = [
        n
        for n in plain
        if isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"]
    ]
    return bool(exports) and all(
        isinstance(n, (ast.Import, ast.ImportFrom)) or n in exports for n in plain
    )


# where settings are read, and only there
OPTION_TABLES = ("toolchain/options.py", "toolchain/engine/options.py")
OUR_SETTING = re.compile(r"^(QNN|QAIRT)_[A-Z0-9_]+$")


def settings_read_outside_the_table(root: Path, path: Path) -> list[int]:
    """Lines that read a command-line variable (doit's get_var, its _CMDLINE_VARS) or an environment
    setting of this project (os.environ.get/[…]/os.getenv of a $QNN_*/$QAIRT_* name, or of a name
    that is not a literal) outside the one table. Another tool's convention ($CC, $CI) is not a
    setting of ours."""
    if str(path.relative_to(root)) in OPTION_TABLES:
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Name, ast.Attribute)) and (
            getattr(node, "id", None) or getattr(node, "attr", None)
        ) in ("get_var", "_CMDLINE_VARS"):
            found.append(node.lineno)
        key = None
        if (
            isinstance(node, ast.Call)
            and node.args
            and ast.unparse(node.func) in ("os.environ.get", "os.getenv")
        ):
            key = node.args[0]
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value) == "os.environ"
        ):
            key = node.slice
        if key is not None and not (isinstance(key, ast.Constant) and isinstance(key.value, str)
                                    and not OUR_SETTING.match(key.value)):
            found.append(node.lineno)
    return sorted(set(found))


def private(name: str) -> bool:
    """A name its module keeps to itself: a leading underscore, not a dunder
    (__file__, __version__)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_taken(name: str, path: Path, known: dict) -> list[str]:
    """"<module>:<line> -> <other module>.<_name>" for each private name the module takes from
    another toolchain module: `from toolchain.<module> import _name`, and `m._name` on a name bound
    to a toolchain module (`import toolchain.<module> as m`, `from toolchain import <module>`, or
    `import toolchain.<module>` then `toolchain.<module>._name`)."""
    tree = ast.parse(path.read_text())
    bound, found = {}, []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "toolchain"
        ):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif private(alias.name) and node.module != name:
                    found.append(f"{name}:{node.lineno} -> {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "toolchain":
                    bound[alias.asname or "toolchain"] = alias.name if alias.asname else "toolchain"

    def module_of(node):
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        base = module_of(node.value) if isinstance(node, ast.Attribute) else None
        return f"{base}.{node.attr}" if base else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            target = module_of(node.value)
            if target in known and target != name:
                found.append(f"{name}:{node.lineno} -> {target}.{node.attr}")
    return sorted(found, key=lambda s: (int(s.split(":")[1].split()[0]), s))


def measure(root: Path) -> dict:
    known = modules(root)
    graph, hidden, upward, function_strings, branches = {}, [], [], [], {}
    engine_reads, compiler_imports, hooks, model_api = [], [], [], []
    for name, path in known.items():
        edges = imports(name, path, known)
        if wing(name) == "engine":
            engine_reads += [
                f"{name} -> {t}"
                for t, _ in edges
                if wing(t) != "engine" and t not in ENGINE_MAY_USE
            ]
            engine_reads += [
                f"{name} -> {p}" for p in sorted(package_imports(path) & set(MODEL_PACKAGES))
            ]
            engine_reads += [f"{name}:{line} says QNN" for line in strings_naming_qnn(path)]
        if wing(name) != "compilers" and name not in REGISTRY_USERS:
            compiler_imports += [f"{name} -> {t}" for t, _ in edges
                                 if wing(t) == "compilers"]
        if import_hooks(path):
            hooks.append(name)
        if name not in MODEL_API:
            model_api += [f"{name} -> {t}" for t, _ in edges if t in MODEL_API]
        graph[name] = {t for t, _ in edges}
        hidden += [f"{name} -> {t}" for t, inside in edges if inside]
        here = wing(name)
        for target, _ in edges:
            there = wing(target)
            if here and there and there != here and there not in MAY_IMPORT[here]:
                upward.append(f"{name} -> {target}")
        function_strings += [f"{name}: {n.value}" for n in ast.walk(ast.parse(path.read_text()))
                             if isinstance(n, ast.Constant) and isinstance(n.value, str)
                             and FUNCTION_STRING.match(n.value)]
        function_strings += [
            f"{name}: {ast.unparse(n)}"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.JoinedStr) and named_by_fstring(n)
        ]
        # a compiler's own code
        own = wing(name) == "compilers" or name in ("toolchain.ort_qnn", "toolchain.qairt")
        if not own and compiler_branches(path):
            branches[name] = compiler_branches(path)
    parsed_names = [f"{name}:{line}" for name, p in known.items() for line in names_parsed(p)]
    unpickling = [
        f"{p.relative_to(root)}:{line}"
        for p in [*known.values(), *sorted(root.glob("models/**/*.py"))]
        for line in unsafe_loads(p)
    ]
    members = model_hooks(root)
    undocumented = [f"{p.relative_to(root)}:{line}: {name}" for p in known.values()
                    for line, name in sorted(hooks_called(p)) if name not in members]
    model_code = [
        *sorted(root.glob("models/**/*.py")),
        *sorted(root.glob("tests/fixtures/**/*.py")),
    ]
    beyond = [
        f"{p.relative_to(root)} -> {t}" for p in model_code for t in imports_beyond_modelkit(p)
    ]
    shims = [name for name, p in known.items() if name.count(".") >= 1 and is_shim(p)]
    settings = [
        f"{p.relative_to(root)}:{line}"
        for p in known.values()
        for line in settings_read_outside_the_table(root, p)
    ]
    private_names = [
        found for name, p in known.items() for found in private_names_taken(name, p, known)
    ]
    listing = [str(p.relative_to(root)) for p in [*known.values(), root / "dodo.py"]
               if p.is_file() and len(stages_named(p)) >= LISTS_STAGES]
    return {
        "modules": len(known),
        "top_level_modules": sum(1 for n in known if n.count(".") == 1),
        "import_edges": sum(len(v) for v in graph.values()),
        "cycles": cycles(graph),
        "function_level_imports": hidden,
        "upward_imports": upward,
        "functions_named_by_strings": function_strings,
        "compiler_name_branches": sum(len(v) for v in branches.values()),
        "compiler_name_branch_files": branches,
        "places_listing_the_stages": listing,
        "engine_reads_a_model_or_qnn": engine_reads,
        "compilers_imported_by_name": compiler_imports,
        "import_hooks": hooks,
        "model_api_imported_by_the_toolchain": model_api,
        "loads_that_unpickle": unpickling,
        "undocumented_model_hooks": undocumented,
        "model_code_importing_more_than_modelkit": beyond,
        "shims": shims,
        "variables_parsed_outside_the_table": settings,
        "private_cross_module_names": private_names,
        "task_names_parsed": parsed_names,
    }


if __name__ == "__main__":
    print(
        json.dumps(
            measure(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1])), indent=1
        )
    )
