"""The shape of toolchain/ (tests/architecture.py measures it): wings that import only
downwards, no cycles, stages that never name or import a compiler, one list of the stages,
functions passed as functions."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from architecture import measure

ROOT = Path(__file__).parents[1]
SHAPE = measure(ROOT)


def test_no_import_cycle_inside_the_toolchain():
    assert SHAPE["cycles"] == []


def test_wings_import_only_downwards_and_stages_never_import_a_compiler():
    assert SHAPE["upward_imports"] == []
    stage_to_backend = [
        e
        for e in SHAPE["upward_imports"]
        if e.startswith("toolchain.stages.") and ".compilers." in e
    ]
    assert stage_to_backend == []


def test_no_import_is_hidden_in_a_function():
    assert SHAPE["function_level_imports"] == []


def test_no_stage_or_deploy_code_branches_on_a_compiler_name():
    assert SHAPE["compiler_name_branches"] == 0, SHAPE["compiler_name_branch_files"]


def test_the_stages_are_listed_in_one_place():
    assert SHAPE["places_listing_the_stages"] == ["toolchain/pipeline.py"]


def test_no_task_name_is_parsed_back_into_whom_it_is_for():
    """The aliases, the trace and the CI matrix read a task's owner from its meta."""
    assert SHAPE["task_names_parsed"] == []


def test_the_worker_is_given_functions_not_strings_that_name_them():
    assert SHAPE["functions_named_by_strings"] == []


def test_the_engine_reads_nothing_of_a_model_or_qnn():
    """engine/ imports no other wing (but the exception types), no model or QNN package, and
    its strings name none of them: the stages hand it what it needs (preloads, packages,
    paths) as data."""
    assert SHAPE["engine_reads_a_model_or_qnn"] == []


def test_no_compiler_is_imported_by_name_outside_compilers():
    """deploy/, phone/, stages/, shared/ reach a compiler through project.compiler(model),
    never by name."""
    assert SHAPE["compilers_imported_by_name"] == []


def test_no_import_hook_and_the_model_api_is_for_models_only():
    assert SHAPE["import_hooks"] == []
    assert SHAPE["model_api_imported_by_the_toolchain"] == []


def test_every_setting_is_read_in_one_table():
    """doit's variables and this project's environment settings are read by toolchain/options.py
    alone (one rule, one error, docs/usage.md "Settings"); the stages and the engine are handed
    the resolved values."""
    assert SHAPE["variables_parsed_outside_the_table"] == []


def test_an_import_for_annotations_only_is_an_edge_too(tmp_path):
    """`if TYPE_CHECKING:` imports never run, but the type they name ties the two modules all the
    same: the drawing counts them (issue 48: the record every stage is handed lives below the
    stages, so none is needed)."""
    pkg = tmp_path / "toolchain"
    (pkg / "stages").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "stages" / "__init__.py"):
        init.write_text("")
    (pkg / "project.py").write_text("from toolchain.stages import x\n")
    (pkg / "stages" / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from toolchain.project import Project\n")
    (tmp_path / "dodo.py").write_text("")
    assert measure(tmp_path)["cycles"] == [["toolchain.project", "toolchain.stages.x"]]
    (pkg / "stages" / "x.py").write_text("x = 1\n")
    assert measure(tmp_path)["cycles"] == []


def test_no_module_imports_a_type_it_could_not_import_at_run_time():
    """Zero `if TYPE_CHECKING:` imports of a toolchain module (numpy's, for annotations, are
    not the house's)."""
    import ast

    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "toolchain").rglob("*.py"))
        for block in ast.parse(path.read_text()).body
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for node in ast.walk(block)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "toolchain"
    ]
    assert found == []


def test_a_setting_read_outside_the_table_is_found(tmp_path):
    pkg = tmp_path / "toolchain"
    (pkg / "engine").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "engine" / "__init__.py"):
        init.write_text("")
    (pkg / "options.py").write_text(
        "import os\nfrom doit import get_var\nA = os.environ.get('QNN_CACHE')\n"
    )
    (pkg / "engine" / "cache.py").write_text(
        "import os\nimport doit\nENV = 'QNN_CACHE'\n"
        "a = doit.get_var('cache')\nb = os.environ.get(ENV)\nc = os.environ['QNN_REHASH']\n"
        "d = os.getenv('QAIRT_PYTHON')\ne = os.environ.get('CC')\nos.environ['QNN_X'] = '1'\n")
    (tmp_path / "dodo.py").write_text("")
    found = measure(tmp_path)["variables_parsed_outside_the_table"]
    assert found == [
        "toolchain/engine/cache.py:4",
        "toolchain/engine/cache.py:5",
        "toolchain/engine/cache.py:6",
        "toolchain/engine/cache.py:7",
    ]


