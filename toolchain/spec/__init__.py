"""models/<name>.toml -> frozen Model records; every mistake is a SpecError naming file and field.
This module reads a spec file and its model-wide tables; records.py holds the records, table.py
the TOML table with its errors, graphs.py the [graphs.<g>] tables, sources.py checkpoints,
packages and given ONNX."""
from __future__ import annotations

import math
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from toolchain.errors import SpecError
from toolchain.spec import chips as chip_table
from toolchain.spec import windows
from toolchain.spec.graphs import graph as _graph
from toolchain.spec.keys import KEY
from toolchain.spec.records import (
    AUTO,
    NAME,
    OPSETS,
    Checkpoint,
    Graph,
    Model,
    Parity,
    Tensor,
    Verify,
)
from toolchain.spec.sources import checkpoint as _checkpoint
from toolchain.spec.sources import requires as _requires
from toolchain.spec.table import Settings, Table, closest_path, near, plain

__all__ = [
    "AUTO",
    "Checkpoint",
    "Graph",
    "Model",
    "Settings",
    "SpecError",
    "Table",
    "Tensor",
    "load",
    "load_file",
    "plain",
]


def load(path: str | Path, chips: dict) -> Model:
    """Read and validate a model spec that declares no variants."""
    models = load_file(path, chips)
    if len(models) != 1:
        raise SpecError(f"{path}: declares variants; load it with load_file()")
    return models[0]


def load_file(path: str | Path, chips: dict) -> tuple[Model, ...]:
    """Read and validate one spec file; `[variants.<label>]` fans it out into one model per label
    (named <file stem>-<label>), each the base spec with that table's keys merged over it."""
    path = Path(path)
    file = str(path)
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{file}: TOML syntax error: {err}") from None
    except OSError as err:
        raise SpecError(f"{file}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise SpecError(
            f"{file}: not UTF-8 text: byte 0x{raw[err.start]:02x} at offset {err.start} (line "
            f"{line}); "
            f"save the file as UTF-8"
        ) from None
    if not NAME.match(path.stem):
        raise SpecError(
            f"{file}: the file name '{path.stem}' must match {NAME.pattern} (it names tasks and "
            "folders)"
        )
    variants = data.pop("variants", None)
    if variants is None:
        return (_model(data, file, path.stem, path.parent, chips),)
    if not isinstance(variants, dict) or not variants:
        raise SpecError(f"{file}: variants: expected tables [variants.<label>], got {variants!r}")
    models = []
    for label, overrides in variants.items():
        if not NAME.match(label) or not isinstance(overrides, dict):
            raise SpecError(
                f"{file}: variants.{label}: expected a table whose label matches {NAME.pattern}"
            )
        models.append(
            _model(
                _merge(data, overrides),
                f"{file} [variants.{label}]",
                f"{path.stem}-{label}",
                path.parent,
                chips,
            )
        )
    return tuple(models)


