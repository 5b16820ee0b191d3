"""Bad specs: one clear message naming the file and the field; nothing already built is touched."""
import shutil
from pathlib import Path

import pytest

from toolchain.spec import chips
from toolchain import spec
from toolchain.spec import SpecError


@pytest.fixture
def tiny_spec(project):
    return project.add_tiny("tiny")


def load(path):
    return spec.load(path, chips.load())


def test_the_fixture_spec_loads(tiny_spec):
    model = load(tiny_spec)
    assert model.name == "tiny" and model.chips == ("SM8550", "SM8750")
    assert model.graph("net").inputs[0].shape == (1, 4, 16)


@pytest.mark.parametrize("old,new,expected", [
    ('module = "tinynet"', 'module = "tinynet', "TOML syntax error"),
    ("[parity]", "[parity]\nmax_abss = 1", "parity.max_abss: unknown key; did you mean 'max_abs'?"),
    ('module = "tinynet"\n', "", "module: missing required field"),
    ('chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM9999"]', "chips: unknown chip 'SM9999'"),
    ("shape = [1, 4, 16]", 'shape = [1, 4, "T"]', "graphs.net.inputs.x.shape: expected a list of positive integers"),
    ("shape = [1, 4, 16]", "shape = [2, 4, 16]", "graphs.net.inputs.x.shape: batch (axis 0) must be 1"),
    ('inputs.x = { shape = [1, 4, 16], dtype = "float32" }', 'inputs.x = { shape = [1, 4, 16], dtype = "int64" }',
     "graphs.net.inputs.x.dtype: int64 is not allowed at graph I/O"),
    ('path = "tiny.pt"', 'path = "missing.pt"', "checkpoint.path: checkpoint not found"),
    ('sha256 = "', 'sha256 = "zz', "checkpoint.sha256: expected 64 lower-case hex digits"),
    ('chips = ["SM8550", "SM8750"]', 'chips = ["SM8550", "SM8350"]',
     'chips: SM8350 (HTP v68) has no fp16, but graph \'net\' has precision = "fp16"'),
    ('precision = "fp16"', 'precision = "int4"', "graphs.net.precision: expected one of"),
])
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
    assert "ERROR: models/tiny.toml: chips: unknown chip 'SM8765'; did you mean 'SM8750'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert project.build_state() == before


STREAMING = Path(__file__).parent / "fixtures" / "streaming"
STATE_LINE = 'state = { new_cached_key_0 = "cached_key_0", '


@pytest.mark.parametrize("old,new,expected", [
    (STATE_LINE, 'state = { new_cached_key_0 = "cached_conv_0", ', "graphs.encoder.state.new_cached_key_0: output "
     "new_cached_key_0 [1, 16, 64] float32 cannot feed input cached_conv_0 [1, 64, 4] float32"),
    ('new_cached_val_0 = "cached_val_0"', 'new_cached_val_0 = "cached_key_0"',
     "graphs.encoder.state.new_cached_val_0: input 'cached_key_0' is fed by two outputs"),
    (STATE_LINE, 'state = { encoder_oops = "cached_key_0", ', "graphs.encoder.state.encoder_oops: no output"),
    (', new_processed_lens = "processed_lens" }', ' }', "graphs.encoder.stream.input: input(s) processed_lens are "
     "neither the stream nor fed by a state output"),
    ("chunk = 35, hop = 32", "chunk = 34, hop = 32", "graphs.encoder.stream.chunk: context 0 + chunk 34 must be "
     "the size of x on axis 2 (35)"),
    ("axis = 2", "axis = 3", "graphs.encoder.stream.axis: 3 is out of range for x [1, 80, 35]"),
    ('stream = { input = "x", axis = 2, chunk = 35, hop = 32, context = 0 }', "",
     "graphs.encoder.state: a graph with state pairs declares how a stream is cut into calls"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", "checks.encoder_outt = { max_abs = 0.05 }",
     "graphs.encoder.checks.encoder_outt: no output 'encoder_outt'"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", 'checks.encoder_out = { judged_by = "metric" }',
     "graphs.encoder.checks.encoder_out.reason: missing required field"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
     'checks.encoder_out = { judged_by = "metric", reason = "tokens", max_abs = 1 }',
     "graphs.encoder.checks.encoder_out.max_abs: judged_by = \"metric\" and a bound exclude each other"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", "checks.encoder_out = { max_abs = -1 }",
     "graphs.encoder.checks.encoder_out.max_abs: expected a finite number >= 0"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", "checks.encoder_out = { max_abss = 1 }",
     "graphs.encoder.checks.encoder_out.max_abss: unknown key; did you mean 'max_abs'?"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", "checks.encoder_out = {}",
     "graphs.encoder.checks.encoder_out: give max_abs, max_rel and/or min_cosine"),
    ("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }", "checks.encoder_out = { min_cosine = 1.5 }",
     "graphs.encoder.checks.encoder_out.min_cosine: a cosine similarity is at most 1"),
])
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
    toml.write_text(toml.read_text().replace("checks.encoder_out = { max_abs = 0.05, max_rel = 0.02 }",
                                             'checks.encoder_out = { judged_by = "metric", reason = "greedy tokens" }'))
    g = load(toml).graph("encoder")
    assert dict(g.checks["encoder_out"]) == {"judged_by": "metric", "reason": "greedy tokens"}
    assert dict(g.checks["new_processed_lens"]) == {"max_abs": 0.0}