def test_nothing_is_loaded_in_a_way_that_unpickles():
    """A checkpoint, an array file or a record may come from a shared cache: loading it must
    not run code."""
    assert SHAPE["loads_that_unpickle"] == []


def test_the_model_api_is_one_plain_module_and_its_hooks_are_the_builds():
    """What model code imports is one file an editor opens; every function the toolchain calls on a
    model file is a member of modelkit.ModelCode, and model code imports nothing else of the
    toolchain; no re-export shim is left."""
    import importlib.util

    from toolchain import modelkit

    assert importlib.util.find_spec("toolchain.modelkit").origin == str(
        ROOT / "toolchain/modelkit.py"
    )
    assert {"export", "torch_runner", "graph_feeds", "agree", "transcribe"} <= set(modelkit.HOOKS)
    assert SHAPE["undocumented_model_hooks"] == []
    assert SHAPE["model_code_importing_more_than_modelkit"] == []
    assert SHAPE["shims"] == []


def test_no_private_name_crosses_a_module_boundary():
    """A name with a leading underscore stays in its module: what another module needs is public
    (the ctypes QNN declarations in qnn/qnnbin.py) or lives where it is used."""
    assert SHAPE["private_cross_module_names"] == []


def test_the_measures_can_fail(tmp_path):
    """The same script finds each fault in a tree that has it."""
    pkg = tmp_path / "toolchain"
    for wing in ("stages", "compilers", "spec"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "stages" / "verify.py").write_text(
        "from toolchain.compilers import ort\n"
        "def tasks(model):\n    from toolchain.spec import x\n"
        "    return model.toolchain == 'qairt', 'toolchain.stages.verify:check'\n"
        "meta = {'restore_check': [f'{__name__}:restored', {}]}\n")
    (pkg / "compilers" / "ort.py").write_text("from toolchain.stages import verify\n")
    (pkg / "spec" / "x.py").write_text(
        "STAGES = "
        + repr(
            [
                "export",
                "simplify",
                "inspect",
                "parity",
                "calibrate",
                "compile",
                "verify",
                "manifest",
            ]
        )
        + "\n"
    )
    for wing in ("engine", "phone"):
        (pkg / wing).mkdir()
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "artifacts.py").write_text("")
    (pkg / "modelkit.py").write_text("")
    (pkg / "compilers" / "qairt.py").write_text("")
    (pkg / "engine" / "cache.py").write_text("import onnx\nfrom toolchain import artifacts\n"
                                             "PACKAGES = ('onnxruntime-qnn',)\nENV = 'QNN_CACHE'\n")
    (pkg / "phone" / "device.py").write_text("from toolchain.compilers import qairt\nimport sys\n"
                                             "sys.meta_path.append(None)\n")
    (pkg / "stages" / "report.py").write_text("from toolchain import modelkit\n")
    (pkg / "modelkit.py").write_text("class ModelCode:\n    def export(self): ...\n")
    (pkg / "stages" / "parity.py").write_text(
        "module = load_module(path)\nmodule.export()\nmodule.secret()\nhasattr(module, 'hidden')\n"
    )
    (pkg / "stages" / "owner.py").write_text(
        "def chip_of(name):\n    return name.partition('@')[2], name.split('+')[0]\n"
    )
    (pkg / "stages" / "old_name.py").write_text(
        '"""A shim."""\nfrom toolchain.stages.parity import export\n__all__ = ["export"]\n'
    )
    (pkg / "stages" / "leak.py").write_text(
        "\n".join(
            [
                "import toolchain.spec.x as xs",
                "from toolchain.spec.x import _table, __version__",
                "from toolchain import artifacts",
                "xs._hidden()",
                "artifacts._cache",
                "import toolchain.spec.x",
                "toolchain.spec.x._other",
                "self._own, xs.public",
                "",
            ]
        )
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.py").write_text(
        "import numpy as np, pickle, torch\n"
        "a = torch.load('m.pt')\nb = torch.load('m.pt', weights_only=False)\n"
        "c = torch.load('m.pt', weights_only=True)\n"
        "d = np.load('x.npz', allow_pickle=True)\ne = np.load('x.npz')\nf = pickle.loads(b'')\n"
        "from toolchain.worker import load_module\n")
    (tmp_path / "dodo.py").write_text("")
    shape = measure(tmp_path)
    assert shape["engine_reads_a_model_or_qnn"] == ["toolchain.engine.cache -> toolchain.artifacts",
                                                    "toolchain.engine.cache -> onnx",
                                                    "toolchain.engine.cache:3 says QNN"]
    assert shape["compilers_imported_by_name"] == [
        "toolchain.phone.device -> toolchain.compilers.qairt",
        "toolchain.stages.verify -> toolchain.compilers.ort",
    ]
    assert shape["import_hooks"] == ["toolchain.phone.device"]
    assert shape["model_api_imported_by_the_toolchain"] == [
        "toolchain.stages.report -> toolchain.modelkit"
    ]
    assert shape["cycles"] == [["toolchain.compilers.ort", "toolchain.stages.verify"]]
    assert shape["upward_imports"] == ["toolchain.stages.verify -> toolchain.compilers.ort"]
    assert shape["function_level_imports"] == ["toolchain.stages.verify -> toolchain.spec.x"]
    assert shape["compiler_name_branches"] == 1
    assert shape["functions_named_by_strings"] == [
        "toolchain.stages.verify: toolchain.stages.verify:check",
        "toolchain.stages.verify: f'{__name__}:restored'",
    ]
    assert shape["places_listing_the_stages"] == ["toolchain/spec/x.py"]
    assert shape["loads_that_unpickle"] == [
        "models/mine.py:2",
        "models/mine.py:3",
        "models/mine.py:5",
        "models/mine.py:7",
    ]
    assert shape["undocumented_model_hooks"] == ["toolchain/stages/parity.py:3: secret",
                                                 "toolchain/stages/parity.py:4: hidden"]
    assert shape["model_code_importing_more_than_modelkit"] == [
        "models/mine.py -> toolchain.worker"
    ]
    assert shape["shims"] == ["toolchain.stages.old_name"]
    assert shape["task_names_parsed"] == ["toolchain.stages.owner:2", "toolchain.stages.owner:2"]
    assert shape["private_cross_module_names"] == [
        "toolchain.stages.leak:2 -> toolchain.spec.x._table",
        "toolchain.stages.leak:4 -> toolchain.spec.x._hidden",
        "toolchain.stages.leak:5 -> toolchain.artifacts._cache",
        "toolchain.stages.leak:7 -> toolchain.spec.x._other",
    ]


