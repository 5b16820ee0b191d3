"""Docs that match the code (issue 24, item 5).

- Every file a doc (any .md of the repo), a Python comment or docstring, or a TOML comment cites is
in the checkout,
  and every dotted toolchain name it gives (`toolchain.stages.verify`) is a module of it (or a name
  in one), so a reader of it can open it: paths under the checkout's own folders (or a toolchain
  wing, or `../`), any bare .md name, any bare .py name. URLs, upstream repositories' paths and the
  few names in BARE / EXAMPLES are left alone.
- docs/architecture.md's compiler-surface table names exactly the public members of `Compiler` in
  toolchain/stages/__init__.py, and its Stages table lists exactly the stages of
  toolchain/pipeline.py, the compilers' own where `*COMPILERS` stands
  (compilers/<name>/__init__.py), in run order with scope and default. Read with ast:
  nothing is imported.
- docs/add-a-model.md's key table documents exactly the spec keys of toolchain/spec/keys.py (for the
  tables whose keys are rows), with each row's default and string choices.

    python tests/test_docs.py     # prints every unresolved citation as file:line: path

Each check has a test showing it reports a planted mistake.
"""
from __future__ import annotations

import ast
import fnmatch
import io
import itertools
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {
    ".git",
    "build",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".benchmarks",
    ".venv",
    "venv",
    "node_modules",
}
# A path is checked when it starts with one of these (the checkout's own top-level folders), with
# `../`, or with a wing of toolchain/ (docs often name `engine/paths.py` for
# toolchain/engine/paths.py). Anything else (`scripts/...` of sherpa-onnx, `k2-fsa/...`,
# `lib/aarch64-android/...` of the SDK) is upstream's.
TOP = ("toolchain", "tests", "models", "bench", "docs", ".ci")
WINGS = ("spec", "stages", "compilers", "deploy", "phone", "engine", "qnn", "rewrites", "shared")
# Bare names that are not one file of the checkout: what the build or a bench writes, the file every
# data folder holds, and upstream scripts. Any other bare .md name must be beside its citer or at
# the root; a bare .py name must be some module's of the checkout.
BARE = {
    "report.md": "build/report.md, the report stage's",
    "bench.md": "bench/bench.py --out",
    "synthetic.md": "bench/synthetic.py --out",
    "design-card.md": "bench/design_card.py --out",
    "PROVENANCE.md": "each models/data/<set>/'s own",
    "generate_config.py": "k2-fsa/sherpa-onnx scripts/qnn/",
    "device_info.py": "k2-fsa/sherpa-onnx scripts/qnn/",
    "export-onnx-streaming.py": "k2-fsa/icefall's zipformer/",
    "gen_qnn_ctx_onnx_model.py": "onnxruntime's QNN EP tools",
}
# Files named in examples of messages, or written by a test into its own tmp project: not
# citations. (models/bad.toml and models/handmade.py: what tests/conftest.py's handmade() writes
# into a test's project.)
EXAMPLES = {"models/x.toml", "models/m.py", "models/m.toml", "models/lstm.toml", "models/qnet.toml",
            "models/bad.toml", "models/handmade.py",
            # what `python -m toolchain init` writes into a user's project
            "models/example.toml", "models/example.py"}
URL = re.compile(r"\b(?:https?|ftp|file)://\S+|\bwww\.\S+")
# An upstream repository named before a path: "k2-fsa/sherpa-onnx scripts/..." or
# "k2-fsa/icefall's egs/...".
UPSTREAM = re.compile(
    r"\b(?:k2-fsa|microsoft|onnx|pytorch|huggingface|cmusphinx|quic|qualcomm|google|"
    r"scikit-image|sentence-transformers)/[\w.-]+"
)
PATH = re.compile(
    r"(?<![\w/.$~@:-])((?:\.\./)*[\w.<>*{},…-]*[\w<>*}…-]/[\w./<>*{},…-]*[\w<>*}…/-])"
)
MD = re.compile(r"(?<![\w/.$~@:<-])([\w.<>*{},…-]*[\w>}…-]\.md)\b")
PY = re.compile(r"(?<![\w/.$~@:<-])([\w-]+\.py)\b")


def repo_files(root: Path = ROOT) -> list[str]:
    """Every file of the working tree (not only git's: modules may be moving), as
    root-relative posix paths."""
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if (
            any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1])
            or not path.is_file()
        ):
            continue
        found.append(rel.as_posix())
    return sorted(found)


