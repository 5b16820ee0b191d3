"""The keys of a model's spec, as rows (Meson's convertors): the table a key stands in, its name,
the types it takes, its default and choices, and one line of what it is. The loader reads each of
these keys through its row (`Key.read`), and `tests/test_docs.py` holds docs/add-a-model.md's key
table to the rows: every row documented with its default and choices, every documented key of
these tables a row. Keys with a structure of their own (`[checkpoint]`, `[graphs.<g>]`,
`[windows]`, `[variants]`, `[metric]`) are read by their own modules (sources.py, graphs.py,
windows.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolchain.spec.records import ANDROID_LIBS
from toolchain.spec.table import Table

# a key a spec must write (its row's default)
REQUIRED = object()


@dataclass(frozen=True)
class Key:
    """One key of a spec: `table` is "" for the top level, else the table it stands in."""

    table: str
    name: str
    kind: type | tuple[type, ...]
    default: Any
    doc: str
    choices: tuple = ()

    @property
    def path(self) -> str:
        """`verify.max_rel`, or `module` for a top-level key."""
        return f"{self.table}.{self.name}" if self.table else self.name

    def read(self, table: Table, default: Any = REQUIRED) -> Any:
        """The key's value in `table` (a spec's table of this key), checked against the row's type
        and choices; `default` overrides the row's when the loader decides it (parity.reference
        is "none" for a model of given ONNX files only). A number is a finite threshold >= 0."""
        default = self.default if default is REQUIRED else default
        # a fresh list or table per spec, never the row's own
        default = type(default)(default) if isinstance(default, (list, dict)) else default
        choices = self.choices or None
        if default is REQUIRED:
            return table.req(self.name, self.kind, choices)
        if self.kind == (int, float):
            return table.number(self.name, default)
        return table.opt(self.name, self.kind, default, choices)


KEYS = (
    Key("", "description", str, "", "one line for `doit list` and the report"),
    Key("", "module", str, REQUIRED, "models/<module>.py, the model's code"),
    Key("", "uses", list, [], "other model-code files the module imports"),
    # the model's own name when not written (a callable default: the loader gives it)
    Key("", "bundle_name", str, None, "the name in bundle file names when not the model's"),
    Key("", "data", str, None, "folder of real labelled inputs, relative to models/"),
    Key("", "chips", list, REQUIRED, "chip ids from toolchain/spec/chips.toml"),
    Key("", "requires", list, [], "the module's own packages (pip requirements)"),
    # its choices are the registered compilers and "auto", checked by project.py
    Key("", "compiler", str, "ort-qnn", "the compiler that builds the model"),
    Key("license", "name", str, REQUIRED, "the model's licence"),
    Key("license", "url", str, "", "where the licence is"),
    Key("license", "note", str, "", "what is known of it and what is not"),
    Key("export", "exporter", str, "dynamo", "torch's exporter", ("dynamo", "legacy")),
    Key("export", "opset", int, 18, "the ONNX opset"),
    Key("export", "args", dict, {}, "the model code's own export options"),
    Key("compile", "optimization", int, 3, "HTP graph finalization level", (1, 2, 3)),
    Key("compile", "android_libs", str, "auto", "the app's QNN runtime libraries", ANDROID_LIBS),
    Key("compile", "max_fp16_params", int, 1_000_000_000, "largest fp16 graph (parameters)"),
    Key("compile", "runtime_qairt", str, None, "the QNN runtime the app ships"),
    Key("compile", "qairt", list, None, "the QAIRT families to build"),
    Key("parity", "max_abs", (int, float), 1e-3, "largest absolute error, reference vs ONNX"),
    Key(
        "parity",
        "reference",
        str,
        "torch",
        "what the ONNX on the CPU is held to",
        ("torch", "module", "none"),
    ),
    Key("verify", "clips", list, [], "sample ids the default tier runs on every chip"),
    Key("verify", "max_rel", (int, float), 0.02, "largest relative error of an fp16 graph"),
    Key("verify", "max_rel_w8a16", (int, float), 0.1, "largest relative error of a w8a16 graph"),
    Key("verify", "min_cosine", (int, float), 0.0, "least cosine similarity of each output"),
    Key("verify", "full_chips", list, [], "chips that also run the full tier"),
)
KEY = {k.path: k for k in KEYS}