def test_the_type_ratchet_tells_the_clean_modules_from_the_rest():
    """tests/typecheck.py (CI) fails on any mypy finding outside its PENDING modules, a new module's
    included; PENDING's it counts."""
    import typecheck

    out = (
        "toolchain/spec/table.py:46: error: Need type annotation\ntoolchain/stages/new.py:3: "
        "error: a\n"
        f"{typecheck.PENDING[0]}:7: error: b\n"
        "toolchain/engine/run/zygote.py:9: note: a note is not a finding\nFound 3 errors in 3 "
        "files\n"
    )
    assert typecheck.split(out) == (
        [
            "toolchain/spec/table.py:46: error: Need type annotation",
            "toolchain/stages/new.py:3: error: a",
        ],
        [f"{typecheck.PENDING[0]}:7: error: b"],
    )


def test_the_engine_is_three_rooms_and_a_few_modules():
    """engine/ holds running a step (run/), what doit remembers (state/) and the cache (cache/),
    plus a few modules all three use: at most 10 direct modules, a room counted as one."""
    engine = ROOT / "toolchain/engine"
    direct = sorted(
        p.name
        for p in engine.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    )
    assert {"run", "state", "cache"} <= set(direct)
    assert len(direct) <= 10, direct


def _task_functions(tasks) -> list:
    """The plain functions behind a stage's tasks: a partial's (a tier), both of a stage
    two compilers declare."""
    import functools
    if isinstance(tasks, functools.partial):
        inner = [a for a in tasks.args if callable(a)]
        return (
            [f for part in inner for f in _task_functions(part)]
            if inner
            else _task_functions(tasks.func)
        )
    return [tasks]


def test_every_stage_module_bears_its_stages_name():
    """A stage's tasks() lives in a module of the stage's name (a full tier in its stage's:
    verify_full in verify.py); a module of stages/ is a stage, and the report's helpers live in the
    report's own folder."""
    from toolchain import pipeline

    wrong = [
        f"{stage.name}: {f.__module__}"
        for stage in pipeline.STAGES
        for f in _task_functions(stage.tasks)
        if f.__module__.rsplit(".", 1)[-1] != stage.name.removesuffix("_full")
    ]
    assert wrong == []
    names = {stage.name for stage in pipeline.STAGES}
    loose = [p.name for p in (ROOT / "toolchain/stages").iterdir()
             if p.name != "__init__.py" and not p.name.startswith("__") and p.stem not in names]
    assert loose == []