def cited_text(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of what a file says to a reader: every line of a .md; a .py
    file's comments and docstrings only (a string the code writes, `(out / "bench.md")`, is
    not a citation)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    # its comments (a `#` inside a string is rare enough in these files to ignore)
    if path.suffix == ".toml":
        return [
            (n, line[line.index("#") :])
            for n, line in enumerate(text.splitlines(), 1)
            if "#" in line
        ]
    lines = text.splitlines()
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return []
    found += [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found += [(n, lines[n - 1]) for n in range(first.lineno, first.end_lineno + 1)]
    return sorted(found)


def _expand(pattern: str) -> list[str]:
    """`engine/state/{checker,stamps}.py` -> both; `models/<m>.toml`, `…/x` -> globs."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match:
        return [p for alt in match.group(1).split(",")
                for p in _expand(pattern[:match.start()] + alt + pattern[match.end():])]
    return [re.sub(r"<[^<>/]*>|…", "*", pattern)]


def resolves(cited: str, citing: str, files: list[str]) -> bool:
    """Whether a cited path names a file (or a folder holding files) of the checkout: from the
    root, from the citing file's folder, or (a toolchain wing first) from toolchain/; a bare .py
    name, a module anywhere."""
    cited = cited.rstrip("/.,")
    base = Path(citing).parent.as_posix()
    tried = [cited, f"{base}/{cited}"]
    if cited.split("/")[0] in WINGS:
        tried.append(f"toolchain/{cited}")
    for want in tried:
        if ".." in want.split("/"):
            parts = []
            for part in want.split("/"):
                if part != "..":
                    parts.append(part)
                elif not parts:
                    # climbs out of the checkout: not something a reader of it can open
                    break
                else:
                    parts.pop()
            else:
                want = "/".join(parts)
            if ".." in want.split("/"):
                continue
        for pattern in _expand(want.lstrip("./") if want.startswith("./") else want):
            if any(
                fnmatch.fnmatchcase(f, pattern) or f.startswith(pattern.rstrip("/") + "/")
                for f in files
            ):
                return True
    if "/" in cited:
        return False
    return cited in BARE or (
        cited.endswith(".py") and any(f.rsplit("/", 1)[-1] == cited for f in files)
    )


def citations(line: str) -> list[str]:
    """The repo-relative paths one line cites (upstream ones and URLs left out)."""
    line = UPSTREAM.sub(" ", URL.sub(" ", line))
    found = []
    for match in PATH.finditer(line):
        path = match.group(1)
        head = path.split("/")[0]
        if head == "build" or "$" in path or path in EXAMPLES:
            # build outputs, environment-relative paths, examples: not in the checkout
            continue
        # toolchain/stages.Stage: a name in the module (package)
        path = re.sub(r"\.[A-Z]\w*$", "", path)
        rest = path.split("/")[1:]
        if head in TOP or head == ".." or (head in WINGS and any("." in p for p in rest)):
            found.append(path)
    return found + [m.group(1) for m in MD.finditer(line)] + [m.group(1) for m in PY.finditer(line)]


def unresolved(root: Path = ROOT) -> list[str]:
    """'file:line: cited' for every citation of a .md or .py file under `root` that
    does not resolve."""
    files = repo_files(root)
    bad = []
    for rel in (f for f in files if f.endswith((".md", ".py", ".toml"))):
        for number, line in cited_text(root / rel):
            bad += [f"{rel}:{number}: {c}" for c in citations(line) if not resolves(c, rel, files)]
            bad += [
                f"{rel}:{number}: {d}"
                for d in DOTTED.findall(line)
                if not module_resolves(d, files)
            ]
    return bad


# A dotted name of the toolchain (`toolchain.stages.verify`, `toolchain.modelkit.read_wav`): its
# module must exist.
DOTTED = re.compile(r"(?<![\w./])(toolchain(?:\.\w+)+)")


def module_resolves(dotted: str, files: list[str]) -> bool:
    """Whether the longest module prefix of a dotted name is a module or package of the checkout,
    and what follows it is at most one name in it (a function, a class, a constant)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end])
        if f"{path}.py" in files or f"{path}/__init__.py" in files:
            return len(parts) - end <= 1
    return False


# ---- docs/architecture.md against the code
# --------------------------------------------------------------------