def _merge(base: dict, overrides: dict) -> dict:
    """Deep merge: tables merge key by key, any other value replaces the base one."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = (
            _merge(base[key], value)
            if isinstance(value, dict) and isinstance(base.get(key), dict)
            else value
        )
    return merged


def _model(data: dict, file: str, name: str, here: Path, chips: dict) -> Model:
    """One model from a spec's data: each table read in file order, so the first mistake is
    the one named."""
    top = Table(data, file)
    module_file, uses, requires = _code(top, here)
    lic = top.sub("license")
    license_ = tuple((n, KEY[f"license.{n}"].read(lic)) for n in ("name", "url", "note"))
    lic.done()
    chip_names = _chips(top, chips)
    checkpoint = _checkpoint(top.sub("checkpoint"), here) if "checkpoint" in data else None
    data_dir = KEY["data"].read(top)
    if data_dir is not None:
        if not (here / data_dir).is_dir():
            top.fail("data", f"no folder {here / data_dir}{near(here, data_dir)}")
        data_dir = str(here / data_dir)
    export_settings = _export(top.sub("export", required=False))
    compile_settings = _compile(top.sub("compile", required=False))
    parity_table = top.sub("parity", required=False)
    verify_table = top.sub("verify", required=False)
    # a message says which are defaults
    verify_written = tuple(k for k in VERIFY_BOUNDS if k in verify_table.data)
    verify_settings = _verify(verify_table, chip_names, data_dir)
    metric = _metric(top.sub("metric", required=False))
    graphs = _graphs(top, checkpoint, chip_names, chips, here)
    windows_record = Settings(())
    # each window a graph of its own, after the declared ones (spec/windows.py)
    if "windows" in data:
        windows_record, copies = windows.windows(top.sub("windows"), graphs)
        graphs += copies
    given_only = checkpoint is None and all(
        g.source and g.source[0] in ("onnx", "archive") for g in graphs
    )
    parity_settings = _parity(parity_table, given_only)

    description = KEY["description"].read(top)
    # sherpa-onnx names its bundles after the model (sherpa-onnx-qnn-<SOC>-binary-whisper-tiny.en)
    bundle_name = KEY["bundle_name"].read(top, default=name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", bundle_name):
        top.fail(
            "bundle_name",
            f"{bundle_name!r}: letters, digits, '.', '_' and '-' only (it names a file)",
        )
    compiler = _compiler(top, file)   # checked against the registered compilers by project.py
    top.done()
    return Model(
        name=name,
        spec_file=file,
        module_file=str(module_file),
        description=description,
        bundle_name=bundle_name,
        uses=uses,
        requires=requires,
        license=Settings(license_),
        compiler=compiler,
        chips=chip_names,
        checkpoint=checkpoint,
        data_dir=data_dir,
        export=Settings(export_settings),
        compile=Settings(compile_settings),
        parity=Parity(**parity_settings),
        verify=Verify(**verify_settings),
        metric=metric,
        graphs=graphs,
        verify_written=verify_written,
        windows=windows_record,
    )


def _code(top: Table, here: Path) -> tuple:
    """The model's own code: its module, the files it imports (`uses`) and the
    packages it requires."""
    module = KEY["module"].read(top)
    module_file = here / f"{module}.py"
    if not module_file.is_file():
        guess = closest_path(here, f"{module}.py")
        hint = (
            f'; did you mean module = "{guess.removesuffix(".py")}"?'
            if guess.endswith(".py")
            else ""
        )
        top.fail("module", f"no export code at {module_file}; write models/{module}.py{hint}")
    written = [str(u) for u in KEY["uses"].read(top)]
    uses = tuple(str(here / u) for u in written)
    requires = _requires(top)
    for used, rel in zip(uses, written):
        if not Path(used).is_file():
            top.fail(
                "uses",
                f"no file {used} (model code the module imports, relative to the "
                f"spec){near(here, rel)}",
            )
    return module_file, uses, requires


def _chips(top: Table, chips: dict) -> tuple[str, ...]:
    chip_names = tuple(KEY["chips"].read(top))
    if not chip_names:
        top.fail("chips", "empty list: name at least one chip")
    for chip in chip_names:
        if not isinstance(chip, str):
            top.fail("chips", f"expected chip ids (strings) like \"SM8750\", got {chip!r}")
    for chip in chip_names:
        if chip not in chips:
            top.fail("chips", chip_table.unknown(chip, chips))
    if len(set(chip_names)) != len(chip_names):
        top.fail("chips", "a chip is listed twice")
    return chip_names


def _export(export: Table) -> dict:
    settings = {n: KEY[f"export.{n}"].read(export) for n in ("exporter", "opset", "args")}
    if not OPSETS[0] <= settings["opset"] <= OPSETS[1]:
        export.fail(
            "opset",
            f"{settings['opset']} is outside the opsets torch exports ({OPSETS[0]}-{OPSETS[1]}); "
            f"the default is 18",
        )
    export.done()
    return settings


def _compile(comp: Table) -> dict:
    # max_fp16_params: the guide: above ~1B parameters in fp16 a model may not fit one context.
    # The bundled compiler builds 1.2B (2.4 GB, bench/size_limit.py); devices unmeasured.
    settings = {
        name: KEY[f"compile.{name}"].read(comp)
        for name in ("optimization", "android_libs", "max_fp16_params")
    }
    # The QNN runtime the app ships (runtime_qairt = "2.49.40") or the QAIRT families to build
    # (qairt = [...]): kept as written only when given (a spec without them keeps its settings); the
    # compiler resolves and checks them at load (compilers/ort_qnn/families.py).
    for key in ("runtime_qairt", "qairt"):
        value = KEY[f"compile.{key}"].read(comp)
        if value is not None:
            settings[key] = tuple(value) if isinstance(value, list) else value
    comp.done()
    return settings


# [parity] reference: what the ONNX on the CPU is held to: the model code's torch_runner(checkpoint)
# (PyTorch), its reference_runner(checkpoint) (any other code: numpy, a reference implementation),
# or nothing. The default is "torch", or "none" when every graph is an ONNX given as a file and
# there is no checkpoint (nothing to compare with). Whatever the graphs' sources, a model may
# declare either runner (it gets checkpoint None without a checkpoint).
REFERENCES = {"torch": "torch_runner", "module": "reference_runner", "none": ""}


def _parity(parity: Table, given_only: bool) -> dict:
    settings = {
        "max_abs": KEY["parity.max_abs"].read(parity),
        "reference": KEY["parity.reference"].read(parity, "none" if given_only else "torch"),
    }
    parity.done()
    return settings


# The [verify] bounds and their defaults (docs/add-a-model.md): the largest error of an output,
# relative to its range, for fp16 and for w8a16 graphs, and the least cosine similarity (0: not
# checked; e.g. 0.99 for an embedding, where direction is what counts).
VERIFY_BOUNDS = {n: KEY[f"verify.{n}"].default for n in ("max_rel", "max_rel_w8a16", "min_cosine")}


def _verify(verify: Table, chip_names: tuple, data_dir: str | None) -> dict:
    settings: dict[str, Any] = {"clips": tuple(KEY["verify.clips"].read(verify)),
                **{key: KEY[f"verify.{key}"].read(verify) for key in VERIFY_BOUNDS},
                "full_chips": tuple(KEY["verify.full_chips"].read(verify))}
    if settings["min_cosine"] > 1:
        verify.fail("min_cosine", f"a cosine similarity is at most 1, got {settings['min_cosine']}")
    for chip in settings["full_chips"]:
        if chip not in chip_names:
            verify.fail("full_chips", f"{chip!r} is not one of this model's chips")
    if not all(isinstance(c, str) and c for c in settings["clips"]):
        verify.fail(
            "clips", f"expected a list of sample ids (strings), got {list(settings['clips'])}"
        )
    if settings["clips"] and data_dir is None:
        verify.fail("clips", "names samples, but the model has no `data` folder to take them from")
    verify.done()
    return settings


def _metric(metric: Table) -> Settings:
    """The model code's own thresholds (its agree()): any plain values."""
    for key, value in metric.data.items():
        if not isinstance(value, (bool, int, float, str)):
            metric.fail(key, f"expected a number, boolean or string, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            metric.fail(key, f"expected a finite number, got {value!r}")
    metric.used.update(metric.data)
    return Settings(sorted(metric.data.items()))


def _graphs(
    top: Table, checkpoint: Checkpoint | None, chip_names: tuple, chips: dict, here: Path
) -> tuple[Graph, ...]:
    table = top.sub("graphs")
    graphs = tuple(_graph(table.sub(g), g, here) for g in table.data)
    table.used.update(table.data)
    if not graphs:
        top.fail("graphs", "declare at least one graph")
    if checkpoint is None and not all(g.source for g in graphs):
        top.req("checkpoint", dict)   # fails: the model code exports from a checkpoint
    # a stream made from another graph's outputs: that graph streams, before it
    for i, graph in enumerate(graphs):
        upstream = graph.stream.get("from")
        earlier = {g.name: g for g in graphs[:i]}
        if upstream is not None and (upstream not in earlier or not earlier[upstream].stream):
            streaming = ", ".join(g.name for g in graphs if g.stream) or "none"
            table.fail(
                f"{graph.name}.stream.from",
                f"{upstream!r} is not a graph declared before this one with a "
                f"stream of its own (streaming graphs: {streaming})",
            )
    for graph in graphs:
        for chip in chip_names:
            if not graph.precision.quantized and not chips[chip].fp16:
                top.fail(
                    "chips",
                    f"{chip} (HTP v{chips[chip].htp_arch}) has no fp16, but graph "
                    f"'{graph.name}' has precision = \"fp16\": drop {chip} from chips, "
                    f'or declare the graph precision = "w8a16" (8-bit weights)',
                )
    return graphs


def _compiler(top: Table, file: str) -> str:
    """`compiler = "ort-qnn" | "qairt" | "auto"`; a spec of 0.16 or older says `toolchain =`: read,
    and said once on stderr (both keys: refused)."""
    if "toolchain" in top.data:
        if "compiler" in top.data:
            top.fail("toolchain", "the old name of `compiler`: write `compiler` only")
        print(
            f"{file}: toolchain: now called compiler (read as compiler = "
            f"{top.data['toolchain']!r}; rename the "
            "key)",
            file=sys.stderr,
        )
        return top.opt("toolchain", str, KEY["compiler"].default)
    return KEY["compiler"].read(top)