def glossary(text: str) -> list[dict]:
    """The rows of docs/architecture.md's Glossary: word, the code names it points at, the
    words it retires."""
    import re
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("word", "---"):
            continue
        never = []
        for part in re.split(r",\s*(?=`)", cells[3]) if cells[3] else []:
            found = re.match(r"`(\w+)`(?: (outside|in) `([^`]+)`)?", part)
            if found:
                never.append(found.groups())
        rows.append({"word": cells[0], "code": re.findall(r"`([\w.]+)`", cells[2]), "never": never})
    return rows


def identifiers(path: Path) -> set[str]:
    """Every name a module binds or reads: variables, arguments, attributes,
    functions, classes, keywords."""
    import ast
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


def glossary_drift(text: str, root: Path = ROOT) -> list[str]:
    import dataclasses
    import importlib
    problems = []
    rows = glossary(text)
    for row in rows:
        for dotted in row["code"]:
            parts, obj = dotted.split("."), None
            for cut in range(len(parts), 0, -1):   # the longest importable module, then attributes
                try:
                    obj = importlib.import_module("toolchain." + ".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    fields = (
                        {f.name for f in dataclasses.fields(obj)}
                        if dataclasses.is_dataclass(obj)
                        else set()
                    )
                    obj = (
                        getattr(obj, attr, None)
                        if hasattr(obj, attr) or attr not in fields
                        else "field"
                    )
                break
            if obj is None:
                problems.append(f"{row['word']}: {dotted} is not in the code")
        for word, how, where in row["never"]:
            for path in sorted((root / "toolchain").rglob("*.py")):
                rel = path.relative_to(root / "toolchain").as_posix()
                if (how == "outside" and rel.startswith(where)) or (how == "in" and rel != where):
                    continue
                if word in identifiers(path):
                    problems.append(f"{row['word']}: toolchain/{rel} names `{word}`")
    return problems


def test_the_glossary_and_the_code_agree():
    """docs/architecture.md's Glossary: each word's names exist, no module uses a
    word it retires."""
    text = (ROOT / "docs/architecture.md").read_text()
    assert len(glossary(text)) >= 10
    assert glossary_drift(text) == []


def test_the_glossary_check_can_fail(tmp_path):
    (tmp_path / "toolchain/deploy").mkdir(parents=True)
    (tmp_path / "toolchain/deploy/bundle.py").write_text("def plan(backend):\n    family = 1\n")
    (tmp_path / "toolchain/qnn").mkdir()
    (tmp_path / "toolchain/qnn/run.py").write_text("backend = 1\n")
    doc = ("## Glossary\n\n| word | means | in code | never |\n|---|---|---|---|\n"
           "| compiler | x | `stages.Compiler`, `stages.Gone` | `backend` outside `qnn/` |\n"
           "| kind | y | `stages.Project.compiler` | `family` in `deploy/bundle.py` |\n\n## Next\n")
    assert glossary_drift(doc, tmp_path) == ["compiler: stages.Gone is not in the code",
                                             "compiler: toolchain/deploy/bundle.py names `backend`",
                                             "kind: toolchain/deploy/bundle.py names `family`"]


def test_importing_one_compiler_loads_none_of_the_other():
    """The registry is its own module (compilers/registry.py): a compiler's package imports only its
    own modules, so a tool of one compiler pays nothing for the other."""
    own = {"qairt": "ort_qnn", "ort_qnn": "qairt"}
    for compiler, other in own.items():
        loaded = subprocess.run(
            [sys.executable, "-c", f"import sys, toolchain.compilers.{compiler}; "
             "print(' '.join(sorted(sys.modules)))"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        assert f"toolchain.compilers.{compiler}" in loaded
        assert not [m for m in loaded if m.startswith(f"toolchain.compilers.{other}")], compiler
        assert "toolchain.compilers.registry" not in loaded


def test_the_stage_contract_the_compilers_and_the_spec_are_typed_strictly():
    """mypy runs with disallow_incomplete_defs and check_untyped_defs on these (pyproject.toml;
    tests/typecheck.py holds their findings at 0 in CI)."""
    import tomllib

    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_incomplete_defs") and
              o.get("check_untyped_defs")]
    modules = {m for o in strict for m in o["module"]}
    assert {"toolchain.stages.*", "toolchain.compilers.*", "toolchain.spec.*"} <= modules