def compiler_members(base: Path = ROOT / "toolchain/stages/__init__.py") -> set[str]:
    """The public attributes and methods of class Compiler (ast: nothing imported)."""
    tree = ast.parse(base.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Compiler")
    found = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return {n for n in found if not n.startswith("_")}


# toolchain/stages Stage's first fields, in order
FIELDS = ("name", "tasks", "doc", "scope", "default")


def _stage(call: ast.Call) -> tuple[str, str, bool]:
    """(name, scope, default) of one `Stage(...)` call, positional or keyword."""
    given = {**dict(zip(FIELDS, call.args)), **{k.arg: k.value for k in call.keywords}}
    default = given.get("default")
    return (ast.literal_eval(given["name"]), ast.literal_eval(given["scope"]),
            True if default is None else ast.literal_eval(default))


def _compiler_stages(root: Path) -> list[tuple[str, str, bool]]:
    """Each compiler's `stages` in compilers/registry.py's REGISTRY order, a name two declare
    once (as pipeline.py merges them)."""
    registry = next(
        n.value
        for n in ast.parse((root / "toolchain/compilers/registry.py").read_text()).body
        if (
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "REGISTRY" for t in n.targets)
        )
        or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "REGISTRY")
    )
    merged: dict[str, tuple] = {}
    # ort_qnn.Compiler -> compilers/ort_qnn/__init__.py
    for value in registry.values:
        tree = ast.parse(
            (root / "toolchain/compilers" / value.value.id / "__init__.py").read_text()
        )
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == value.attr)
        own = next(n.value for n in cls.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", "") == "stages" for t in n.targets))
        for call in own.elts:
            record = _stage(call)
            merged.setdefault(record[0], record)
    return list(merged.values())


def pipeline_stages(root: Path = ROOT) -> list[tuple[str, str, bool]]:
    """(name, scope, default) of every stage in run order: pipeline.py's STAGES, the compilers' own
    stages where `*COMPILERS` stands."""
    tree = ast.parse((root / "toolchain/pipeline.py").read_text())
    stages = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "STAGES" for t in n.targets))
    found = []
    for item in stages.elts:
        if isinstance(item, ast.Starred):
            assert getattr(item.value, "id", "") == "COMPILERS", (
                f"pipeline.py: STAGES holds *{ast.unparse(item)}"
            )
            found += _compiler_stages(root)
        else:
            found.append(_stage(item))
    return found


def _section(text: str, heading: str) -> str:
    """The body of the `## <heading>…` section."""
    match = re.search(rf"^## {re.escape(heading)}[^\n]*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/architecture.md: no '## {heading}' section"
    return match.group(1)


def _rows(text: str, heading: str) -> list[list[str]]:
    """The cells of a section's table, header and separator rows left out."""
    lines = [line for line in _section(text, heading).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def documented_members(text: str) -> set[str]:
    """The members the compiler-surface table names: the backticked identifiers of
    its first column."""
    return {name for row in _rows(text, "The compiler surface") for name in
            re.findall(r"`([A-Za-z_]\w*)(?:\([^`]*\))?`", row[0])}


def documented_stages(text: str) -> list[tuple[str, str, bool]]:
    """(name, scope, default) of each row of the Stages table, in order; default is
    "yes…" or not."""
    return [(re.fullmatch(r"`(\w+)`", row[0]).group(1), row[1], row[2].startswith("yes"))
            for row in _rows(text, "Stages")]


def member_drift(doc: str, base: Path = ROOT / "toolchain/stages/__init__.py") -> list[str]:
    """What the doc's compiler-surface table and class Compiler disagree on."""
    documented, code = documented_members(doc), compiler_members(base)
    return [f"not in the doc: {n}" for n in sorted(code - documented)] + \
        [f"not in the code: {n}" for n in sorted(documented - code)]


def stage_drift(doc: str, root: Path = ROOT) -> list[str]:
    """Rows where the doc's Stages table and the pipeline disagree (name, scope, default),
    in run order."""
    return [
        f"row {i}: doc {d}, code {c}"
        for i, (d, c) in enumerate(
            itertools.zip_longest(documented_stages(doc), pipeline_stages(root)), 1
        )
        if d != c
    ]


ARCHITECTURE = ROOT / "docs/architecture.md"


def test_every_citation_is_in_the_repo():
    bad = unresolved()
    assert not bad, "citations of files not in the checkout:\n" + "\n".join(bad)


def test_architecture_lists_every_compiler_member():
    drift = member_drift(ARCHITECTURE.read_text())
    assert not drift, (
        "docs/architecture.md vs class Compiler (toolchain/stages/__init__.py):\n"
        + "\n".join(drift)
    )


def test_architecture_lists_every_stage():
    drift = stage_drift(ARCHITECTURE.read_text())
    assert not drift, "docs/architecture.md '## Stages' vs toolchain/pipeline.py:\n" + "\n".join(
        drift
    )


# ---- the checks can fail
# ---------------------------------------------------------------------------------------

def _checkout(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "toolchain/engine").mkdir(parents=True)
    (tmp_path / "docs/real.md").write_text("# Real\n")
    (tmp_path / "toolchain/engine/paths.py").write_text('"""Paths."""\n')
    return tmp_path


def documented_hooks(doc: Path = ROOT / "docs/add-a-model.md") -> list[str]:
    """The functions of docs/add-a-model.md's "The module" table (its first column's names)."""
    section = re.split(r"\n##+ ", doc.read_text().split("## The module", 1)[1], maxsplit=1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `(\w+)\(", section, re.M)]


def protocol_members(path: Path = ROOT / "toolchain/modelkit.py") -> list[str]:
    """The methods of modelkit.ModelCode, in order (read with ast)."""
    tree = ast.parse(path.read_text())
    return [f.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "ModelCode"
            for f in c.body if isinstance(f, ast.FunctionDef)]


def test_the_model_code_table_is_the_protocol():
    assert documented_hooks() and sorted(documented_hooks()) == sorted(protocol_members())


def test_the_model_code_check_reports_drift(tmp_path):
    doc = tmp_path / "add.md"
    doc.write_text(
        "## The module\n\n| `export(c, g, o, s)` | x |\n| `secret(x)` | y |\n\n## Next\n| `z()` |\n"
    )
    assert documented_hooks(doc) == ["export", "secret"]


def test_extractor_reports_a_missing_citation(tmp_path):
    root = _checkout(tmp_path)
    (root / "docs/guide.md").write_text(
        "See `docs/real.md`, real.md, ../docs/real.md and `engine/paths.py` (fine).\n"
        "Not here: sherpa-qnn.md §4, ../shared/reference/models.md, `docs/diagnose.md`, "
        "`engine/gone.py`,\n"
        "toolchain/stages/{compare,audio}.py, `toolchain/step0.py`, gone.py.\n"
        "Upstream is fine: k2-fsa/sherpa-onnx scripts/whisper/export-onnx.py, "
        "https://example.org/x/y.md,\n"
        "generate_config.py, and build/report.md is a build output.\n"
    )
    (root / "toolchain/engine/worker.py").write_text(
        '"""One step per process (ort-qnn.md §1.3)."""\n'
        "# see docs/real.md and paths.py\n"
        "OUT = 'bench.md' + 'gone.md'   # a string the code writes is no citation\n")
    assert sorted(unresolved(root)) == sorted(
        [
            "docs/guide.md:2: sherpa-qnn.md",
            "docs/guide.md:2: ../shared/reference/models.md",
            "docs/guide.md:2: docs/diagnose.md",
            "docs/guide.md:2: engine/gone.py",
            "docs/guide.md:3: toolchain/stages/{compare,audio}.py",
            "docs/guide.md:3: toolchain/step0.py",
            "docs/guide.md:3: gone.py",
            "toolchain/engine/worker.py:1: ort-qnn.md",
        ]
    )


def test_member_check_reports_drift(tmp_path):
    base = tmp_path / "contract.py"
    base.write_text(
        "class Compiler:\n    name = ''\n    _private = 1\n    def identity(self): ...\n"
        "    def new_question(self): ...\n"
    )
    doc = (
        "## The compiler surface (`stages/__init__.py`)\n\n| question | a |\n|---|---|\n"
        "| `name` | x |\n| `identity(chip)` | y |\n| `gone(model)` | z |\n\n## Next\n| `later` | w "
        "|\n"
    )
    assert member_drift(doc, base) == ["not in the doc: new_question", "not in the code: gone"]
    fixed = doc.replace("`gone(model)`", "`new_question()`")
    assert member_drift(fixed, base) == []


def test_stage_check_reports_drift(tmp_path):
    folder = tmp_path / "toolchain/compilers"
    # both compilers declare it: one stage
    shared = "Stage('compile', f, 'd', 'graph@chip')"
    compilers = {"c": f"{shared}, Stage('oracle', f, 'd', 'graph@chip', default=False)",
                 # keywords too
                 "q": f"{shared}, Stage(name='context', tasks=f, doc='d', scope='graph@chip')"}
    for name, stages in compilers.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"class Compiler(stages.Compiler):\n    stages = ({stages},)\n"
        )
    (folder / "registry.py").write_text("REGISTRY = {c.NAME: c.Compiler, q.NAME: q.Compiler}\n")
    (tmp_path / "toolchain/pipeline.py").write_text(
        "STAGES = (Stage('export', f, 'd', 'graph'), *COMPILERS, Stage('report', f, 'd', 'build', "
        "False))\n"
    )
    assert pipeline_stages(tmp_path) == [
        ("export", "graph", True),
        ("compile", "graph@chip", True),
        ("oracle", "graph@chip", False),
        ("context", "graph@chip", True),
        ("report", "build", False),
    ]
    doc = ("## Stages (`pipeline.py`)\n\n| stage | scope | default | what |\n|---|---|---|---|\n"
           "| `export` | graph | yes | x |\n| `compile` | graph@chip | yes | x |\n"
           "| `oracle` | graph@chip | no (on demand) | x |\n| `context` | graph@chip | yes | x |\n"
           "| `report` | build | no | x |\n")
    assert stage_drift(doc, tmp_path) == []
    assert stage_drift(
        doc.replace("| `report` | build | no |", "| `report` | build | yes |"), tmp_path
    ) == ["row 5: doc ('report', 'build', True), code ('report', 'build', False)"]
    swapped = (
        doc.replace("`oracle`", "`tmp`")
        .replace("`context`", "`oracle`")
        .replace("`tmp`", "`context`")
    )
    assert len(stage_drift(swapped, tmp_path)) == 2                    # order counts
    assert stage_drift(doc.replace("| `report` | build | no | x |\n", ""), tmp_path) == [
        "row 5: doc None, code ('report', 'build', False)"]          # a stage missing from the doc


if __name__ == "__main__":
    print("\n".join(unresolved()))
    sys.exit(0)


# the spec tables whose every key is a row of toolchain/spec/keys.py
ROW_TABLES = ("", "license", "export", "compile", "parity", "verify")


def documented_keys(text: str) -> dict[str, str]:
    """{`table.key` (`key` at the top level): its row's text} of add-a-model's "The TOML" table,
    for the tables in ROW_TABLES: a first cell `` `[verify]` `max_rel`, `min_cosine` `` documents
    verify.max_rel and verify.min_cosine (a key documented twice: both rows' text)."""
    found: dict[str, str] = {}
    for row in _rows(text, "The TOML"):
        table = re.match(r"`\[([\w.<>]+)\]`", row[0])
        where = table.group(1) if table else ""
        if where not in ROW_TABLES:
            continue
        for name in re.findall(r"`([A-Za-z_]\w*)`", row[0][table.end() if table else 0:]):
            path = f"{where}.{name}" if where else name
            found[path] = found.get(path, "") + " | ".join(row)
    return found


def key_drift(text: str, keys) -> list[str]:
    """What the doc's key table and the spec's key rows disagree on: a row not documented, a
    documented key that is no row, a default or a string choice the row's text does not say."""
    documented = documented_keys(text)
    rows = {k.path: k for k in keys}
    drift = [f"{p}: a key of the spec the table does not document" for p in rows
             if p not in documented]
    drift += [f"{p}: documented, but no key of the spec" for p in documented if p not in rows]
    for path, key in rows.items():
        line, default = documented.get(path, ""), key.default
        # a number is said as `default 0.02`, a string as `"auto"`; 0, "" and None say nothing
        if isinstance(default, (int, float)) and not isinstance(default, bool) and default:
            said = f"{default:g}" if isinstance(default, float) else str(default)
            if not re.search(rf"default {re.escape(said)}\b", line):
                drift.append(f"{path}: the table does not say its default {default!r}")
        if isinstance(default, str) and default and f'"{default}"' not in line:
            drift.append(f'{path}: the table does not say its default "{default}"')
        drift += [f'{path}: the table does not name the choice "{c}"' for c in key.choices
                  if isinstance(c, str) and f'"{c}"' not in line]
    return drift


def test_the_add_a_model_key_table_and_the_spec_key_rows_agree():
    from toolchain.spec import REFERENCES, keys
    assert keys.KEY["parity.reference"].choices == tuple(REFERENCES)
    assert key_drift((ROOT / "docs/add-a-model.md").read_text(), keys.KEYS) == []


def test_the_key_table_check_can_fail():
    from toolchain.spec import keys
    text = (ROOT / "docs/add-a-model.md").read_text()
    planted = text.replace("(default 18)", "(default 17)").replace(
        "| `[verify]` `full_chips` |", "| `[verify]` `full_chip` |"
    ).replace('`"dynamo"` (default) or `"legacy"`', '`"dynamo"` (default) or legacy')
    assert key_drift(planted, keys.KEYS) == [
        "verify.full_chips: a key of the spec the table does not document",
        "verify.full_chip: documented, but no key of the spec",
        'export.exporter: the table does not name the choice "legacy"',
        "export.opset: the table does not say its default 18",
    ]
